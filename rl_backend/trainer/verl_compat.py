"""The one place verl is imported, so that importing it leaves the process as it was.

verl's package `__init__` calls `logging.basicConfig(...)`, which would put a handler on the root logger of whatever
process trains (the `agl` CLI included) and change how every later log line looks; the root logger's handlers and
level are restored afterwards. verl picks "cuda" as its default device: nothing here asks verl for a device, every
tensor is created on the trainer's own device.
"""

from __future__ import annotations

import functools
import logging
from types import SimpleNamespace


@functools.cache
def verl() -> SimpleNamespace:
    """verl's `core_algos`, `torch_functional` (as `F`) and `ActorConfig`, imported once."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import verl.utils.torch_functional as verl_F
        from verl.trainer.ppo import core_algos
        from verl.workers.config import ActorConfig
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
    return SimpleNamespace(core_algos=core_algos, F=verl_F, ActorConfig=ActorConfig)
