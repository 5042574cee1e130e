"""Two stages of the GPU check that need no `agl` run: how far bfloat16 moves the policy's logprobs from float32 (what
vLLM and verl's FSDP engine compute in on a GPU), and the start-up of `torch.compile` on verl's entropy function
(verl's FSDP engine compiles it when `use_torch_compile` is on, its default on GPUs). Also the list of what the GPU
check does not cover, which it prints and records.

Both stages run on a CPU too (tests/test_gpu_check.py), on the check's tiny random model.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

# bfloat16 keeps 8 bits of mantissa: per-token logprobs of a small model move by ~1e-2 on average. Past this, a bf16
# rollout's logprobs would no longer describe the fp32 actor's policy (rollout_corr_kl would say so in training).
BF16_MEAN_ABS_LIMIT = 0.05

NOT_COVERED = (
    "vLLM as verl's rollout server on the GPU (its wheel is far over what the GPU machine takes): the embedded engine "
    "serves the policy instead; vLLM runs on a CPU in the `vllm` test tier",
    "vLLM's sleep mode and wake-up, and verl's CUDA-IPC weight transfer into vLLM (CUDA-only; the CPU tier uses "
    "verl's shared-memory fallback and no sleep)",
    "tool calls parsed by vLLM (--enable-auto-tool-choice) on the GPU",
    "tensor parallelism > 1, several GPUs and several nodes (one H200 here)",
    "flash-attn (not installed: PyTorch's SDPA attention runs)",
    "the trainer image itself (vLLM's base image, CUDA torch 2.11 with its nvidia-* libraries): "
    "tests/test_images.py installs the Dockerfile's other lines on a CPU",
    "the real model's numerics at scale: the check's model is a small random Llama with SmolLM2's vocabulary",
)


def _token_logprobs(model: Any, ids: Any) -> Any:
    import torch

    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1), ids[:, 1:]


def stage_bf16(model_dir: Path, device: str) -> dict[str, Any]:
    """The same token sequence scored by the model in float32 and in bfloat16: per-token logprob differences and the
    KL between the two next-token distributions."""
    import torch
    from transformers import AutoModelForCausalLM

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 49152, (2, 64), generator=generator).to(device)
    scored: dict[str, Any] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        scored[name] = _token_logprobs(model, ids)
        del model
    (full32, target), (full16, _) = scored["fp32"], scored["bf16"]
    picked32 = full32.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    picked16 = full16.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    diff = (picked32 - picked16).abs()
    kl = (full32.exp() * (full32 - full16)).sum(-1)  # KL(fp32 || bf16) per position
    result = {"tokens": int(diff.numel()), "mean_abs_logprob_diff": float(diff.mean()),
              "max_abs_logprob_diff": float(diff.max()), "mean_kl_fp32_bf16": float(kl.mean()),
              "max_kl_fp32_bf16": float(kl.max()), "limit_mean_abs": BF16_MEAN_ABS_LIMIT}
    finite = all(math.isfinite(v) for v in result.values() if isinstance(v, float))
    ok = finite and result["mean_abs_logprob_diff"] < BF16_MEAN_ABS_LIMIT
    why = None if ok else ("non-finite logprobs in bfloat16" if not finite else
                           f"bfloat16 moves logprobs by {result['mean_abs_logprob_diff']:.3g} on average")
    return {"ok": ok, "why": why, **result}


def stage_compile(device: str) -> dict[str, Any]:
    """verl's entropy function under torch.compile(dynamic=True), as its FSDP engine wraps it: the first call's time
    (compilation), a second shape (no recompile expected), and agreement with the eager function."""
    import torch
    from verl.utils import torch_functional as verl_f

    compiled = torch.compile(verl_f.entropy_from_logits, dynamic=True)
    timings: list[float] = []
    worst = 0.0
    for shape in ((2, 17, 49152), (3, 29, 49152), (1, 5, 49152)):
        logits = torch.randn(*shape, device=device, dtype=torch.float32, generator=None)
        started = time.perf_counter()
        got = compiled(logits)
        if device == "cuda":
            torch.cuda.synchronize()
        timings.append(round(time.perf_counter() - started, 3))
        worst = max(worst, float((got - verl_f.entropy_from_logits(logits)).abs().max()))
    ok = worst < 1e-3
    return {"ok": ok, "why": None if ok else f"compiled entropy differs from eager by {worst:.3g}",
            "first_call_s": timings[0], "later_calls_s": timings[1:], "max_abs_diff_vs_eager": worst,
            "torch": torch.__version__}
