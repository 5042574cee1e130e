"""What agl registers in verl's registries, in every process that runs verl code.

verl looks things up by name in per-process registries: the policy loss (`agl_rollout`), the rollout backend's
worker-side class and driver-side replica (`agl_embedded`), and on a CPU the `cpu` platform, its FSDP engine and,
where vLLM's CPU build is installed, verl's `vllm` replica for a CPU (vllm_cpu.py).
`register_all` fills them; the driver calls it, and Ray runs it in every worker process it starts (the job's
`worker_process_setup_hook`), because verl's workers are separate processes with registries of their own.
"""

from __future__ import annotations

import functools
import os

# Ray imports this by its dotted name in every worker process before any task runs.
SETUP_HOOK = f"{__name__}.register_all"


@functools.cache
def register_all() -> None:
    from rl_backend.trainer.verl_backend.cpu import PLATFORM
    from rl_backend.trainer.verl_backend.cpu import register as register_cpu
    from rl_backend.trainer.verl_backend.embedded_policy import EMBEDDED_ROLLOUT_FQN, ROLLOUT_NAME, _replica_class
    from rl_backend.trainer.verl_backend.loss import register as register_loss

    register_loss()
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM:
        register_cpu()
        from rl_backend.trainer.verl_backend.vllm_cpu import register as register_vllm_cpu

        register_vllm_cpu()
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = EMBEDDED_ROLLOUT_FQN
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _replica_class)
