"""verl's hybrid actor/rollout/reference worker, as agl starts it.

It is verl's `ActorRolloutRefWorker` unchanged, except on the `cpu` platform: verl initializes the process group
with the backend string "cpu:gloo,<device>:<backend>", which torch rejects when both halves are the CPU, so this
worker joins a plain gloo group first (verl then finds the group initialized and uses it).
"""

from __future__ import annotations

import os
from typing import Any

from verl.workers.engine_workers import ActorRolloutRefWorker


class AglActorRolloutRefWorker(ActorRolloutRefWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from verl.utils.device import get_device_name

        from rl_backend.trainer.verl_backend.cpu import PLATFORM

        if get_device_name() == PLATFORM:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("gloo", rank=int(os.environ.get("RANK", "0")),
                                        world_size=int(os.environ.get("WORLD_SIZE", "1")))
        super().__init__(*args, **kwargs)
