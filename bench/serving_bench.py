"""The embedded engine against a plain Hugging Face `generate` loop, side by side, and what each precision keeps.

Run from the repository root:

    python bench/serving_bench.py                                # every option, 64 new tokens, 3 rounds
    python bench/serving_bench.py --threads 1 --rounds 5         # both sides on one thread
    python bench/serving_bench.py --options float32 --max-tokens 128

Both sides run in this process on the same safetensors copy of the model, with the same number of torch threads
(`--threads`, default: every core this process may use), greedy, exactly `--max-tokens` new tokens per request:
- `hf-generate`: `model.generate` on a static, left-padded batch of the 1 or 8 prompts;
- `agl-<option>`: the embedded server (`--options`: float32, the default, bfloat16, int8-dynamic, and `hf-forward`, the
  engine's Hugging Face runner), the 1 or 8 requests sent at once through the official async openai client,
  streaming, so agl's figures include HTTP and detokenization. Its prefix cache is off (these prompts repeat every
  round; reuse would flatter agl); `--prefix-cache` turns it on.
Rounds interleave the systems (hf, agl-float32, agl-bfloat16, ... then again), so load from other processes
falls on all of them alike; each figure is the median over rounds of completion tokens per second of wall time, and
each ratio to HF generate is the median of the per-round ratios (each agl run against the HF run of its round).

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
import sys
import time
from pathlib import Path
from typing import Any

import openai

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
OPTIONS = ["float32", "bfloat16", "int8-dynamic", "hf-forward"]


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class HFGenerate:
    """The baseline: transformers' own generate loop on a static batch."""

    def __init__(self, path: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()

    def run(self, n: int, max_tokens: int) -> float:
        batch = self.tokenizer.apply_chat_template(
            [_messages(QUESTIONS[i % len(QUESTIONS)]) for i in range(n)], add_generation_prompt=True,
            return_tensors="pt", padding=True, return_dict=True,
        )
        start = time.perf_counter()
        with self.torch.inference_mode():
            out = self.model.generate(
                **batch, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        wall = time.perf_counter() - start
        return (out.shape[1] - batch["input_ids"].shape[1]) * n / wall

    def logprobs(self, prompt: list[int], completion: list[int]) -> list[float]:
        """The float32 model's logprobs of `completion` after `prompt`, in one forward pass (as the trainer does)."""
        torch = self.torch
        ids = torch.tensor([prompt + completion])
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        picked = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None])
        return [float(x) for x in picked[:, 0]]


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


async def _agl_level(base_url: str, n: int, max_tokens: int) -> float:
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=3600) as client:
        start = time.perf_counter()
        counts = await asyncio.gather(*(_one(client, QUESTIONS[i % len(QUESTIONS)], max_tokens) for i in range(n)))
        return sum(counts) / (time.perf_counter() - start)


async def _replies(base_url: str, together: bool, max_tokens: int) -> list[tuple[list[int], list[int], list[float]]]:
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=3600) as client:
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


def _guarantees(base_url: str, hf: HFGenerate, max_tokens: int) -> dict[str, Any]:
    alone = asyncio.run(_replies(base_url, False, max_tokens))
    together = asyncio.run(_replies(base_url, True, max_tokens))
    same_ids = all(a[1] == b[1] for a, b in zip(alone, together, strict=True))
    batch_diff = max(abs(x - y) for a, b in zip(alone, together, strict=True) for x, y in zip(a[2], b[2], strict=False))
    trainer_diff = max(
        abs(x - y) for prompt, ids, lps in together for x, y in zip(lps, hf.logprobs(prompt, ids), strict=True)
    )
    return {"batch_invariant_ids": same_ids, "batch_logprob_max_diff": batch_diff, "trainer_logprob_max_diff": trainer_diff}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--options", nargs="+", choices=OPTIONS, default=OPTIONS)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both sides (default: every usable core)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefix-cache", action="store_true", help="keep agl's prefix cache on (off by default)")
    ap.add_argument("--skip-guarantees", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from rl_backend.serving import Engine, load_model, start_embedded_server
    from rl_backend.serving.model_store import ensure_converted
    from rl_backend.serving.threads import usable_cores

    threads = args.threads or len(usable_cores())
    torch.set_num_threads(threads)
    path = ensure_converted(MODEL)
    _log(f"loading {MODEL} from {path} ({threads} thread(s))")
    hf = HFGenerate(path)
    servers = {}
    for option in args.options:
        engine = Engine(
            load_model(MODEL), max_batch_size=max(args.concurrency), threads=threads,
            precision="float32" if option == "hf-forward" else option,  # type: ignore[arg-type]
            fast=False if option == "hf-forward" else None, prefix_cache_mb=None if args.prefix_cache else 0,
        )
        servers[f"agl-{option}"] = start_embedded_server(engine=engine)
    systems = ["hf-generate", *servers]
    samples: dict[str, dict[int, list[float]]] = {s: {n: [] for n in args.concurrency} for s in systems}
    try:
        hf.run(1, 4)
        for server in servers.values():
            asyncio.run(_agl_level(server.base_url, 1, 4))
        for r in range(args.rounds):
            for n in args.concurrency:
                for system in systems:
                    if system == "hf-generate":
                        tps = hf.run(n, args.max_tokens)
                    else:
                        tps = asyncio.run(_agl_level(servers[system].base_url, n, args.max_tokens))
                    samples[system][n].append(tps)
                    _log(f"round {r + 1}/{args.rounds}  {system:18s} {n} request(s): {tps:7.1f} tok/s")
        guarantees = {}
        if not args.skip_guarantees:
            for system, server in servers.items():
                _log(f"checking {system}: alone against batched, and against the float32 forward")
                guarantees[system] = _guarantees(server.base_url, hf, 24)
    finally:
        for server in servers.values():
            server.stop()

    table: dict[str, Any] = {}
    for system in systems:
        row: dict[str, Any] = {str(n): round(statistics.median(v), 1) for n, v in samples[system].items()}
        row["samples"] = {str(n): [round(x, 1) for x in v] for n, v in samples[system].items()}
        if system != "hf-generate":
            row["vs_hf_generate"] = {
                str(n): round(statistics.median(
                    a / b for a, b in zip(samples[system][n], samples["hf-generate"][n], strict=True)), 2)
                for n in args.concurrency
            }
            row.update(guarantees.get(system, {}))
        table[system] = row
    _log(f"\n{'system':18s} " + " ".join(f"{n:>4} req tok/s (x hf)" for n in args.concurrency)
         + "  same ids batched | max dlogprob batched | vs trainer")
    for system, row in table.items():
        cells = " ".join(
            f"{row[str(n)]:>12.1f} ({row.get('vs_hf_generate', {}).get(str(n), 1.0):4.2f}x)" for n in args.concurrency
        )
        extra = ""
        if "batch_invariant_ids" in row:
            extra = (f"  {row['batch_invariant_ids']!s:>16} | {row['batch_logprob_max_diff']:20.2e} | "
                     f"{row['trainer_logprob_max_diff']:.2e}")
        _log(f"{system:18s} {cells}{extra}")
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
