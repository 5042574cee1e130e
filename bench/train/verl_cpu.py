"""The verl backend's whole driver on the CPU: wall time, and how closely the logprobs the gateway recorded while
sampling agree with the ones verl's actor recomputes before each update (the gap its rollout correction weighs).

    python bench/train/verl_cpu.py                       # the tiny random model of the tests, 3 updates
    python bench/train/verl_cpu.py --model smollm2       # the calc example on SmolLM2-135M-Instruct, 2 updates

Each run is `agl train SPEC --backend verl --device cpu` in a fresh AGL_HOME: a local Ray, verl's RayPPOTrainer with
its FSDP engine (gloo, world size 1), agl's embedded engine as the rollout server verl manages and syncs weights
into. Prints one JSON document: the wall time of the whole command (Ray and model start-up, held-out before and
after, the updates), the seconds of each update, and per step `rollout_corr_kl` (verl's KL estimate between the
recorded and the recomputed token logprobs), the largest per-token probability gap, and verl's `ppo_kl` (between the
recomputed old logprobs and the policy during the update: 0 with one optimizer step per batch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def tiny_project(folder: Path) -> Path:
    from tests.helpers.models import make_tiny_chat_model, write_training_project

    make_tiny_chat_model(folder / "tiny")
    return write_training_project(folder, "tiny")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--steps", type=int, default=None, help="updates (default 3 tiny, 2 smollm2)")
    args = parser.parse_args()
    steps = args.steps or (3 if args.model == "tiny" else 2)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        spec = tiny_project(folder) if args.model == "tiny" else REPO / "examples" / "calc" / "agl.yaml"
        extra = ["--lr", "2e-5"] if args.model == "smollm2" else ["--lr", "1e-3"]
        command = [sys.executable, "-m", "agl_cli", "train", str(spec), "--backend", "verl", "--device", "cpu",
                   "--steps", str(steps), "--tasks-per-step", "2", "--group-size", "2", "--heldout-limit", "4",
                   *extra]
        env = {**os.environ, "AGL_HOME": str(folder / "home"), "NO_COLOR": "1"}
        started = time.perf_counter()
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            return done.returncode
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        result = lines[-1]["result"]
        rows = []
        for step in result["steps"]:
            train = step["metrics"]["train"]
            rows.append({"step": step["step"], "update_s": step["metrics"]["timings"].get("train_s"),
                         "rollout_corr_kl": train.get("rollout_corr_kl"),
                         "max_prob_gap": train.get("training_rollout_probs_diff_max"),
                         "ppo_kl": train.get("ppo_kl"), "reward_mean": step["reward_mean"]})
        print(json.dumps({"model": args.model, "steps": steps, "wall_s": round(wall, 1), "per_step": rows,
                          "comparison": (result.get("comparison") or {}).get("sentence"),
                          "command": " ".join(command[1:])}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
