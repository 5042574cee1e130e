"""The GPU check (bench/gpu/verl_gpu_check.py) stays ready without a GPU: it imports and answers --help, and its
stages that need no `agl` run work on a CPU: bfloat16 against float32 logprobs on a tiny model, and torch.compile of
verl's entropy function agreeing with the eager one. What it cannot cover is listed."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

CHECK = REPO / "bench" / "gpu" / "verl_gpu_check.py"
needs_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")


def test_the_check_answers_help_and_names_its_new_stages() -> None:
    done = subprocess.run([sys.executable, str(CHECK), "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert "--budget-s" in done.stdout
    text = CHECK.read_text()
    assert "bf16" in text and "compile" in text and "not_covered" in text


def test_what_the_check_cannot_cover_is_listed() -> None:
    from bench.gpu.numerics import NOT_COVERED

    joined = " ".join(NOT_COVERED)
    assert "vLLM" in joined and "sleep mode" in joined and "CUDA-IPC" in joined and "tensor parallelism" in joined


def test_bf16_logprobs_stay_near_fp32_on_the_tiny_model(tmp_path: Path) -> None:
    from bench.gpu.numerics import BF16_MEAN_ABS_LIMIT, stage_bf16
    from tests.helpers.models import make_tiny_chat_model

    result = stage_bf16(make_tiny_chat_model(tmp_path / "tiny"), "cpu")
    assert result["ok"], result
    assert result["tokens"] == 2 * 63
    assert 0 < result["mean_abs_logprob_diff"] < BF16_MEAN_ABS_LIMIT  # bf16 differs, but by little
    assert math.isfinite(result["max_kl_fp32_bf16"]) and result["max_kl_fp32_bf16"] >= 0


@needs_verl
@pytest.mark.slow
def test_compiled_entropy_starts_and_matches_eager_on_the_cpu() -> None:
    from bench.gpu.numerics import stage_compile

    result = stage_compile("cpu")
    assert result["ok"], result
    assert result["first_call_s"] > 0 and len(result["later_calls_s"]) == 2
