"""Paired figures for reports, on agl_cli.metrics.paired: each candidate against the baseline on shared (task, seed)
pairs, the winner, and the tasks whose outcome flipped between the two.

The comparison documents have the shape `agl compare --json` prints per candidate, so the report and the
command never disagree about a verdict.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agl_cli.metrics.cost import difference_at_volume
from agl_cli.metrics.paired import BETTER, compare_many, difference
from agl_cli.metrics.rollout_costs import latencies, paired_cost
from agl_cli.metrics.run import scores_of
from agl_cli.metrics.variant import VariantMetrics
from agl_cli.spec.volume import Volume
from rl_backend.rewards import passed
from rl_backend.store.records import CallTotals, Rollout


def paired_docs(baseline: list[Rollout], candidates: Mapping[str, list[Rollout]],
                totals: Mapping[str, CallTotals], volume: Volume | None = None) -> dict[str, dict[str, Any]]:
    """Each candidate vs the baseline (Holm-adjusted when several): accuracy verdict plus cost (per task, and per
    month at the volume) and latency differences, as `agl compare` reports them."""
    base = [r for r in baseline if r.status.terminal]
    mine = {name: [r for r in rollouts if r.status.terminal] for name, rollouts in candidates.items()}
    results = compare_many(scores_of(base), {name: scores_of(rs) for name, rs in mine.items()})
    docs = {}
    for name, rollouts in mine.items():
        cost = paired_cost(base, rollouts, totals, totals)
        docs[name] = {
            "candidate": name, **results[name].as_dict(),
            "cost_usd_per_task": cost, "cost_usd_per_month": difference_at_volume(cost, volume),
            "latency_s": difference(latencies(base), latencies(rollouts)).as_dict(),
        }
    return docs


def choose_winner(rows: Sequence[VariantMetrics], docs: Mapping[str, dict[str, Any]]) -> str | None:
    """The most accurate candidate judged better than the baseline; if none is, the most accurate candidate
    (the verdict then says no detectable difference). Ties go to the cheaper."""
    measured = [r for r in rows if r.name in docs and r.accuracy.mean is not None]
    if not measured:
        return None
    better = [r for r in measured if docs[r.name]["verdict"] == BETTER]

    def rank(r: VariantMetrics) -> tuple[float, float]:
        cost = r.cost_per_task.mean
        return (r.accuracy.mean or 0.0, float("-inf") if cost is None else -cost)

    return max(better or measured, key=rank).name


@dataclass
class Flip:
    """A task whose mean reward differs between the baseline and the winner, over the seeds both scored."""

    task_id: str
    baseline_mean: float
    winner_mean: float
    baseline_passed: int  # seeds whose reward passed (rl_backend.rewards)
    winner_passed: int
    seeds: list[int]
    baseline_ids: list[str] = field(default_factory=list)
    winner_ids: list[str] = field(default_factory=list)

    @property
    def direction(self) -> str:
        return "gained" if self.winner_mean > self.baseline_mean else "lost"


def flips(baseline: list[Rollout], winner: list[Rollout], pass_threshold: float) -> list[Flip]:
    """Gained tasks first, then lost ones, each by the size of the change."""
    def by_task(rollouts: list[Rollout]) -> dict[str, dict[int, Rollout]]:
        grouped: dict[str, dict[int, Rollout]] = defaultdict(dict)
        for r in rollouts:
            if r.reward is not None:
                grouped[r.task_id][r.seed] = r
        return grouped

    a, b = by_task(baseline), by_task(winner)
    result = []
    for task in sorted(set(a) & set(b)):
        seeds = sorted(set(a[task]) & set(b[task]))
        ra = [a[task][s] for s in seeds]
        rb = [b[task][s] for s in seeds]
        mean_a = sum(float(r.reward or 0.0) for r in ra) / len(seeds)
        mean_b = sum(float(r.reward or 0.0) for r in rb) / len(seeds)
        if abs(mean_a - mean_b) < 1e-12:
            continue
        result.append(Flip(
            task_id=task, baseline_mean=mean_a, winner_mean=mean_b,
            baseline_passed=sum(1 for r in ra if passed(r.reward or 0.0, pass_threshold)),
            winner_passed=sum(1 for r in rb if passed(r.reward or 0.0, pass_threshold)),
            seeds=seeds, baseline_ids=[r.id for r in ra], winner_ids=[r.id for r in rb],
        ))
    result.sort(key=lambda f: (f.direction != "gained", -abs(f.winner_mean - f.baseline_mean), f.task_id))
    return result
