"""What the gateway costs: added latency (p50/p99) and throughput, against calling the fake upstream directly.

The fake upstream and the gateway each run in their own process (as in a real run); this process is the client
(plain httpx, so the SDK's own overhead does not blur the figures). Run:

    python bench/gateway/bench_overhead.py [--calls 400] [--concurrency 32] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

MSGS = [{"role": "user", "content": "hello there, how are you today"}]


def _serve(kind: str, upstream_url: str | None) -> None:
    """Child process: serve the fake upstream or the gateway, print the base URL (and token), wait for stdin EOF."""
    if kind == "fake":
        from rl_backend.gateway.fake import FakeUpstream

        fake = FakeUpstream(api_key="sk-bench").start()
        print(json.dumps({"url": fake.base_url}), flush=True)
        sys.stdin.read()
        fake.stop()
        return
    from rl_backend.gateway import Gateway, start_gateway
    from rl_backend.gateway.config import ResolvedUpstream
    from rl_backend.store.db import RunStore

    assert upstream_url is not None
    tmp = tempfile.mkdtemp(prefix="agl-bench-")
    store = RunStore(Path(tmp) / "store.sqlite")
    upstream = ResolvedUpstream(
        name="local", api="openai", base_urls=[upstream_url], api_key="sk-bench", returns_token_ids=True
    )
    durable = os.environ.get("AGL_BENCH_DURABLE", "1") == "1"
    gateway = Gateway({"local": upstream}, store, default_model="local/tiny", durable_before_reply=durable)
    server = start_gateway(gateway)
    token = gateway.register_rollout("bench")
    print(json.dumps({"url": f"{server.base_url}/rollouts/bench/openai/v1", "token": token}), flush=True)
    sys.stdin.read()
    server.stop()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"records": store.count_calls(), "cpu_s": usage.ru_utime + usage.ru_stime}), flush=True)


def _spawn(kind: str, upstream_url: str | None = None) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    args = [sys.executable, __file__, "--serve", kind] + ([upstream_url] if upstream_url else [])
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


async def _one(client: httpx.AsyncClient, url: str, key: str, stream: bool) -> tuple[float, float]:
    """(seconds to the full answer, seconds to the first content event)."""
    body = {"model": "x", "messages": MSGS, "stream": stream}
    headers = {"authorization": f"Bearer {key}"}
    t0 = time.perf_counter()
    if not stream:
        r = await client.post(url + "/chat/completions", json=body, headers=headers)
        r.raise_for_status()
        r.json()
        total = time.perf_counter() - t0
        return total, total
    first = None
    async with client.stream("POST", url + "/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if first is None and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return total, first if first is not None else total


async def _measure(url: str, key: str, *, calls: int, concurrency: int, stream: bool) -> dict[str, float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        for _ in range(20):  # warm up connections and code paths
            await _one(client, url, key, stream)
        sequential = [await _one(client, url, key, stream) for _ in range(calls // 2)]
        sem = asyncio.Semaphore(concurrency)

        async def bounded() -> tuple[float, float]:
            async with sem:
                return await _one(client, url, key, stream)

        t0 = time.perf_counter()
        await asyncio.gather(*(bounded() for _ in range(calls)))
        elapsed = time.perf_counter() - t0
    totals = sorted(t for t, _ in sequential)
    firsts = sorted(f for _, f in sequential)

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1000

    return {
        "p50_ms": statistics.median(totals) * 1000,
        "p99_ms": pct(totals, 0.99),
        "ttft_p50_ms": statistics.median(firsts) * 1000,
        "throughput_rps": calls / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-durable", action="store_true", help="reply without waiting for the record's commit")
    parser.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve[0], args.serve[1] if len(args.serve) > 1 else None)
        return
    os.environ["AGL_BENCH_DURABLE"] = "0" if args.no_durable else "1"
    fake, fake_info = _spawn("fake")
    gateway, gw_info = _spawn("gateway", fake_info["url"])
    results: dict[str, dict[str, float]] = {}
    try:
        for stream in (False, True):
            mode = "stream" if stream else "whole"
            direct = asyncio.run(
                _measure(fake_info["url"], "sk-bench", calls=args.calls, concurrency=args.concurrency, stream=stream)
            )
            via = asyncio.run(
                _measure(gw_info["url"], gw_info["token"], calls=args.calls, concurrency=args.concurrency, stream=stream)
            )
            results[f"direct_{mode}"] = direct
            results[f"gateway_{mode}"] = via
            results[f"added_{mode}"] = {
                "p50_ms": via["p50_ms"] - direct["p50_ms"],
                "p99_ms": via["p99_ms"] - direct["p99_ms"],
                "ttft_p50_ms": via["ttft_p50_ms"] - direct["ttft_p50_ms"],
                "throughput_ratio": via["throughput_rps"] / direct["throughput_rps"],
            }
    finally:
        assert gateway.stdin is not None and gateway.stdout is not None
        gateway.stdin.close()
        final = json.loads(gateway.stdout.readline() or "{}")
        gateway.wait(30)
        assert fake.stdin is not None
        fake.stdin.close()
        fake.wait(30)
    expected = 2 * (20 + args.calls // 2 + args.calls)
    results["gateway_process"] = {
        "records": final.get("records"),
        "expected_records": expected,
        "cpu_ms_per_call": 1000 * final.get("cpu_s", float("nan")) / expected,
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, row in results.items():
        print(f"{name:16s} " + "  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
