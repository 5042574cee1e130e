"""What the runs of a runs folder spent, run by run (what `agl spend` shows), and `budget: {scope: experiment}`:
one ceiling for every run of a spec together.

Money is counted once, where it was spent: a rollout a run reused from an earlier one (the result cache) cost the
later run nothing (agl_cli/runs/run_spend.py), and calls that named no rollout (a proposer's) count for the run that
made them. With scope `experiment`, a run of the spec starts with what the spec's other runs left
(`BudgetSpec.count_others`): it stops there like at any ceiling, and is refused when nothing is left. Runs of one
such spec go one at a time, so that a run's remainder cannot be spent by another run at the same moment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agl_cli.errors import UsageError

if TYPE_CHECKING:
    from agl_cli.runs.rundir import IndexedRun, SkippedRun
    from agl_cli.spec.schema import ExperimentSpec
    from rl_backend.store.db import RunStore


def run_row(entry: IndexedRun, store: RunStore) -> dict[str, Any]:
    """One run's own spend. Calls that named no rollout were spent by this run too."""
    from agl_cli.runs.run_spend import run_spend

    spend = run_spend(store)
    stray = [g for g in store.model_calls() if g.rollout_id is None]
    priced = spend.priced_usd + sum(g.priced_usd for g in stray)
    unpriced = spend.unpriced_calls + sum(g.unpriced_calls for g in stray)
    return {"run_id": entry.run_id, "kind": entry.kind, "rollouts": spend.launched,
            "usd": None if unpriced else round(priced, 6), "priced_usd": round(priced, 6), "unpriced_calls": unpriced,
            "reused_rollouts": spend.reused, "reused_usd": round(float(spend.reused_usd), 6)}


@dataclass
class Spent:
    """What a set of runs spent together; `usd` is None (unknown) when any of their calls had no price."""

    root: Path
    runs: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[SkippedRun] = field(default_factory=list)

    @property
    def rollouts(self) -> int:
        return sum(int(r["rollouts"]) for r in self.runs)

    @property
    def priced_usd(self) -> float:
        return sum(float(r["priced_usd"]) for r in self.runs)

    @property
    def unpriced_calls(self) -> int:
        return sum(int(r["unpriced_calls"]) for r in self.runs)

    @property
    def usd(self) -> float | None:
        return None if self.unpriced_calls else round(self.priced_usd, 6)


def spent(runs_dir: Path | None, *, spec: Path | None = None, since: float = 0.0, exclude: Path | None = None) -> Spent:
    """The spend of the runs under `runs_dir` (of one spec, created since a time, one run left out)."""
    from agl_cli.runs.rundir import RunsIndex, read_stores

    index = RunsIndex.scan(runs_dir)
    chosen = [r for r in index.select(spec=spec, with_store=True, exclude=exclude) if r.created_at >= since]
    result = Spent(index.root, skipped=list(index.skipped))
    result.runs = [run_row(entry, store) for entry, store in read_stores(chosen, result.skipped)]
    return result


def _running_now(runs_dir: Path | None, spec_path: Path, exclude: Path | None) -> str | None:
    """'run X (process P)' for another run of this spec that a live process holds now, else None."""
    from agl_cli.runs.rundir import RunsIndex
    from rl_backend.store.runlock import lock_holder

    for entry in RunsIndex.scan(runs_dir).select(spec=spec_path, exclude=exclude):
        pid = lock_holder(entry.run.path)
        if pid is not None:
            return f"run {entry.run_id} (process {pid})" if pid else f"run {entry.run_id}"
    return None


def limit_to_experiment(spec: ExperimentSpec, spec_path: Path, runs_dir: Path | None, *, exclude: Path | None = None,
                        log: Callable[[str], None] | None = None, refuse: bool = True) -> Spent | None:
    """With `budget.scope: experiment`: charge what the spec's other runs spent against its ceilings, so that this
    run (`exclude`, when it exists already) gets what is left. Refuses (exit 2) when nothing is left, or while
    another run of the spec is running; `refuse=False` only measures (agl advise). None with scope `run`."""
    budget = spec.budget
    if budget.scope != "experiment" or (budget.usd is None and budget.rollouts is None):
        return None
    spec_path = spec_path.resolve()
    if refuse:
        busy = _running_now(runs_dir, spec_path, exclude)
        if busy:
            raise UsageError(
                f"{busy} of this spec is running now, and budget.scope is experiment: its runs go one at a time, so "
                "that together they stay within the budget",
                hint="wait for it to finish (or stop it), then run this again",
            )
    others = spent(runs_dir, spec=spec_path, exclude=exclude)
    budget.count_others(others.priced_usd, others.rollouts)
    usd_left, rollouts_left = budget.run_usd(), budget.run_rollouts()
    summary = describe(budget.usd, budget.rollouts, others)
    if refuse and (usd_left is not None and usd_left <= 0 or rollouts_left is not None and rollouts_left <= 0):
        raise UsageError(
            f"the experiment's budget is spent: {summary}",
            hint="`agl spend` with this agl.yaml lists the runs; raising budget.usd or budget.rollouts in agl.yaml "
                 "is the user's decision",
        )
    if log is not None:
        unpriced = (f"; {others.unpriced_calls} earlier calls had no price, so the experiment spent at least that"
                    if others.unpriced_calls else "")
        log(f"budget (scope: experiment): {summary}; this run stops at what is left{unpriced}")
    return others


def describe(usd: float | None, rollouts: int | None, others: Spent) -> str:
    """'$0.42 of $1.00 spent by 3 runs of this spec, $0.58 left; 120 of 2000 rollouts, 1880 left'."""
    from agl_cli.metrics.fmt import plural
    from agl_cli.metrics.fmt import usd as dollars

    parts = []
    if usd is not None:
        parts.append(f"{dollars(others.priced_usd)} of {dollars(usd)} spent by {plural(len(others.runs), 'run')} of "
                     f"this spec, {dollars(max(usd - others.priced_usd, 0.0))} left")
    if rollouts is not None:
        parts.append(f"{others.rollouts} of {rollouts} rollouts started, {max(rollouts - others.rollouts, 0)} left")
    return "; ".join(parts)
