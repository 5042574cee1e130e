"""What launching the verl backend needs on this machine, and what to say when it is not there.

Checked before anything heavy starts: CUDA GPUs (torch.cuda; under a RayJob, where $RAY_ADDRESS is set, the GPUs
are the Ray workers'), vLLM (the policy server), Ray (verl's workers) and verl itself. Missing any of them,
`agl train --backend verl` exits 2 with this module's message.
"""

from __future__ import annotations

import importlib.util
import os

GPU_INSTALL = "pip install '.[gpu,verl,k8s]' 'ray[default]'"


def missing_requirements() -> list[str]:
    """What of CUDA, vLLM, Ray and verl this machine lacks, in words ([] when it can launch)."""
    missing = []
    for module, why in (("verl", "verl (pip extra `verl`)"), ("vllm", "vLLM (pip extra `gpu`; CUDA only)"),
                        ("ray", "Ray (ray[default])")):
        if importlib.util.find_spec(module) is None:
            missing.append(why)
    if importlib.util.find_spec("torch") is None:
        missing.append("torch")
    elif os.environ.get("RAY_ADDRESS"):
        pass  # a RayJob's driver runs on the CPU head: the GPUs are the Ray workers', which Ray schedules onto
    else:
        import torch

        if not torch.cuda.is_available():
            missing.append("a CUDA GPU (torch.cuda.is_available() is False)")
    return missing


def launch_hint(config: str) -> str:
    return (f"on a machine with NVIDIA GPUs, from agl's source folder: {GPU_INSTALL} && "
            f"agl train {config} --backend verl   (or provision one: agl train {config} --on kubernetes)")
