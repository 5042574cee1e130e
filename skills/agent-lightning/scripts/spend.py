#!/usr/bin/env python3
"""What the optimization has spent so far, across every run in the runs folder, against a budget: rollouts
launched and model cost in USD. Check it before each new eval, compare or optimize, and stop at the budget.

A rollout that a run reused from an earlier run (same agent, variant, task and seed: agl's result cache) was
paid for once, by the earlier run: it is listed as `reused_rollouts` / `reused_usd`, never counted as launched
or spent again.

Examples:
  spend.py --budget-usd 5 --budget-rollouts 2000          # the budget from agl.yaml's `budget:`
  spend.py --since 2025-01-01T09:00 --spec agl.yaml
Prints JSON; `over_budget` is true once either ceiling is reached. Read only; standard library only.
Exit 0 on success, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ inside an installed skill
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import connect, emit, fail, manifest, reused_ids, runs_root  # noqa: E402


def since_epoch(text: str | None) -> float:
    if not text:
        return 0.0
    try:
        return float(text)
    except ValueError:
        pass
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(text, fmt))
        except ValueError:
            continue
    fail(f"--since {text!r}: give seconds since the epoch or a local time like 2025-01-31T09:30")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", help="where runs live (default ./.agl/runs or $AGL_HOME/runs)")
    parser.add_argument("--since", help="only runs created at or after this time")
    parser.add_argument("--spec", help="only runs of this agl.yaml")
    parser.add_argument("--budget-usd", type=float, help="the ceiling on model cost")
    parser.add_argument("--budget-rollouts", type=int, help="the ceiling on rollouts launched")
    args = parser.parse_args(argv)

    start = since_epoch(args.since)
    spec = str(Path(args.spec).expanduser().resolve()) if args.spec else None
    root = runs_root(args.runs_dir)
    runs = []
    for folder in sorted(root.glob("*")) if root.is_dir() else []:
        if not (folder / "manifest.json").is_file() or not (folder / "store.sqlite").is_file():
            continue
        meta = manifest(folder)
        if meta.get("created_at", 0.0) < start:
            continue
        if spec and meta.get("spec_path") and str(Path(meta["spec_path"]).resolve()) != spec:
            continue
        try:
            conn = connect(folder)
            reused = reused_ids(conn)
            ids = {row[0] for row in conn.execute("SELECT id FROM rollouts")}
            costs = conn.execute("SELECT rollout_id, COALESCE(SUM(cost_usd), 0), COALESCE(SUM(cost_usd IS NULL), 0) "
                                 "FROM calls GROUP BY rollout_id")
            usd = reused_usd = 0.0
            unpriced = 0
            for rollout_id, cost, missing in costs:
                if rollout_id in reused:
                    reused_usd += cost
                else:
                    usd += cost
                    unpriced += missing
            conn.close()
        except sqlite3.DatabaseError:
            continue
        # A call without a price has an unknown cost: the run's usd is then unknown (None), and priced_usd is what
        # is known to be spent at least. Rollouts reused from earlier runs were spent there, not again.
        runs.append({"run_id": folder.name, "kind": meta.get("kind"), "rollouts": len(ids - reused),
                     "usd": None if unpriced else round(usd, 6), "priced_usd": round(usd, 6),
                     "unpriced_calls": unpriced, "reused_rollouts": len(ids & reused),
                     "reused_usd": round(reused_usd, 6)})
    total_rollouts = sum(r["rollouts"] for r in runs)
    total_usd = sum(r["priced_usd"] for r in runs)
    unpriced_calls = sum(r["unpriced_calls"] for r in runs)
    over = (args.budget_usd is not None and total_usd >= args.budget_usd) or (
        args.budget_rollouts is not None and total_rollouts >= args.budget_rollouts)
    emit({
        "runs_dir": str(root), "runs": runs, "rollouts": total_rollouts,
        "usd": None if unpriced_calls else round(total_usd, 6), "priced_usd": round(total_usd, 6),
        "unpriced_calls": unpriced_calls, "reused_rollouts": sum(r["reused_rollouts"] for r in runs),
        "budget": {"usd": args.budget_usd, "rollouts": args.budget_rollouts},
        "left": {
            "usd": None if args.budget_usd is None else round(args.budget_usd - total_usd, 6),
            "rollouts": None if args.budget_rollouts is None else args.budget_rollouts - total_rollouts,
        },
        "over_budget": over,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
