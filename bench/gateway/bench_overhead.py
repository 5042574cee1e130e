"""What the gateway costs: added latency (p50/p99) and throughput against calling the same upstream directly, and
the gateway's CPU per call.

Four processes: the fast fake upstream (rl_backend.gateway.fake.fast, answers in tens of microseconds), the gateway
(`agl gateway serve`, recording every call in its SQLite store, each record committed before the answer's last
byte), the load generator (loadgen.py), and this script, which reads the gateway's CPU time from /proc. Run:

    python bench/gateway/bench_overhead.py [--calls 400] [--repeat 3] [--json]

To measure a gateway started elsewhere (another version, say): --gateway-url BASE --gateway-key TOKEN [--gateway-pid PID].
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from rl_backend.gateway.fake.procs import register, spawn_fast_fake, spawn_gateway  # noqa: E402

GATEWAY_SERVE = [sys.executable, "-m", "agl_cli", "gateway", "serve"]

PHASES = [  # (concurrency, stream)
    (1, False),
    (1, True),
    (64, False),
    (64, True),
]


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadgen(targets: list[dict[str, Any]], *, calls: int, concurrency: int, stream: bool, rounds: int) -> dict[str, Any]:
    spec = {"targets": targets, "calls": calls, "concurrency": concurrency, "stream": stream, "rounds": rounds}
    out = subprocess.run([sys.executable, str(HERE / "loadgen.py"), json.dumps(spec)], capture_output=True, text=True,
                         check=True, timeout=1800)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def measure(direct: dict[str, Any], gateway: dict[str, Any], gateway_pid: int | None, *, calls: int,
            rounds: int) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for concurrency, stream in PHASES:
        n = calls if concurrency == 1 else calls * 2
        before = cpu_s(gateway_pid)
        res = loadgen([direct, gateway], calls=n, concurrency=concurrency, stream=stream, rounds=rounds)
        spent = cpu_s(gateway_pid) - before
        through_gateway = 20 + (n if concurrency == 1 else n * rounds)
        d, g = res["direct"], res["gateway"]
        rows[f"c{concurrency}_{'stream' if stream else 'whole'}"] = {
            "direct_p50_ms": d["p50_ms"],
            "gateway_p50_ms": g["p50_ms"],
            "added_p50_ms": g["p50_ms"] - d["p50_ms"],
            "added_p99_ms": g["p99_ms"] - d["p99_ms"],
            "added_first_byte_p50_ms": g["first_byte_p50_ms"] - d["first_byte_p50_ms"],
            "direct_rps": d["throughput_rps"],
            "gateway_rps": g["throughput_rps"],
            "gateway_cpu_ms_per_call": 1000 * spent / through_gateway,
            "errors": d["errors"] + g["errors"],
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400, help="calls per target and phase (x2 at concurrency 64)")
    parser.add_argument("--repeat", type=int, default=3, help="whole runs; the table shows medians")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per concurrency-64 phase")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--gateway-url", help="a gateway already running (base URL)")
    parser.add_argument("--gateway-key", help="its rollout token (with --gateway-url)")
    parser.add_argument("--gateway-pid", type=int, help="its process id, for CPU per call")
    parser.add_argument("--upstream-url", help="the upstream that gateway calls (default: start the fast fake)")
    args = parser.parse_args()
    fake = None if args.upstream_url else spawn_fast_fake()
    upstream_url = args.upstream_url or (fake.url if fake else "")
    gw = None
    tmp = tempfile.TemporaryDirectory(prefix="agl-bench-")
    try:
        if args.gateway_url:
            gateway = {"name": "gateway", "url": args.gateway_url, "key": args.gateway_key}
            pid = args.gateway_pid
        else:
            gw = spawn_gateway(GATEWAY_SERVE, upstream_url, Path(tmp.name) / "store.sqlite", admin_token="bench")
            reg = register(gw.url, "bench", "bench")
            gateway = {"name": "gateway", "url": reg["openai_base_url"], "key": reg["token"]}
            pid = gw.pid
        direct = {"name": "direct", "url": upstream_url, "key": "none"}
        runs = [measure(direct, gateway, pid, calls=args.calls, rounds=args.rounds) for _ in range(args.repeat)]
    finally:
        if gw is not None:
            gw.stop()
        if fake is not None:
            fake.kill()
        tmp.cleanup()
    table = {phase: {k: statistics.median(r[phase][k] for r in runs) for k in runs[0][phase]} for phase in runs[0]}
    if args.json:
        print(json.dumps({"median_of_runs": table, "runs": runs}, indent=2))
        return
    columns = list(next(iter(table.values())))
    print(f"{'phase':12s} " + " ".join(f"{c:>24s}" for c in columns))
    for phase, row in table.items():
        print(f"{phase:12s} " + " ".join(f"{row[c]:24.3f}" for c in columns))


if __name__ == "__main__":
    main()
