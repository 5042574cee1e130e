"""One short GPU check of the training paths that the CPU test suite cannot run.

Stages (each independent; each prints one JSON line `{"stage": ..., "ok": ..., ...}` and the whole report is
written to $OUT/verl_step_check.json, or --out, after every stage so a timeout still leaves the finished ones):

  torch   TorchTrainer on --device (float32, and bfloat16 on CUDA): 3 sync updates of the toy task through
          rl_backend.trainer.loop.TrainingLoop; losses finite, weights moved, seconds per update.
  engine  the serving Engine on --device with the tiny model and a stand-in tokenizer (ids only): batched greedy
          generation equals one-at-a-time greedy (float32; bfloat16 reported, not judged).
  verl    VerlTrainer (rl_backend/trainer/verl_backend/driver.py) on a local Ray cluster with one GPU, FSDP and the
          `agl_rollout` loss: the tiny model saved as a Hugging Face folder, the config rendered and validated by
          config.py as launch.py does, one update on a batch of real toy trajectories (DataProto by data.py);
          loss, whether the saved weights moved, wall times. No vLLM: PolicyServer is never started. Needs CUDA:
          without it the stage fails at once with "no CUDA". (Preparing this check found two driver bugs, fixed
          since: `agl_rollout` was registered in the driver's process only, not in the Ray workers, and verl's
          engine reads a `temperature` the driver did not send; tests/test_verl_backend.py covers both.)

Run:  python bench/gpu/verl_step_check.py --device cuda      (on a GPU machine with the `verl` extra installed)
      python bench/gpu/verl_step_check.py --device cpu       (locally: torch and engine on CPU, verl fails fast)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

REPORT: dict[str, Any] = {}


def stage_torch(dev: str) -> dict[str, Any]:
    from rl_backend.store.db import RunStore
    from rl_backend.trainer.loop import LoopConfig, TrainingLoop
    from rl_backend.trainer.torch_backend import TorchTrainer, TrainerConfig
    from rl_backend.trainer.toy import make_tasks, stored_batches, tiny_llama

    out: dict[str, Any] = {"ok": True}
    dtypes = ["float32"] + (["bfloat16"] if dev == "cuda" and torch.cuda.is_bf16_supported() else [])
    for dtype in dtypes:
        with tempfile.TemporaryDirectory() as tmp:
            store = RunStore(Path(tmp) / "store.sqlite")
            trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=5e-3, device=dev, dtype=dtype))
            before = {k: v.detach().float().cpu().clone() for k, v in trainer.model.state_dict().items()}
            loop = TrainingLoop(store, trainer, stored_batches(store, trainer, make_tasks(), 4),
                                config=LoopConfig(iterations=3))
            started = time.perf_counter()
            records = loop.run()
            wall = time.perf_counter() - started
            store.close()
            after = trainer.model.state_dict()
            moved = sum(not torch.equal(before[k], v.detach().float().cpu()) for k, v in after.items())
            losses = [r.loss for r in records]
            res = {"updated": [r.updated for r in records], "losses": losses, "moved_tensors": moved,
                   "tensors": len(after), "device": str(next(trainer.model.parameters()).device),
                   "train_s": [r.metrics.get("timings", {}).get("train_s") for r in records], "wall_s": round(wall, 3)}
            res["ok"] = (all(res["updated"]) and all(x is not None and math.isfinite(x) for x in losses)
                         and moved > 0 and res["device"].startswith(dev))
            out[dtype] = res
            out["ok"] = out["ok"] and res["ok"]
    return out


class IdTokenizer:
    """Stands in for a tokenizer: the tiny model has none, and the engine only decodes ids to text."""

    def decode(self, ids: list[int], **_: Any) -> str:
        return "".join(f"<{i}>" for i in ids)

    def __len__(self) -> int:
        return 12


def stage_engine(dev: str) -> dict[str, Any]:
    from rl_backend.serving.engine import Engine
    from rl_backend.serving.model_store import LoadedModel
    from rl_backend.serving.sampling import SamplingParams
    from rl_backend.trainer.toy import tiny_llama

    out: dict[str, Any] = {}
    prompts = [[0, 2 + i % 9] + [(i * 7 + k) % 12 for k in range(i % 5)] for i in range(8)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for dtype in ["float32"] + (["bfloat16"] if dev == "cuda" else []):
        model = tiny_llama(seed=3).to(device=dev, dtype=getattr(torch, dtype)).eval().requires_grad_(False)
        loaded = LoadedModel(name="tiny", path=Path("."), model=model, tokenizer=IdTokenizer(),
                             stop_token_ids=frozenset(), context_length=64)
        engine = Engine(loaded, max_batch_size=8).start()
        try:
            t0 = time.perf_counter()
            single = [engine.generate_sync(p, params, timeout_s=120) for p in prompts]
            t1 = time.perf_counter()
            steps0, rows0 = engine.counters["steps"], engine.counters["row_steps"]
            with ThreadPoolExecutor(len(prompts)) as pool:
                batched = list(pool.map(engine.generate_sync, prompts, [params] * len(prompts), [120.0] * len(prompts)))
            t2 = time.perf_counter()
            steps, rows = engine.counters["steps"] - steps0, engine.counters["row_steps"] - rows0
        finally:
            engine.stop()
        same = sum(a.token_ids == b.token_ids for a, b in zip(single, batched, strict=True))
        lp_diff = max(abs(x.logprob - y.logprob) for a, b in zip(single, batched, strict=True)
                      for x, y in zip(a.logprobs, b.logprobs, strict=False))
        out[dtype] = {"equal": same, "of": len(prompts), "max_logprob_diff": lp_diff, "device": str(engine.device),
                      "mean_decode_batch": round(rows / max(1, steps), 2), "single_s": round(t1 - t0, 3),
                      "batched_s": round(t2 - t1, 3), "distinct_outputs": len({tuple(c.token_ids) for c in single})}
    res = out["float32"]
    out["ok"] = (res["equal"] == res["of"] and res["max_logprob_diff"] < 1e-3 and res["mean_decode_batch"] > 1
                 and res["device"].startswith(dev))
    return out


def save_tiny(folder: Path) -> Any:
    """tiny_llama as a Hugging Face folder with a word-level tokenizer (verl loads one from the model path)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rl_backend.trainer.toy import tiny_llama

    model = tiny_llama()
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(model.config.vocab_size)}, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t0", eos_token="t1", pad_token="t1",
                                   unk_token="t1")
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return model


def toy_batch(model: Any, tasks: list[Any]) -> Any:
    """A TrainBatch of real toy trajectories with at least one nonzero advantage."""
    from rl_backend.trainer.advantage import grpo_advantages
    from rl_backend.trainer.batch import make_batch
    from rl_backend.trainer.toy import run_rollouts
    from rl_backend.trainer.trajectory import build_trajectories

    for step in range(50):
        toy = run_rollouts(model, tasks, 8, step=step, version="base")
        trajs, _ = build_trajectories(toy.rollouts, toy.calls)
        batch = make_batch(trajs, grpo_advantages(trajs).advantages)
        if any(abs(r.advantage) > 0 for r in batch.rows):
            return batch
    raise RuntimeError("no toy batch with a nonzero advantage in 50 tries")


def stage_verl(dev: str) -> dict[str, Any]:
    if dev != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"no CUDA: the verl stage needs a GPU (device {dev!r}, "
                           f"torch.cuda.is_available()={torch.cuda.is_available()})")
    import importlib.util

    import ray
    from omegaconf import open_dict
    from safetensors.torch import load_file

    from rl_backend.trainer.toy import make_tasks
    from rl_backend.trainer.verl_backend.config import VerlSettings, rendered_config, verl_version
    from rl_backend.trainer.verl_backend.data import to_data_proto
    from rl_backend.trainer.verl_backend.driver import VerlTrainer

    out: dict[str, Any] = {"verl": verl_version(), "ray": ray.__version__}
    if ray.is_initialized():
        ray.shutdown()
    tmp = Path(tempfile.mkdtemp(prefix="agl-verl-check-"))
    model = save_tiny(tmp / "model")
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tasks = make_tasks(n=2)
    batch = toy_batch(model, tasks)
    dp = to_data_proto(batch.rows, pad_id=0)
    out["data_proto"] = {k: list(v.shape) for k, v in dp.batch.items()}
    out["rows"], out["rollouts"] = len(batch.rows), batch.totals.n_rollouts
    settings = VerlSettings(spec_name="gpucheck", model_path=str(tmp / "model"), steps=1, tasks_per_step=len(tasks),
                            group_size=8, lr=1e-3, micro_batch_tokens=4096, max_prompt_length=32,
                            max_response_length=32, checkpoint_dir=str(tmp / "ckpt"))
    _, cfg = rendered_config(settings)
    if importlib.util.find_spec("flash_attn") is None:  # verl's default attention is flash_attention_2
        with open_dict(cfg):
            cfg.actor_rollout_ref.model.override_config["attn_implementation"] = "sdpa"
        out["attn_implementation"] = "sdpa (flash_attn not installed)"
    t0 = time.perf_counter()
    trainer = VerlTrainer(cfg, settings, pad_id=0)
    t1 = time.perf_counter()
    metrics = trainer.train_step(batch)
    t2 = time.perf_counter()
    state = trainer.serving_state_dict()
    t3 = time.perf_counter()
    out.update(init_s=round(t1 - t0, 2), train_s=round(t2 - t1, 2), save_s=round(t3 - t2, 2), metrics=metrics)
    files = sorted(Path(state["folder"]).rglob("*.safetensors"))
    out["saved"] = [str(f.relative_to(tmp)) for f in files]
    saved: dict[str, torch.Tensor] = {}
    for f in files:
        saved.update(load_file(str(f)))
    common = [k for k in initial if k in saved]
    diffs = {k: float((saved[k].float() - initial[k].to(saved[k].dtype).float()).abs().max()) for k in common}
    out["weights"] = {"compared": len(common), "moved": sum(d > 0 for d in diffs.values()),
                      "max_abs_diff": max(diffs.values(), default=0.0),
                      "dtype": str(next(iter(saved.values())).dtype) if saved else None}
    loss = metrics.get("loss", metrics.get("pg_loss"))
    out["ok"] = loss is not None and math.isfinite(loss) and out["weights"]["moved"] > 0
    # logprobs the actor computed vs those sampled with the same weights: near 0 unless attention/padding is off
    out["ppo_kl_small"] = abs(metrics.get("ppo_kl", float("nan"))) < 0.02
    return out


def run_stage(name: str, fn: Any, out_file: Path | None) -> bool:
    print(f"=== stage {name}: start", flush=True)
    started = time.perf_counter()
    try:
        res = fn()
    except BaseException as exc:  # noqa: BLE001 - a failed stage is a result, the next stage still runs
        if isinstance(exc, KeyboardInterrupt):
            raise
        res = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:4000],
               "traceback": traceback.format_exc()[-6000:]}
    res["stage_s"] = round(time.perf_counter() - started, 2)
    REPORT[name] = res
    print(json.dumps({"stage": name, **res}, default=str), flush=True)
    print(f"=== stage {name}: {'ok' if res.get('ok') else 'FAILED'} ({res['stage_s']} s)", flush=True)
    if out_file is not None:
        out_file.write_text(json.dumps(REPORT, indent=2, default=str))
    return bool(res.get("ok"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--stages", default="torch,engine,verl")
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="folder for verl_step_check.json")
    args = ap.parse_args()
    out_file = Path(args.out) / "verl_step_check.json" if args.out else None
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
    REPORT["env"] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "device": args.device,
                     "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    stages = args.stages.split(",")
    if "torch" in stages:
        run_stage("torch", lambda: stage_torch(args.device), out_file)
    if "engine" in stages:
        run_stage("engine", lambda: stage_engine(args.device), out_file)
    if "verl" in stages:
        run_stage("verl", lambda: stage_verl(args.device), out_file)
    summary = {k: bool(v.get("ok")) for k, v in REPORT.items() if k != "env"}
    print(json.dumps({"summary": summary}), flush=True)
    return 0 if all(summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
