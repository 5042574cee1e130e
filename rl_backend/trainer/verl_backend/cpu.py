"""verl on a CPU: a `cpu` platform for verl's platform registry and its FSDP engine registered for that device.

verl 0.9.1 ships platforms for CUDA, ROCm and Ascend NPUs only, and registers its FSDP engine for "cuda" and "npu".
Everything else it needs is device-neutral: FSDP2 (`fully_shard`) runs on CPU tensors over gloo, SDPA attention runs
on the CPU, and its workers reach the device through the platform object. So agl registers a `cpu` platform
(selected with VERL_PLATFORM=cpu) and the same FSDP engine class for it: the whole verl driver (Ray workers, the
FSDP engine, old-logprob recompute, checkpoints, weight sync) then runs in CI, with only the device swapped and the
policy server either agl's embedded engine (embedded_policy.py) or vLLM's CPU build (vllm_cpu.py).

Three things differ from a GPU and are handled where they arise: verl builds its process group with the backend
string "cpu:gloo,<device>:<backend>", which torch rejects when both halves name the CPU (worker.py initializes a
plain gloo group first), the FSDP1 wrapper needs an accelerator (the CPU config uses strategy fsdp2), and so does
the pinned memory of the reference model's offload policy (unpinned here).
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

PLATFORM = "cpu"


@functools.cache
def _device_module() -> types.ModuleType:
    """`torch.cpu` plus the memory and device queries verl asks every device module (all answered for a CPU)."""
    import torch

    module = types.ModuleType("agl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(module, name, getattr(torch.cpu, name))
    for name in ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"):
        setattr(module, name, lambda *args, **kwargs: 0)
    module.mem_get_info = lambda *args: (0, 0)  # type: ignore[attr-defined]
    module.reset_peak_memory_stats = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    module.empty_cache = lambda: None  # type: ignore[attr-defined]
    module.get_rng_state = torch.get_rng_state  # type: ignore[attr-defined]
    module.set_rng_state = torch.set_rng_state  # type: ignore[attr-defined]
    module.manual_seed = torch.manual_seed  # type: ignore[attr-defined]
    module.manual_seed_all = torch.manual_seed  # type: ignore[attr-defined]
    module.is_available = lambda: True  # type: ignore[attr-defined]
    module.device_count = lambda: 1  # type: ignore[attr-defined]
    module.current_device = lambda: PLATFORM  # type: ignore[attr-defined]
    module.set_device = lambda *args: None  # type: ignore[attr-defined]
    module.synchronize = lambda *args: None  # type: ignore[attr-defined]
    module.get_device_name = lambda *args: "CPU"  # type: ignore[attr-defined]
    return module


@functools.cache
def register() -> str:
    """Register the `cpu` platform and the FSDP engine for it (once per process; verl resolves the platform lazily,
    on its first device query, from $VERL_PLATFORM)."""
    import torch
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    @PlatformRegistry.register(platform=PLATFORM)
    class PlatformCPU(PlatformBase):
        """The host CPU as verl's device: gloo for collectives, Ray's CPU resource for placement."""

        @property
        def device_name(self) -> str:
            return PLATFORM

        @property
        def vendor_name(self) -> str:
            return PLATFORM

        @property
        def device_module(self) -> types.ModuleType:
            return _device_module()

        def is_available(self) -> bool:
            return True

        def current_device(self) -> Any:
            # verl moves models with `.to(get_device_id())`: the device's name is what torch accepts for a CPU.
            return PLATFORM

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "AGL_VISIBLE_CPUS"  # nothing to hide on a CPU; verl only reads and forwards it

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            return {"num_cpus": num_gpus}

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def cudart(self) -> Any:
            return None

    # Imported only now: verl's engine module asks the platform for its device when it is imported.
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    _unpin_offload()
    engines = EngineRegistry._engines.get("language_model", {})
    if PLATFORM not in engines.get("fsdp2", {}):
        EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=PLATFORM)(
            FSDPEngineWithLMHead)
    return PLATFORM


def _unpin_offload() -> None:
    """verl's FSDP2 engine keeps a forward-only model (the reference policy of a KL penalty without LoRA) under
    `CPUOffloadPolicy(pin_memory=True)`; pinning needs an accelerator ("Cannot access accelerator device"), and on a
    CPU the parameters already live where offloading puts them: same policy, unpinned."""
    from verl.workers.engine.fsdp import transformer_impl

    policy = transformer_impl.CPUOffloadPolicy
    if policy is None or getattr(policy, "agl_unpinned", False):
        return

    def unpinned(*args: Any, **kwargs: Any) -> Any:
        return policy(*args, **{**kwargs, "pin_memory": False})

    unpinned.agl_unpinned = True  # type: ignore[attr-defined]
    transformer_impl.__dict__["CPUOffloadPolicy"] = unpinned  # the name the engine calls at build time
