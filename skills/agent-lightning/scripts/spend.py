#!/usr/bin/env python3
"""What the optimization has spent so far, across every run in the runs folder, against a budget: rollouts
launched and model cost in USD. Check it before each new eval, compare or optimize, and stop at the budget.

A rollout that a run reused from an earlier run (same agent, variant, task and seed: agl's result cache) was
paid for once, by the earlier run: it is listed as `reused_rollouts` / `reused_usd`, never counted as launched
or spent again.

Examples:
  spend.py --budget-usd 5 --budget-rollouts 2000          # the budget from agl.yaml's `budget:`
  spend.py --since 2025-01-01T09:00 --spec agl.yaml
Prints JSON (the document of `agl spend --json`, which it runs, so agl must be on PATH); `over_budget` is true once
either ceiling is reached. Read only; standard library only. Exit 0 on success, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ inside an installed skill
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import agl, emit, runs_dir_args  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", help="where runs live (default ./.agl/runs or $AGL_HOME/runs)")
    parser.add_argument("--since", help="only runs created at or after this time")
    parser.add_argument("--spec", help="only runs of this agl.yaml")
    parser.add_argument("--budget-usd", type=float, help="the ceiling on model cost")
    parser.add_argument("--budget-rollouts", type=int, help="the ceiling on rollouts launched")
    args = parser.parse_args(argv)

    options = runs_dir_args(args.runs_dir)
    for flag, value in (("--since", args.since), ("--spec", args.spec), ("--budget-usd", args.budget_usd),
                        ("--budget-rollouts", args.budget_rollouts)):
        if value is not None:
            options += [flag, str(Path(value).expanduser()) if flag == "--spec" else str(value)]
    emit(agl("spend", *options))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
