"""Costs as summaries, reports, compare and optimize use them. A call without a price has an unknown cost, so a
rollout, a variant or a paired difference that includes one is unknown too: shown as "—" with the count of unpriced
calls (agl_cli.metrics.fmt.usd), left out of cost intervals, Pareto fronts and verdicts on cost, never added up as $0."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agl_cli.metrics.fmt import unpriced_text
from agl_cli.metrics.paired import PairKey, difference
from rl_backend.store.records import CallTotals, Rollout

NONE = CallTotals()


def totals_of(rollouts: Iterable[Rollout], totals: Mapping[str, CallTotals]) -> CallTotals:
    """What these rollouts' calls used, added up (a rollout without calls used nothing)."""
    return CallTotals.total(totals.get(r.id, NONE) for r in rollouts)


def rollout_costs(rollouts: Iterable[Rollout], totals: Mapping[str, CallTotals]) -> list[float] | None:
    """Each rollout's cost, or None when any of them has an unpriced call."""
    costs = []
    for r in rollouts:
        cost = totals.get(r.id, NONE).cost_usd
        if cost is None:
            return None
        costs.append(cost)
    return costs


def paired_cost(base: list[Rollout], candidate: list[Rollout], base_totals: Mapping[str, CallTotals],
                candidate_totals: Mapping[str, CallTotals]) -> dict[str, Any]:
    """Cost per task, candidate minus baseline, paired on (task, seed) — the `cost_usd_per_task` document of
    `agl compare`. When either side has an unpriced call there is no difference to compute: the document says how
    many calls on each side lack a price instead."""
    unpriced = {"baseline": totals_of(base, base_totals).unpriced_calls,
                "candidate": totals_of(candidate, candidate_totals).unpriced_calls}
    a, b = rollout_costs(base, base_totals), rollout_costs(candidate, candidate_totals)
    if a is None or b is None:
        doc = difference({}, {}).as_dict()
    else:
        doc = difference({(r.task_id, r.seed): c for r, c in zip(base, a, strict=True)},
                         {(r.task_id, r.seed): c for r, c in zip(candidate, b, strict=True)}).as_dict()
    doc["unpriced_calls"] = unpriced
    return doc


def latencies(rollouts: Iterable[Rollout]) -> dict[PairKey, float]:
    return {(r.task_id, r.seed): d for r in rollouts if (d := r.duration_s) is not None}


def cost_unknown_reason(doc: Mapping[str, Any]) -> str | None:
    """Why a `cost_usd_per_task` document has no difference (`candidate: 6 unpriced calls`); None if it has one."""
    unpriced = doc.get("unpriced_calls") or {}
    sides = [f"{side}: {unpriced_text(n)}" for side, n in unpriced.items() if n]
    return ", ".join(sides) if sides else None
