"""`agl eval` with `runner: kubernetes`, as a user runs it: a separate agl process, a kubeconfig pointing at kmock,
and the stand-in kubelet running the Jobs (tests/helpers/kubelet.py). Skipped until agl.yaml's `kubernetes:`
section is the typed KubernetesSpec and `agl eval` selects the controller by `runner`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agl_cli.spec.schema import ExperimentSpec
from rl_backend.rollout.k8s_spec import KubernetesSpec
from tests.helpers.kubelet import cluster_in_thread

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(ExperimentSpec.model_fields["kubernetes"].annotation != KubernetesSpec | None,
                       reason="agl.yaml's kubernetes: section is not wired to KubernetesSpec yet"),
    pytest.mark.skipif(not all(shutil.which(t) for t in ("sh", "base64", "tee", "tail", "head", "wc")),
                       reason="the wrapper needs a POSIX shell and coreutils"),
]


def _project(folder: Path, api_url: str) -> None:
    shutil.copy(FIXTURES / "behave_agent.py", folder / "agent.py")
    shutil.copy(FIXTURES / "behave_grader.py", folder / "grade.py")
    tasks = [{"id": "a", "answer": "4"}, {"id": "b", "answer": "7", "behavior": "crash"},
             {"id": "c", "answer": "1", "behavior": "hang"}]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "kmock",
                  "clusters": [{"name": "kmock", "cluster": {"server": api_url}}],
                  "users": [{"name": "me", "user": {"token": "unused"}}],
                  "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "me"}}]}
    (folder / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    spec: dict[str, Any] = {
        "name": "k8s", "agent": {"command": "{python} agent.py {task_file} {output_file}", "timeout_s": 2},
        "tasks": {"path": "tasks.jsonl"}, "grader": {"command": "{python} grade.py {task_file} {output_file}"},
        "runner": "kubernetes",
        "kubernetes": {"image": "agent:1", "kubeconfig": "kubeconfig", "workdir": str(folder),
                       "startup_allowance_s": 0, "unschedulable_after_s": 0, "create_qps": 50},
    }
    (folder / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def test_agl_eval_runs_rollouts_as_kubernetes_jobs(tmp_path: Path) -> None:
    image_env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"}
    with cluster_in_thread(image_env) as api_url:
        _project(tmp_path, api_url)
        env = {**os.environ, "NO_COLOR": "1"}
        env.pop("AGL_HOME", None)
        done = subprocess.run([sys.executable, "-m", "agl_cli", "eval", "agl.yaml", "--json"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=80)
        assert done.returncode == 0, done.stderr
        import urllib.request

        with urllib.request.urlopen(f"{api_url}/apis/batch/v1/namespaces/default/jobs") as response:
            assert json.load(response)["items"] == []  # the run's Jobs were deleted at the end
    (variant,) = json.loads(done.stdout)["variants"]
    assert variant["finished"] == 3 and variant["n"] == 1 and variant["accuracy"]["mean"] == 1.0
    assert variant["missing_reasons"] == {"agent_crashed": 1, "agent_timeout": 1}


def test_an_unreachable_cluster_ends_agl_eval_with_exit_1_and_says_so(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on: every connection is refused
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    _project(tmp_path, url)
    spec = yaml.safe_load((tmp_path / "agl.yaml").read_text())
    spec["kubernetes"].update({"api_retry_s": 1, "request_timeout_s": 0.5, "api_backoff_max_s": 0.2})
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("AGL_HOME", None)
    done = subprocess.run([sys.executable, "-m", "agl_cli", "eval", "agl.yaml", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=80)
    assert done.returncode == 1, done.stderr  # a failure, not a usage or config error
    assert f"the Kubernetes API at {url} has not answered for" in done.stderr and "--resume" in done.stderr
    assert "Traceback" not in done.stderr
