"""`agl spend`: what the runs in the runs folder have spent, together and run by run, against a budget: rollouts
launched and the USD cost of model calls. A rollout a run reused from an earlier one (the result cache) was paid for
once, by the earlier run: it is counted apart (`reused_rollouts`, `reused_usd`), never launched or spent again.
A call without a price makes a cost unknown (`usd` is then null, and `priced_usd` what is known to be spent at least).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors

if TYPE_CHECKING:
    from agl_cli.rundir import IndexedRun
    from rl_backend.store.db import RunStore

_TIME_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d")


def since_epoch(text: str | None) -> float:
    """Seconds since the epoch, or a local time like 2025-01-31T09:30."""
    from agl_cli.errors import UsageError

    if not text:
        return 0.0
    try:
        return float(text)
    except ValueError:
        pass
    for fmt in _TIME_FORMATS:
        try:
            return time.mktime(time.strptime(text, fmt))
        except ValueError:
            continue
    raise UsageError(f"--since {text!r}: give seconds since the epoch or a local time like 2025-01-31T09:30")


def run_row(entry: IndexedRun, store: RunStore) -> dict[str, Any]:
    """One run's spend. Calls that named no rollout were spent by this run too."""
    from agl_cli.run_spend import run_spend

    spend = run_spend(store)
    stray = [g for g in store.model_calls() if g.rollout_id is None]
    priced = spend.priced_usd + sum(g.priced_usd for g in stray)
    unpriced = spend.unpriced_calls + sum(g.unpriced_calls for g in stray)
    return {"run_id": entry.run_id, "kind": entry.kind, "rollouts": spend.launched,
            "usd": None if unpriced else round(priced, 6), "priced_usd": round(priced, 6), "unpriced_calls": unpriced,
            "reused_rollouts": spend.reused, "reused_usd": round(float(spend.reused_usd), 6)}


@handle_errors
def spend_command(
    since: Annotated[Optional[str], typer.Option(help="Only runs created at or after this time: seconds since the epoch, or a local time like 2025-01-31T09:30.")] = None,  # noqa: UP045,E501
    spec: Annotated[Optional[Path], typer.Option(help="Only runs of this agl.yaml.")] = None,  # noqa: UP045
    budget_usd: Annotated[Optional[float], typer.Option(help="The ceiling on model cost, in USD.")] = None,  # noqa: UP045
    budget_rollouts: Annotated[Optional[int], typer.Option(help="The ceiling on rollouts launched.")] = None,  # noqa: UP045
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where runs live (default .agl/runs or $AGL_HOME/runs).")] = None,  # noqa: UP045,E501
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """What has been spent across runs (rollouts launched, model cost in USD) and what is left of a budget;
    `over_budget` once either ceiling is reached. Check it before each new eval, compare or optimize."""
    from agl_cli.console import print_json, print_rows, stderr_console
    from agl_cli.metrics.fmt import usd
    from agl_cli.rundir import RunsIndex, SkippedRun, read_stores

    start = since_epoch(since)
    index = RunsIndex.scan(runs_dir)
    chosen = [r for r in index.select(spec=spec, with_store=True) if r.created_at >= start]
    skipped: list[SkippedRun] = list(index.skipped)
    runs = [run_row(entry, store) for entry, store in read_stores(chosen, skipped)]
    rollouts = sum(r["rollouts"] for r in runs)
    priced = sum(r["priced_usd"] for r in runs)
    unpriced = sum(r["unpriced_calls"] for r in runs)
    over = (budget_usd is not None and priced >= budget_usd) or (
        budget_rollouts is not None and rollouts >= budget_rollouts)
    doc = {
        "runs_dir": str(index.root), "runs": runs, "rollouts": rollouts,
        "usd": None if unpriced else round(priced, 6), "priced_usd": round(priced, 6), "unpriced_calls": unpriced,
        "reused_rollouts": sum(r["reused_rollouts"] for r in runs),
        "budget": {"usd": budget_usd, "rollouts": budget_rollouts},
        "left": {"usd": None if budget_usd is None else round(budget_usd - priced, 6),
                 "rollouts": None if budget_rollouts is None else budget_rollouts - rollouts},
        "over_budget": over,
        "skipped": [{"run_dir": str(s.path), "reason": s.reason} for s in skipped],
    }
    if json_output:
        print_json(doc)
        return
    out = print_rows(f"spend of the runs in {index.root}",
                     ("run", "kind", "rollouts", "usd", "reused rollouts", "reused usd"),
                     [(r["run_id"], r["kind"] or "", str(r["rollouts"]), usd(r["usd"], unpriced_calls=r["unpriced_calls"]),
                       str(r["reused_rollouts"]), usd(r["reused_usd"])) for r in runs])
    total = f"total: {rollouts} rollouts launched, {usd(doc['usd'], unpriced_calls=unpriced)}"
    left = doc["left"]
    if left["usd"] is not None or left["rollouts"] is not None:
        parts = [usd(left["usd"]) if left["usd"] >= 0 else f"none ({usd(-left['usd'])} over)"] \
            if left["usd"] is not None else []
        parts += [f"{max(left['rollouts'], 0)} rollouts"] if left["rollouts"] is not None else []
        total += f"; left of the budget: {', '.join(parts)}" + (" (over budget: stop here)" if over else "")
    out.print(total, markup=False)
    for s in skipped:
        stderr_console().print(f"skipped {s.path.name}: {s.reason}", markup=False)
