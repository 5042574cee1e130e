"""The benchmarks' load generator: a process of its own that sends OpenAI chat calls to several targets.

Targets are compared under the same conditions: at concurrency 1 their calls are interleaved one by one (A, B, C,
A, B, C, …), so a burst of load from elsewhere on the machine hits all of them alike; at higher concurrency each
target gets the same number of calls in turn, for several rounds, and the median round counts. The client is the
gateway's own lean HTTP/1.1 client (httptools), so the load generator costs little CPU next to what it measures.

    python loadgen.py '{"targets": [{"name": "direct", "url": "http://…/v1", "key": "k"}], "calls": 200,
                        "concurrency": 1, "rounds": 3, "stream": false}'

prints one JSON document: per target p50/p99 latency (ms), time to first byte of content, throughput (calls/s),
and errors.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from typing import Any

from rl_backend.gateway.h1client import H1Pool

BODY = {"model": "x", "messages": [{"role": "user", "content": "hello there, how are you today"}]}


async def one(pool: H1Pool, target: dict[str, Any], body: bytes, stream: bool) -> tuple[float, float]:
    """(seconds to the whole answer, seconds to its first body bytes)."""
    headers = {"content-type": "application/json", "authorization": f"Bearer {target['key']}"}
    t0 = time.perf_counter()
    response = await pool.post(target["url"] + "/chat/completions", headers, body, timeout=60, connect_timeout=10)
    first = None
    try:
        if response.status_code != 200:
            raise RuntimeError(f"{target['name']}: HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        async for _chunk in response.aiter_bytes():
            if first is None:
                first = time.perf_counter() - t0
    finally:
        response.close()
    total = time.perf_counter() - t0
    return total, first if first is not None else total


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    targets: list[dict[str, Any]] = spec["targets"]
    calls, concurrency, rounds = int(spec["calls"]), int(spec["concurrency"]), int(spec.get("rounds", 3))
    stream = bool(spec.get("stream", False))
    body = json.dumps({**BODY, "stream": stream}).encode()
    pool = H1Pool(max_idle_per_origin=1024, keepalive_s=60)
    lat: dict[str, list[tuple[float, float]]] = {t["name"]: [] for t in targets}
    rps: dict[str, list[float]] = {t["name"]: [] for t in targets}
    errors: dict[str, int] = {t["name"]: 0 for t in targets}
    for target in targets:  # warm up connections and code paths
        for _ in range(20):
            await one(pool, target, body, stream)
    if concurrency == 1:
        for _ in range(calls):
            for target in targets:
                try:
                    lat[target["name"]].append(await one(pool, target, body, stream))
                except Exception:  # noqa: BLE001 - counted and reported
                    errors[target["name"]] += 1
    else:
        for _ in range(rounds):
            for target in targets:
                sem = asyncio.Semaphore(concurrency)

                async def bounded(target: dict[str, Any] = target, sem: asyncio.Semaphore = sem) -> None:
                    async with sem:
                        try:
                            lat[target["name"]].append(await one(pool, target, body, stream))
                        except Exception:  # noqa: BLE001 - counted and reported
                            errors[target["name"]] += 1

                t0 = time.perf_counter()
                await asyncio.gather(*(bounded() for _ in range(calls)))
                rps[target["name"]].append(calls / (time.perf_counter() - t0))
    await pool.aclose()
    result: dict[str, Any] = {}
    for target in targets:
        name = target["name"]
        totals = [t for t, _ in lat[name]] or [float("nan")]
        firsts = [f for _, f in lat[name]] or [float("nan")]
        result[name] = {
            "calls": len(lat[name]),
            "errors": errors[name],
            "p50_ms": statistics.median(totals) * 1000,
            "p99_ms": pct(totals, 0.99),
            "first_byte_p50_ms": statistics.median(firsts) * 1000,
            "throughput_rps": statistics.median(rps[name]) if rps[name] else len(totals) / sum(totals),
            "throughput_rounds": [round(r, 1) for r in rps[name]],
        }
    return result


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        import uvloop

        result = uvloop.run(run(spec))
    except ImportError:
        result = asyncio.run(run(spec))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
