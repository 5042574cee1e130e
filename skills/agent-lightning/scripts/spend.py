#!/usr/bin/env python3
"""What the optimization has spent so far against its budget: rollouts launched and model cost in USD, run by run
and together, and what is left. Check it before each new eval, compare or optimize, and stop at the budget.

By default it reads `agl.yaml` in the current folder (or the spec given): only that spec's runs, against its
`budget:`. With `budget: {usd: 1.0, scope: experiment}` the budget covers every run of the spec together, and
`left` is what the next run may still spend (agl stops a run there, and refuses one when nothing is left). With
`scope: run` (the default) each run has the budget of its own, so `left` is null: nothing is spent of it across
runs. `--budget-usd` / `--budget-rollouts` measure against ceilings of your own instead.

A rollout that a run reused from an earlier run (same agent, variant, task and seed: agl's result cache) was
paid for once, by the earlier run: it is listed as `reused_rollouts` / `reused_usd`, never counted as launched
or spent again.

Examples:
  spend.py                                   # ./agl.yaml's runs against its budget
  spend.py path/to/agl.yaml
  spend.py --all --budget-usd 5              # every run in the runs folder, against $5
  spend.py --since 2025-01-01T09:00
Prints JSON (the document of `agl spend --json`, which it runs, so agl must be on PATH); `over_budget` is true once
either ceiling is reached. Read only; standard library only. Exit 0 on success, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ inside an installed skill
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import agl, emit, fail, runs_dir_args  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec_file", nargs="?", metavar="SPEC", help="the agl.yaml whose runs and budget to read "
                        "(default: ./agl.yaml when there is one)")
    parser.add_argument("--spec", help="the same as SPEC")
    parser.add_argument("--all", action="store_true", help="every run in the runs folder, whatever its spec")
    parser.add_argument("--runs-dir", help="where runs live (default ./.agl/runs or $AGL_HOME/runs)")
    parser.add_argument("--since", help="only runs created at or after this time")
    parser.add_argument("--budget-usd", type=float, help="the ceiling on model cost, instead of the spec's")
    parser.add_argument("--budget-rollouts", type=int, help="the ceiling on rollouts launched, instead of the spec's")
    args = parser.parse_args(argv)

    if args.spec_file and args.spec and args.spec_file != args.spec:
        fail("give the spec once: as SPEC or as --spec")
    spec = args.spec_file or args.spec
    if spec and args.all:
        fail("--all reads every run whatever its spec: leave out SPEC, or --all")
    if spec is None and not args.all and Path("agl.yaml").is_file():
        spec = "agl.yaml"
    options = runs_dir_args(args.runs_dir)
    if spec:
        options.append(str(Path(spec).expanduser()))
    for flag, value in (("--since", args.since), ("--budget-usd", args.budget_usd),
                        ("--budget-rollouts", args.budget_rollouts)):
        if value is not None:
            options += [flag, str(value)]
    emit(agl("spend", *options))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
