"""Generation throughput of the embedded model server at 1 and at 8 concurrent requests.

Run from the repository root:

    python bench/serving_bench.py                      # starts an embedded smollm2-135m-instruct server
    python bench/serving_bench.py --max-tokens 64      # quicker
    python bench/serving_bench.py --base-url http://127.0.0.1:8000 --model smollm2-135m-instruct  # a running server

Each request is a short, realistic chat turn (a system prompt and a question) answered greedily with exactly
`--max-tokens` new tokens (`ignore_eos`, so every request does the same work), sent through the official async
openai client, streaming, so the figures include HTTP and detokenization. Throughput is completion tokens over
wall time, per concurrency level, after one warm-up request. The last line on stdout is one JSON object with the
figures and the machine; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from typing import Any

import openai

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


async def _one(client: openai.AsyncOpenAI, model: str, question: str, max_tokens: int) -> tuple[int, float]:
    """Returns (completion tokens, seconds to first token)."""
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return tokens, first if first is not None else float("nan")


async def _level(client: openai.AsyncOpenAI, model: str, concurrency: int, max_tokens: int) -> dict[str, float]:
    start = time.perf_counter()
    results = await asyncio.gather(
        *(_one(client, model, QUESTIONS[i % len(QUESTIONS)], max_tokens) for i in range(concurrency))
    )
    wall = time.perf_counter() - start
    tokens = sum(t for t, _ in results)
    return {
        "requests": concurrency,
        "completion_tokens": tokens,
        "seconds": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 2),
        "mean_ttft_s": round(sum(f for _, f in results) / len(results), 3),
    }


async def _bench(base_url: str, model: str, levels: list[int], max_tokens: int) -> dict[str, Any]:
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=3600) as client:
        print("warming up", file=sys.stderr)
        await _one(client, model, QUESTIONS[0], 8)
        out: dict[str, Any] = {}
        for n in levels:
            print(f"{n} concurrent request(s), {max_tokens} tokens each", file=sys.stderr)
            out[str(n)] = await _level(client, model, n, max_tokens)
            print(f"  {out[str(n)]}", file=sys.stderr)
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--base-url", default=None, help="benchmark a running server instead of starting one")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16, float16")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores but one)")
    args = ap.parse_args(argv)

    server = None
    base_url = args.base_url
    if base_url is None:
        from rl_backend.serving import start_embedded_server

        print(f"loading {args.model}", file=sys.stderr)
        server = start_embedded_server(
            args.model, device=args.device, dtype=args.dtype, threads=args.threads, max_batch_size=max(args.concurrency)
        )
        base_url = server.base_url
    try:
        levels = asyncio.run(_bench(base_url.rstrip("/"), args.model, args.concurrency, args.max_tokens))
    finally:
        if server is not None:
            server.stop()

    result: dict[str, Any] = {
        "bench": "serving",
        "model": args.model,
        "max_tokens": args.max_tokens,
        "levels": levels,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        },
    }
    if server is not None:
        import torch

        result["machine"]["torch"] = torch.__version__
        result["machine"]["torch_threads"] = torch.get_num_threads()
        result["machine"]["device"] = str(server.engine.device)
        result["machine"]["dtype"] = str(server.engine.loaded.model.dtype).replace("torch.", "")
    lo, hi = str(min(args.concurrency)), str(max(args.concurrency))
    if lo != hi and levels[lo]["tokens_per_s"]:
        result["speedup"] = round(levels[hi]["tokens_per_s"] / levels[lo]["tokens_per_s"], 2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
