"""What a study optimizes, per variant: accuracy (max), cost per task and p95 latency (min), and reliability
pass^k (max: the share of tasks whose k seeds were all right). The Pareto front across the four, and the choice
under the user's constraints (`--max-cost-per-task`, `--max-p95-latency`).

A rollout counts as "right" for pass^k when its reward is at least 0.5 (rewards are scores in [0, 1]).

A variant with an unpriced call has an unknown cost: it is never ranked as cheap. Two variants are compared on cost
only when both costs are known, and a cost constraint is not met by a cost nobody knows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agl_cli.costs import rollout_costs, totals_of, unpriced_text
from agl_cli.paired import PairKey
from agl_cli.stats import Estimate, bootstrap_mean, percentile
from rl_backend.store.db import RunStore
from rl_backend.store.records import CallTotals, Rollout

PASS_THRESHOLD = 0.5


@dataclass(frozen=True)
class Constraints:
    max_cost_per_task: float | None = None
    max_p95_latency: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return {"max_cost_per_task": self.max_cost_per_task, "max_p95_latency_s": self.max_p95_latency}


@dataclass
class VariantMetrics:
    name: str
    n_tasks: int
    rollouts: int
    accuracy: Estimate
    cost_per_task: float | None  # None: no rollout, or a call without a price (unpriced_calls says how many)
    latency_p95: float | None
    pass_k: float | None
    k: int
    pass_k_tasks: int
    input_tokens: int
    output_tokens: int
    unpriced_calls: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "n_tasks": self.n_tasks, "rollouts": self.rollouts,
            "accuracy": self.accuracy.as_dict(), "cost_per_task_usd": self.cost_per_task,
            "unpriced_calls": self.unpriced_calls,
            "latency_p95_s": self.latency_p95,
            "pass_k": {"k": self.k, "mean": self.pass_k, "n_tasks": self.pass_k_tasks},
            "tokens": {"input": self.input_tokens, "output": self.output_tokens},
        }


def latest_by_variant(store: RunStore, split: str | None = None, tasks: set[str] | None = None) -> dict[str, list[Rollout]]:
    """The newest finished attempt of every key, grouped by variant name, optionally of one split / task set."""
    grouped: dict[str, list[Rollout]] = defaultdict(list)
    for rollout in store.rollouts(latest_only=True):
        if not rollout.status.terminal:
            continue
        if split is not None and rollout.split != split:
            continue
        if tasks is not None and rollout.task_id not in tasks:
            continue
        grouped[rollout.variant].append(rollout)
    return grouped


def scores_of(rollouts: list[Rollout]) -> dict[PairKey, float]:
    """Rewards by (task, seed); a rollout without a reward is left out (missing, never a 0)."""
    return {(r.task_id, r.seed): float(r.reward) for r in rollouts if r.reward is not None}


def measure(name: str, rollouts: list[Rollout], totals: Mapping[str, CallTotals], k: int) -> VariantMetrics:
    scored = [r for r in rollouts if r.reward is not None]
    durations = [d for r in rollouts if (d := r.duration_s) is not None]
    costs = rollout_costs(rollouts, totals)
    used = totals_of(rollouts, totals)
    by_task: dict[str, list[float]] = defaultdict(list)
    for r in scored:
        by_task[r.task_id].append(float(r.reward))  # type: ignore[arg-type]
    complete = [values for values in by_task.values() if len(values) >= k]
    passed = sum(1 for values in complete if all(v >= PASS_THRESHOLD for v in values))
    return VariantMetrics(
        name=name,
        n_tasks=len({r.task_id for r in rollouts}),
        rollouts=len(rollouts),
        accuracy=bootstrap_mean([float(r.reward) for r in scored], [r.task_id for r in scored]),  # type: ignore[arg-type]
        cost_per_task=sum(costs) / len(costs) if costs else None,  # None also when costs is None (unknown)
        latency_p95=percentile(durations, 95),
        pass_k=passed / len(complete) if complete else None,
        k=k,
        pass_k_tasks=len(complete),
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        unpriced_calls=used.unpriced_calls,
    )


def breach(metrics: VariantMetrics, constraints: Constraints) -> str | None:
    """Why a variant breaks a constraint (judged on what was measured so far), or None."""
    if constraints.max_cost_per_task is not None and metrics.unpriced_calls:
        return (f"cost per task unknown ({unpriced_text(metrics.unpriced_calls)}), so the limit of "
                f"${constraints.max_cost_per_task:g} cannot be checked: declare its model's price under `prices:`")
    if (
        constraints.max_cost_per_task is not None
        and metrics.cost_per_task is not None
        and metrics.cost_per_task > constraints.max_cost_per_task
    ):
        return f"cost per task ${metrics.cost_per_task:.4f} > ${constraints.max_cost_per_task:g}"
    if (
        constraints.max_p95_latency is not None
        and metrics.latency_p95 is not None
        and metrics.latency_p95 > constraints.max_p95_latency
    ):
        return f"p95 latency {metrics.latency_p95:.1f}s > {constraints.max_p95_latency:g}s"
    return None


def _objectives(m: VariantMetrics) -> tuple[float, float | None, float, float]:
    # Everything as "larger is better"; a measure nobody has counts the same for all. An unknown cost (unpriced
    # calls) is None: it is compared with nothing, so it neither wins nor loses on cost.
    return (
        m.accuracy.mean if m.accuracy.mean is not None else float("-inf"),
        None if m.unpriced_calls else -(m.cost_per_task or 0.0),
        -(m.latency_p95 or 0.0),
        m.pass_k if m.pass_k is not None else float("-inf"),
    )


def _dominates(other: tuple[float | None, ...], mine: tuple[float | None, ...]) -> bool:
    """At least as good on every objective both have, and better on one."""
    pairs = [(o, s) for o, s in zip(other, mine, strict=True) if o is not None and s is not None]
    return all(o >= s for o, s in pairs) and any(o > s for o, s in pairs)


def pareto_front(metrics: list[VariantMetrics]) -> list[str]:
    """Variants no other variant beats on one objective without losing on another."""
    points = {m.name: _objectives(m) for m in metrics if m.accuracy.mean is not None}
    return [name for name, mine in points.items()
            if not any(_dominates(other, mine) for other_name, other in points.items() if other_name != name)]


def choose(metrics: list[VariantMetrics], constraints: Constraints) -> tuple[str | None, str | None]:
    """The most accurate variant that meets the constraints (ties: cheaper, then earlier); with a note when none
    does (then the most accurate of all is named, so the report can still say what came closest)."""
    measured = [m for m in metrics if m.accuracy.mean is not None]
    if not measured:
        return None, "no variant has a scored rollout"
    feasible = [m for m in measured if breach(m, constraints) is None]
    note = None
    if not feasible:
        feasible, note = measured, "no variant meets the constraints; the most accurate is named"
    # Ties go to the cheaper; an unknown cost is never the cheaper one.
    best = max(feasible, key=lambda m: (m.accuracy.mean, float("-inf") if m.unpriced_calls else
                                        -(m.cost_per_task or 0.0), -metrics.index(m)))
    return best.name, note
