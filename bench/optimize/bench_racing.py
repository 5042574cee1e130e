"""Benchmark: how many rollouts racing needs to pick the best of 8 variants, against the full grid at the same
confidence, and how often an A/A comparison wrongly says `better`.

Run from the repository root (a few minutes on one core):

    /work/venv/bin/python bench/optimize/bench_racing.py            # or: python bench/optimize/bench_racing.py
    python bench/optimize/bench_racing.py --reps 100 --json          # fewer repetitions, machine-readable

A statistics-level simulation: each variant answers each (task, seed) right with its own probability, from a
seeded RNG, exactly like tests/fixtures/synthetic_agent.py; the racing code is agl's own (agl_cli.optimize.racing).

Two yardsticks for the grid:
- the full grid: every variant on every validation task (what `--strategy grid` runs); racing must pick the best
  at least as often, with at most a third of its rollouts (the goal);
- the grid on the same tasks: every variant on as many tasks as racing's winner used. That is the stricter
  comparison (same evidence about the winner against the runner-up); no racing can go below
  sum(tasks each loser needs) / (8 x tasks the winner needs), about 0.39 for the default accuracies.
A second scenario has a close race at the top (0.80 vs 0.85), where neither method is sure.
Goal for A/A: false `better` at most 5%.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agl_cli.metrics.paired import BETTER, WORSE, compare  # noqa: E402
from agl_cli.optimize.racing import race  # noqa: E402

ACCURACIES = [0.45, 0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.85]
CLOSE = [0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80, 0.85]


def simulate_race(rng: np.random.Generator, accuracies: list[float], n_tasks: int, seeds: int) -> dict[str, float]:
    names = [f"v{i}" for i in range(len(accuracies))]
    outcomes = {name: (rng.random((n_tasks, seeds)) < p).astype(float) for name, p in zip(names, accuracies, strict=True)}
    task_ids = [f"t{i}" for i in range(n_tasks)]
    ran: dict[str, dict[tuple[str, int], float]] = {name: {} for name in names}
    rollouts = 0

    def run_batch(variants: list[str], tasks: list[str]) -> bool:
        nonlocal rollouts
        for name in variants:
            for task in tasks:
                index = int(task[1:])
                for seed in range(seeds):
                    if (task, seed) not in ran[name]:
                        ran[name][(task, seed)] = float(outcomes[name][index, seed])
                        rollouts += 1
        return True

    result = race(names, task_ids, run_batch, lambda: ran)
    best = names[int(np.argmax(accuracies))]
    winner = max(result.survivors, key=lambda n: np.mean(list(ran[n].values())))
    n_used = result.tasks_used
    # The grid on the same tasks: every variant on the first n_used tasks, the highest mean wins.
    grid_means = [outcomes[name][:n_used].mean() for name in names]
    full_means = [outcomes[name].mean() for name in names]
    return {
        "full_grid_correct": float(names[int(np.argmax(full_means))] == best),
        "rollouts": rollouts,
        "tasks_used": n_used,
        "decided": float(len(result.survivors) == 1),
        "correct": float(winner == best),
        "grid_correct": float(names[int(np.argmax(grid_means))] == best),
        "grid_same_confidence": len(names) * n_used * seeds,
        "grid_full": len(names) * n_tasks * seeds,
    }


def aa_rates(rng: np.random.Generator, reps: int, n: int, p: float) -> dict[str, float]:
    verdicts = {BETTER: 0, WORSE: 0}
    for _ in range(reps):
        a = rng.random(n) < p
        b = rng.random(n) < p
        result = compare({(f"t{i}", 0): float(x) for i, x in enumerate(a)},
                         {(f"t{i}", 0): float(x) for i, x in enumerate(b)}, resamples=2000)
        if result.verdict in verdicts:
            verdicts[result.verdict] += 1
    return {"false_better": verdicts[BETTER] / reps, "false_worse": verdicts[WORSE] / reps}


def power(rng: np.random.Generator, reps: int, n: int, p_a: float, p_b: float) -> float:
    hits = 0
    for _ in range(reps):
        a = rng.random(n) < p_a
        b = rng.random(n) < p_b
        result = compare({(f"t{i}", 0): float(x) for i, x in enumerate(a)},
                         {(f"t{i}", 0): float(x) for i, x in enumerate(b)}, resamples=2000)
        hits += result.verdict == BETTER
    return hits / reps


def scenario(rng: np.random.Generator, accuracies: list[float], tasks: int, seeds: int, reps: int) -> dict[str, Any]:
    runs = [simulate_race(rng, accuracies, tasks, seeds) for _ in range(reps)]
    mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    return {
        "accuracies": accuracies,
        "tasks": tasks,
        "reps": reps,
        "racing": {"rollouts_mean": mean["rollouts"], "tasks_used_mean": mean["tasks_used"],
                   "decided_rate": mean["decided"], "picked_best_rate": mean["correct"]},
        "full_grid": {"rollouts": mean["grid_full"], "picked_best_rate": mean["full_grid_correct"]},
        "grid_same_tasks": {"rollouts_mean": mean["grid_same_confidence"], "picked_best_rate": mean["grid_correct"]},
        "racing_over_full_grid": mean["rollouts"] / mean["grid_full"],
        "racing_over_grid_same_tasks": mean["rollouts"] / mean["grid_same_confidence"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=400, help="validation tasks available to the search")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(20240601)
    report: dict[str, Any] = {
        "spread": scenario(rng, ACCURACIES, args.tasks, args.seeds, args.reps),
        "close": scenario(rng, CLOSE, args.tasks, args.seeds, args.reps),
        "aa_n200_p0.6": aa_rates(rng, 2000, 200, 0.6),
        "aa_n400_p0.5": aa_rates(rng, 1000, 400, 0.5),
        "power_10_points_n400": {f"{a}->{b}": power(rng, 500, 400, a, b) for a, b in [(0.5, 0.6), (0.6, 0.7),
                                                                                      (0.7, 0.8)]},
    }
    report["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for key in ("spread", "close"):
        r = report[key]
        print(f"racing, best of {len(r['accuracies'])} variants {r['accuracies']}, {r['tasks']} val tasks, "
              f"{r['reps']} reps:")
        print(f"  racing:          {r['racing']['rollouts_mean']:.0f} rollouts, winner on "
              f"{r['racing']['tasks_used_mean']:.0f} tasks, one survivor in {100 * r['racing']['decided_rate']:.0f}%, "
              f"picked the best in {100 * r['racing']['picked_best_rate']:.1f}%")
        print(f"  full grid:       {r['full_grid']['rollouts']:.0f} rollouts, picked the best in "
              f"{100 * r['full_grid']['picked_best_rate']:.1f}%")
        print(f"  grid, same tasks: {r['grid_same_tasks']['rollouts_mean']:.0f} rollouts, picked the best in "
              f"{100 * r['grid_same_tasks']['picked_best_rate']:.1f}%")
        print(f"  racing / full grid: {r['racing_over_full_grid']:.3f} (goal <= 0.333); "
              f"racing / grid on the same tasks: {r['racing_over_grid_same_tasks']:.3f}")
    for key in ("aa_n200_p0.6", "aa_n400_p0.5"):
        print(f"A/A {key}: false better {100 * report[key]['false_better']:.2f}% (goal <= 5%), "
              f"false worse {100 * report[key]['false_worse']:.2f}%")
    print(f"power, 10 points better at n=400: {report['power_10_points_n400']}")
    print(f"({report['seconds']} s)")


if __name__ == "__main__":
    main()
