"""`agl train SPEC --backend verl --device cpu`, end to end: the real driver on a real local Ray, verl's trainer with
its FSDP engine on the CPU (gloo, world size 1), and agl's embedded engine as the rollout server verl manages —
only the device and the policy server differ from the GPU path. A tiny random model keeps it short.

- a run killed (SIGKILL) after its first checkpoint continues with `--resume` from that checkpoint: the second
  update's rollouts were sampled from the step-1 weights verl loaded, and every update is made exactly once;
- `trained-model/` is a Hugging Face folder the embedded server loads; the before/after comparison prints;
- a LoRA run with a KL penalty (verl's reference policy: the actor without its adapter) exports a PEFT adapter that
  peft loads, equal to the merged model it exports beside it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import agl_env, run_agl

pytestmark = [
    pytest.mark.slow,
    pytest.mark.model,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("verl", "ray", "fastapi", "cachetools")),
                       reason="needs the verl extra"),
]

TRAIN = ["--backend", "verl", "--device", "cpu", "--tasks-per-step", "2", "--group-size", "2", "--heldout-limit", "4"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers.models import make_tiny_chat_model, write_training_project

    folder = tmp_path_factory.mktemp("verl-cpu")
    make_tiny_chat_model(folder / "tiny")
    return write_training_project(folder, "tiny")


def _env(home: Path) -> dict[str, str]:
    return {"AGL_HOME": str(home), "AGL_POLICY_THREADS": "1", "OMP_NUM_THREADS": "1"}


def _lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _logprobs(model_dir: Path, prompt: list[int], completion: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def test_a_killed_run_resumes_from_its_checkpoint_and_exports_a_servable_model(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = ["train", str(project), *TRAIN, "--steps", "2", "--lr", "1e-3"]
    with (tmp_path / "first.err").open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "agl_cli", *args], cwd=tmp_path, env=agl_env(_env(home)),
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        assert proc.stdout is not None
        first = proc.stdout.readline()  # a step line is printed once its checkpoint and its row are written
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
    assert json.loads(first)["step"] == 1, (tmp_path / "first.err").read_text()[-3000:]

    resumed = run_agl([*args, "--resume"], tmp_path, env=_env(home), timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    rows = _lines(resumed.stdout)
    assert [r["step"] for r in rows if "step" in r] == [2]  # step 1 is not made again
    assert "resuming from step-1" in resumed.stderr and "resumed verl's actor" in resumed.stderr
    result = rows[-1]["result"]
    assert [s["step"] for s in result["steps"]] == [1, 2] and all(s["updated"] for s in result["steps"])
    assert result["comparison"] and "trained vs base" in result["comparison"]["sentence"]
    step2 = result["steps"][1]["metrics"]
    # verl recomputed the old logprobs and corrected for the sampler: both agree with what the gateway recorded.
    assert abs(step2["train"]["rollout_corr_kl"]) < 1e-3 and step2["train"]["unrecorded_logprob_tokens"] == 0
    assert math.isfinite(step2["train"]["entropy"]) and step2["train"]["grad_norm"] > 0

    run_dir = Path(result["run_dir"])
    checkpoint = run_dir / "checkpoints" / "step-1" / "actor" / "huggingface"
    from rl_backend.store.db import RunStore

    store = RunStore(run_dir / "store.sqlite")
    try:
        call = store.calls(step2["rollout_ids"][0])[0]
    finally:
        store.close()
    assert call.model_version == "step-1"  # served by the weights the resumed trainer loaded
    assert call.prompt_token_ids and call.completion_token_ids and call.logprobs
    recorded = call.logprobs
    from_checkpoint = _logprobs(checkpoint, call.prompt_token_ids, call.completion_token_ids)
    from_base = _logprobs(project.parent / "tiny", call.prompt_token_ids, call.completion_token_ids)
    assert max(abs(a - b) for a, b in zip(recorded, from_checkpoint, strict=True)) < 1e-3
    assert max(abs(a - b) for a, b in zip(recorded, from_base, strict=True)) > 1e-2

    from rl_backend.serving.server import start_embedded_server

    trained = Path(result["trained_model"])
    assert trained == run_dir / "trained-model" and (trained / "config.json").is_file()
    with start_embedded_server(model=str(trained), threads=1) as server:
        import httpx

        reply = httpx.post(server.openai_base_url + "/chat/completions", timeout=60,
                           json={"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] is not None


def test_a_lora_run_with_a_kl_penalty_exports_a_peft_adapter(project: Path, tmp_path: Path) -> None:
    result = run_agl(["train", str(project), *TRAIN, "--steps", "1", "--lora", "--lora-rank", "8", "--lr", "1e-2",
                      "--loss-agg", "token-mean", "--kl-coef", "0.1"], tmp_path, env=_env(tmp_path / "home"),
                     timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = _lines(result.stdout)
    outcome = rows[-1]["result"]
    train = outcome["steps"][0]["metrics"]["train"]
    assert "kl" in train and math.isfinite(train["kl"])  # verl's reference policy: the actor without the adapter
    # The LoRA adapter was hot-loaded into the embedded server: what it served matches the actor to float precision.
    assert abs(train["rollout_corr_kl"]) < 1e-3

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter, merged = Path(outcome["trained_adapter"]), Path(outcome["trained_model"])
    assert (adapter / "adapter_config.json").is_file() and json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
    base = AutoModelForCausalLM.from_pretrained(project.parent / "tiny", dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, adapter).eval()
    exported = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253]])
    with torch.no_grad():
        assert torch.allclose(with_adapter(input_ids=ids).logits, exported(input_ids=ids).logits, atol=1e-4)
        plain = AutoModelForCausalLM.from_pretrained(project.parent / "tiny", dtype=torch.float32).eval()
        assert not torch.allclose(plain(input_ids=ids).logits, exported(input_ids=ids).logits, atol=1e-4)


def test_a_full_weight_run_with_a_kl_penalty_builds_an_fp32_reference_like_the_actor(project: Path,
                                                                                      tmp_path: Path) -> None:
    """Without LoRA verl builds a second model, the reference, from `ref.fsdp_config`: on a CPU it must compute as
    the actor does (float32, no torch.compile), so that before any update the two agree and the KL term is 0."""
    result = run_agl(["train", str(project), *TRAIN, "--steps", "1", "--lr", "1e-3", "--loss-agg", "token-mean",
                      "--kl-coef", "0.1"], tmp_path, env=_env(tmp_path / "home"), timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    train = _lines(result.stdout)[-1]["result"]["steps"][0]["metrics"]["train"]
    # One update, one PPO epoch: the loss is computed on the starting weights, which the reference holds too.
    assert "kl" in train and abs(train["kl"]) < 1e-5, train
    assert abs(train["rollout_corr_kl"]) < 1e-3
