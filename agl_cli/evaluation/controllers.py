"""Choosing the rollout controller from the spec (`runner:`), and closing it when a run ends.

Shared by eval, optimize and train so that every command runs rollouts the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from agl_cli.errors import AglError, ConfigError
from agl_cli.spec.schema import ExperimentSpec
from rl_backend.rollout.base import RolloutController

T = TypeVar("T")
K8S_HINT = "see README: Running rollouts on Kubernetes"


def make_controller(spec: ExperimentSpec, run_id: str) -> RolloutController:
    """`runner: kubernetes` gives one Job per rollout; otherwise local processes."""
    if spec.runner != "kubernetes":
        from rl_backend.rollout.local import LocalController

        return LocalController()
    from rl_backend.rollout.kubernetes import KubernetesConfigError, KubernetesController

    assert spec.kubernetes is not None
    pass_env = set(spec.agent.env) | {k.name for k in spec.knobs.values() if k.via == "env" and k.name}
    deny_env = {u.api_key_env for u in spec.upstreams.values() if u.api_key_env}
    try:
        return KubernetesController(
            spec.kubernetes, run_id=run_id, base_dir=spec.base_dir, pass_env=pass_env, deny_env=deny_env
        )
    except KubernetesConfigError as exc:
        raise ConfigError(str(exc), hint=K8S_HINT) from None


async def run_then_close(controller: RolloutController, work: Callable[[], Awaitable[T]]) -> T:
    """Run `work`, then let the controller clean up (the Kubernetes one deletes the run's Jobs), even on Ctrl-C."""
    from rl_backend.rollout.k8s_client import (  # light: the client loads lazily
        KubernetesConfigError,
        KubernetesUnavailableError,
    )

    try:
        return await work()
    except KubernetesUnavailableError as exc:  # not a config problem: the cluster stayed unreachable (exit 1)
        raise AglError(str(exc), hint="once the cluster answers again, continue the run with --resume RUN (finished "
                                      "rollouts are kept)") from None
    except KubernetesConfigError as exc:
        raise ConfigError(str(exc), hint=K8S_HINT) from None
    finally:
        close = getattr(controller, "close", None)
        if close is not None:
            await close()
