"""Rollouts per minute of the offline example under `agl eval`, on the embedded model.

Run:  python bench/eval_throughput.py [--tasks 40] [--concurrency 4] [--split val]
Prints one JSON line: rollouts, wall seconds, rollouts/minute, accuracy with its interval, and the machine.
Each run is a real `agl eval` subprocess (model load included once), so the figure is what a user sees.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--split", default="val")
    args = parser.parse_args()
    spec = REPO / "examples" / "calc" / "agl.yaml"
    with tempfile.TemporaryDirectory() as runs:
        env = dict(os.environ, NO_COLOR="1")
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "agl_cli", "eval", str(spec), "--split", args.split, "--limit", str(args.tasks),
             "--json", "--quiet", "--runs-dir", runs, "--concurrency", str(args.concurrency)],
            env=env, capture_output=True, text=True, check=False,
        )
        wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"agl eval failed ({result.returncode}):\n{result.stderr[-3000:]}")
    doc = json.loads(result.stdout)
    variant = doc["variants"][0]
    print(json.dumps({
        "rollouts": variant["finished"],
        "wall_s": round(wall, 1),
        "rollouts_per_min": round(60 * variant["finished"] / wall, 1),
        "latency_p50_s": variant["latency_s"]["p50"],
        "accuracy": variant["accuracy"],
        "n": variant["n"],
        "tokens": variant["tokens"],
        "concurrency": args.concurrency,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }))


if __name__ == "__main__":
    main()
