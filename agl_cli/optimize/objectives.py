"""What a study optimizes, per variant: accuracy (max), cost per task and p95 latency (min), and reliability
pass^k (max: the share of tasks whose k seeds were all right). The Pareto front across the four, and the choice
under the user's constraints (`--max-cost-per-task`, `--max-p95-latency`).

A rollout counts as "right" for pass^k when its reward is at least 0.5 (rewards are scores in [0, 1]).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from agl_cli.paired import PairKey
from agl_cli.stats import Estimate, bootstrap_mean, percentile
from rl_backend.store.db import RunStore
from rl_backend.store.records import Rollout

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
    cost_per_task: float | None
    latency_p95: float | None
    pass_k: float | None
    k: int
    pass_k_tasks: int
    input_tokens: int
    output_tokens: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "n_tasks": self.n_tasks, "rollouts": self.rollouts,
            "accuracy": self.accuracy.as_dict(), "cost_per_task_usd": self.cost_per_task,
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


def measure(name: str, rollouts: list[Rollout], totals: dict[str, dict[str, float]], k: int) -> VariantMetrics:
    scored = [r for r in rollouts if r.reward is not None]
    durations = [d for r in rollouts if (d := r.duration_s) is not None]
    costs = [float(totals.get(r.id, {}).get("cost_usd", 0.0)) for r in rollouts]
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
        cost_per_task=sum(costs) / len(costs) if costs else None,
        latency_p95=percentile(durations, 95),
        pass_k=passed / len(complete) if complete else None,
        k=k,
        pass_k_tasks=len(complete),
        input_tokens=int(sum(totals.get(r.id, {}).get("input_tokens", 0) for r in rollouts)),
        output_tokens=int(sum(totals.get(r.id, {}).get("output_tokens", 0) for r in rollouts)),
    )


def breach(metrics: VariantMetrics, constraints: Constraints) -> str | None:
    """Why a variant breaks a constraint (judged on what was measured so far), or None."""
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


def _objectives(m: VariantMetrics) -> tuple[float, float, float, float]:
    # Everything as "larger is better"; a measure nobody has counts the same for all.
    return (
        m.accuracy.mean if m.accuracy.mean is not None else float("-inf"),
        -(m.cost_per_task or 0.0),
        -(m.latency_p95 or 0.0),
        m.pass_k if m.pass_k is not None else float("-inf"),
    )


def pareto_front(metrics: list[VariantMetrics]) -> list[str]:
    """Variants no other variant beats on one objective without losing on another."""
    points = {m.name: _objectives(m) for m in metrics if m.accuracy.mean is not None}
    front = []
    for name, mine in points.items():
        dominated = any(
            all(o >= s for o, s in zip(other, mine, strict=True)) and other != mine
            for other_name, other in points.items()
            if other_name != name
        )
        if not dominated:
            front.append(name)
    return front


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
    best = max(feasible, key=lambda m: (m.accuracy.mean, -(m.cost_per_task or 0.0), -metrics.index(m)))
    return best.name, note
