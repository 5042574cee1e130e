"""What tests share besides fixtures: running `agl` (agl.py), tiny models and training projects (models.py), the
Kubernetes stand-ins (kubelet.py, fault_proxy.py, netpol.py, k8s_rollouts.py), fixture runs for reports
(make_runs.py) and a hosted provider with two models for ticket triage (triage_provider.py). A package of its own
name: verl installs a top-level `tests` package, so nothing here relies on `tests` or `fixtures` being first on
sys.path."""

from tests.helpers.agl import (
    AGL,
    FIXTURES,
    GATEWAY_SERVE,
    REPO,
    agl_env,
    invoke_agl,
    process_alive,
    run_agl,
    wait_for,
    write_spec,
    write_tasks,
)

__all__ = ["AGL", "FIXTURES", "GATEWAY_SERVE", "REPO", "agl_env", "invoke_agl", "process_alive", "run_agl",
           "wait_for", "write_spec", "write_tasks"]
