"""agl's gateway against Agent Lightning's LLM proxy, same upstream, same load, same run.

Five processes: the fast fake upstream (rl_backend.gateway.fake.fast), agl's gateway (`agl gateway serve`, every
call committed to SQLite before the answer's last byte), Agent Lightning's server (`python -m agentlightning.server`,
its proxy at /proxy/rollout/<rid>/attempt/<aid>/mode/train/openai/v1; events kept in memory), the load generator
(loadgen.py, its own process) and this script, which reads both gateways' CPU time from /proc.

Both gateways ask the upstream for token ids and logprobs (agl: `--token-ids`; AL: mode `train`). Calls are not
streamed: AL's proxy refuses streaming. At concurrency 1 the three targets (direct, agl, AL) are interleaved call by
call; at concurrency 64 each gets the same number of calls in turn, several rounds, median round.

Agent Lightning needs Python 3.12 and its own virtualenv (never vendored here):

    python3.12 -m venv /tmp/al312 && /tmp/al312/bin/pip install agentlightning==1.0.2
    python bench/gateway/bench_vs_agentlightning.py --al-python /tmp/al312/bin/python [--calls 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

from bench_overhead import cpu_s, loadgen  # noqa: E402

from rl_backend.gateway.fake.procs import register, spawn_fast_fake, spawn_gateway  # noqa: E402

GATEWAY_SERVE = [sys.executable, "-m", "agl_cli", "gateway", "serve"]

MODEL = "tiny"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_agentlightning(python: str, upstream_url: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """AL's server on a free port, the fake registered as its model server, one rollout: (process, proxy base URL,
    version)."""
    version = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('agentlightning'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    port = _free_port()
    proc = subprocess.Popen(
        [python, "-m", "agentlightning.server", "host=127.0.0.1", f"port={port}", f"default_proxy.model_name={MODEL}",
         f"hydra.run.dir={workdir}"],
        cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"Agent Lightning's server did not start (rc={proc.poll()})")
        time.sleep(0.2)
    httpx.post(f"{base}/api/models", json=[{"model": MODEL, "endpoint": upstream_url}], timeout=10).raise_for_status()
    httpx.post(f"{base}/api/rollouts", json=[{"input": {}, "rollout_id": "bench"}], timeout=10).raise_for_status()
    return proc, f"{base}/proxy/rollout/bench/attempt/a1/mode/train/openai/v1", version


def one_run(targets: list[dict[str, Any]], pids: dict[str, int], *, calls: int, rounds: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for concurrency in (1, 64):
        n = calls if concurrency == 1 else calls * 2
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        res = loadgen(targets, calls=n, concurrency=concurrency, stream=False, rounds=rounds)
        spent = {name: cpu_s(pid) - before[name] for name, pid in pids.items()}
        through = 20 + (n if concurrency == 1 else n * rounds)
        direct = res["direct"]
        for name in pids:
            r = res[name]
            rows[f"c{concurrency}/{name}"] = {
                "p50_ms": r["p50_ms"],
                "p99_ms": r["p99_ms"],
                "added_p50_ms": r["p50_ms"] - direct["p50_ms"],
                "added_p99_ms": r["p99_ms"] - direct["p99_ms"],
                "throughput_rps": r["throughput_rps"],
                "direct_rps": direct["throughput_rps"],
                "cpu_ms_per_call": 1000 * spent[name] / through,
                "errors": r["errors"],
            }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--al-python", default="/tmp/al312/bin/python", help="python of a venv with agentlightning")
    parser.add_argument("--calls", type=int, default=300, help="calls per target at concurrency 1 (x2 per round at 64)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3, help="whole runs; medians are shown")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="agl-vs-al-")
    fake = spawn_fast_fake()
    gw = None
    al = None
    try:
        gw = spawn_gateway(GATEWAY_SERVE, fake.url, Path(tmp.name) / "agl.sqlite", admin_token="bench")
        reg = register(gw.url, "bench", "bench")
        al, al_url, al_version = start_agentlightning(args.al_python, fake.url, Path(tmp.name))
        targets = [
            {"name": "direct", "url": fake.url, "key": "none"},
            {"name": "agl", "url": reg["openai_base_url"], "key": reg["token"]},
            {"name": "agentlightning", "url": al_url, "key": "none"},
        ]
        pids = {"agl": gw.pid, "agentlightning": al.pid}
        runs = [one_run(targets, pids, calls=args.calls, rounds=args.rounds) for _ in range(args.repeat)]
    finally:
        if al is not None:
            al.terminate()
            al.wait(15)
        if gw is not None:
            gw.stop()
        fake.kill()
        tmp.cleanup()
    table = {row: {k: statistics.median(r[row][k] for r in runs) for k in runs[0][row]} for row in runs[0]}
    ratio = {f"c{c}": table[f"c{c}/agl"]["throughput_rps"] / table[f"c{c}/agentlightning"]["throughput_rps"]
             for c in (1, 64)}
    document = {"agentlightning_version": al_version, "calls": args.calls, "rounds": args.rounds,
                "repeat": args.repeat, "median_of_runs": table, "agl_over_al_throughput": ratio, "runs": runs}
    if args.json:
        print(json.dumps(document, indent=2))
        return
    columns = ["p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms", "throughput_rps", "cpu_ms_per_call", "errors"]
    print(f"agl gateway vs agentlightning {al_version} (non-streaming; medians of {args.repeat} runs)")
    print(f"{'':26s}" + "".join(f"{c:>16s}" for c in columns))
    for row, values in table.items():
        print(f"{row:26s}" + "".join(f"{values[c]:16.3f}" for c in columns))
    direct_p50 = table["c1/agl"]["p50_ms"] - table["c1/agl"]["added_p50_ms"]
    print(f"direct upstream: c1 p50 {direct_p50:.3f} ms, c64 throughput {table['c64/agl']['direct_rps']:.0f}/s")
    print("agl / agentlightning throughput: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    print(json.dumps({"median_of_runs": table, "agl_over_al_throughput": ratio}))


if __name__ == "__main__":
    main()
