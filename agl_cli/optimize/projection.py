"""`agl optimize --dry-run`: how many rollouts, tokens, dollars and minutes a study would take, before it spends.

Per-rollout figures come from the store when earlier runs of the same agent version have finished rollouts
(nothing is spent), else from a small pilot: the baseline on the first few search tasks, in a study directory
left with status `dry_run`, so a later `--resume` or a re-run reuses those rollouts.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import mean
from typing import Any

from rich.console import Console

from agl_cli.evaluation.runner import make_plan
from agl_cli.optimize.cache import ResultCache
from agl_cli.optimize.racing import schedule
from agl_cli.optimize.study import Study
from agl_cli.runs.rundir import RunsIndex, read_stores
from rl_backend.store.records import CallTotals

MIN_HISTORY = 3


def history(runs_root: Path, version: str) -> list[dict[str, float | None]]:
    """Finished rollouts of any run with this agent version: cost (None: a call without a price), tokens and
    duration of each."""
    rows: list[dict[str, float | None]] = []
    # A damaged run teaches nothing about cost or time.
    for _, store in read_stores(RunsIndex.scan(runs_root).select(agent_version=version, with_store=True)):
        totals = store.call_totals_by_rollout()
        for r in store.rollouts(latest_only=True):
            if r.status.terminal and r.duration_s is not None:
                used = totals.get(r.id, CallTotals())
                rows.append({
                    "cost_usd": used.cost_usd, "duration_s": r.duration_s,
                    "input_tokens": float(used.input_tokens), "output_tokens": float(used.output_tokens),
                })
    return rows


def _per_rollout(rows: list[dict[str, float | None]]) -> dict[str, float | None] | None:
    """Mean per rollout; the cost is None (unknown) when any rollout's cost is."""
    if not rows:
        return None
    per: dict[str, float | None] = {}
    for key in ("cost_usd", "duration_s", "input_tokens", "output_tokens"):
        values = [r[key] for r in rows]
        per[key] = None if any(v is None for v in values) else mean(float(v or 0.0) for v in values)
    return per


def project(study: Study, rows: list[dict[str, float | None]], source: str, cached: int) -> dict[str, Any]:
    """The projection document: rollout counts per scenario and what they would cost."""
    v, s = len(study.variants), study.seeds
    n_search, n_confirm = len(study.search_tasks), len(study.confirm_tasks)
    confirm = 2 * n_confirm * s
    grid = v * n_search * s
    rounds = schedule(n_search, study.options.first_batch)
    first = rounds[0] if rounds else 0
    scenarios = {
        "grid": grid + confirm,
        "racing_at_least": v * first * s + confirm if study.strategy == "racing" else None,
        "racing_at_most": grid + confirm if study.strategy == "racing" else None,
        # reflect: at worst every proposal runs on every search task (the proposer's own calls come on top)
        "reflect_at_most": (v + study.spec.proposer.rounds) * n_search * s + confirm
        if study.strategy == "reflect" and study.spec.proposer is not None else None,
    }
    per = _per_rollout(rows)
    concurrency = study.spec.concurrency
    projected: dict[str, Any] = {}
    for name, count in scenarios.items():
        if count is None:
            continue
        to_run = max(0, count - cached)
        entry: dict[str, Any] = {"rollouts": count, "to_run": to_run}
        if per is not None:
            cost = per["cost_usd"]
            entry.update({
                "cost_usd": None if cost is None else to_run * cost,
                "input_tokens": round(to_run * (per["input_tokens"] or 0.0)),
                "output_tokens": round(to_run * (per["output_tokens"] or 0.0)),
                "time_s": math.ceil(to_run / concurrency) * (per["duration_s"] or 0.0),
            })
        projected[name] = entry
    budget = {"usd": study.spec.budget.run_usd(study.options.budget_usd),
              "rollouts": study.spec.budget.run_rollouts(study.options.max_rollouts)}
    return {
        "dry_run": True,
        "strategy": study.strategy,
        "variants": [{"name": x.name, "hash": x.hash} for x in study.variants],
        "tasks": {"search": n_search, "confirm": n_confirm, "racing_rounds": rounds if study.strategy == "racing" else None},
        "seeds": s,
        "concurrency": concurrency,
        "cached_rollouts": cached,
        "per_rollout": {"source": source, "n": len(rows), **(per or {})},
        "projected": projected,
        "budget": budget,
        "agent_version": study.agent_version,
    }


def cached_count(study: Study, runs_root: Path) -> int:
    """How many rollouts of the full grid and the baseline's confirmation the cache already holds."""
    # A pilot's own rollouts count: a new study reuses them.
    cache = ResultCache(runs_root, study.agent_version, reuse_failures=study.options.reuse_failures)
    plan = make_plan(study.variants, study.search_tasks, study.seeds) + make_plan(
        study.variants[:1], study.confirm_tasks, study.seeds)
    return sum(1 for item in plan if item.key in cache.entries)


def dry_run(study: Study, runs_root: Path, *, pilot: int, runs_dir: Path | None, quiet: bool,
            console: Console) -> dict[str, Any]:
    rows = history(runs_root, study.agent_version)
    source = "store" if len(rows) >= MIN_HISTORY else "none"
    pilot_study = None
    if len(rows) < MIN_HISTORY and pilot > 0:
        from agl_cli.optimize.execute import session
        from agl_cli.optimize.study import create

        create(study, runs_dir, status="dry_run")
        pilot_study = study.run.run_id
        console.print(f"dry run: no history for this agent version; a pilot of {pilot} baseline rollouts "
                      f"in study {pilot_study} (reused later)")
        with session(study, quiet=quiet, use_cache=True, console=console) as executor:
            executor.run([study.baseline], study.search_tasks[:pilot], label="pilot")
        rows = history(runs_root, study.agent_version)
        source = "pilot"
    doc = project(study, rows, source, cached_count(study, runs_root))
    doc["pilot_study"] = pilot_study
    return doc
