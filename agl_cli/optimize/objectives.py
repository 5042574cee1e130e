"""What a study optimizes, per variant (agl_cli.metrics): accuracy (max), cost per task and p95 latency (min), and
reliability pass^k (max: the share of tasks whose k seeds all passed). The Pareto front across the four, and the
choice under the user's constraints (`--max-cost-per-task`, `--max-p95-latency`).

A variant with an unpriced call has an unknown cost: it is never ranked as cheap. Two variants are compared on cost
only when both costs are known, and a cost constraint is not met by a cost nobody knows.
"""

from __future__ import annotations

from dataclasses import dataclass

from agl_cli.metrics.fmt import seconds, unpriced_text, usd
from agl_cli.metrics.variant import VariantMetrics


@dataclass(frozen=True)
class Constraints:
    max_cost_per_task: float | None = None
    max_p95_latency: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return {"max_cost_per_task": self.max_cost_per_task, "max_p95_latency_s": self.max_p95_latency}


def breach(metrics: VariantMetrics, constraints: Constraints) -> str | None:
    """Why a variant breaks a constraint (judged on what was measured so far), or None."""
    if constraints.max_cost_per_task is not None and metrics.unpriced_calls:
        return (f"cost per task unknown ({unpriced_text(metrics.unpriced_calls)}), so the limit of "
                f"${constraints.max_cost_per_task:g} cannot be checked: declare its model's price under `prices:`")
    if (
        constraints.max_cost_per_task is not None
        and metrics.cost_per_task.mean is not None
        and metrics.cost_per_task.mean > constraints.max_cost_per_task
    ):
        return f"cost per task {usd(metrics.cost_per_task.mean)} > ${constraints.max_cost_per_task:g}"
    if (
        constraints.max_p95_latency is not None
        and metrics.latency_p95 is not None
        and metrics.latency_p95 > constraints.max_p95_latency
    ):
        return f"p95 latency {seconds(metrics.latency_p95, digits=1)} > {constraints.max_p95_latency:g}s"
    return None


def _objectives(m: VariantMetrics) -> tuple[float, float | None, float, float]:
    # Everything as "larger is better"; a measure nobody has counts the same for all. An unknown cost (unpriced
    # calls) is None: nothing can be said about it, so it neither wins nor loses on cost.
    return (
        m.accuracy.mean if m.accuracy.mean is not None else float("-inf"),
        None if m.unpriced_calls else -(m.cost_per_task.mean or 0.0),
        -(m.latency_p95 or 0.0),
        m.pass_k.mean if m.pass_k.mean is not None else float("-inf"),
    )


def dominates(other: tuple[float | None, ...], mine: tuple[float | None, ...]) -> bool:
    """At least as good on every objective, and better on one. An objective unknown (None) on either side cannot be
    shown at least as good, so nothing dominates across it: a variant of unknown cost is never pushed off a front by
    a more accurate one (it may be far cheaper), nor pushes a cheaper one off (it may be far dearer)."""
    pairs = list(zip(other, mine, strict=True))
    if any(o is None or s is None for o, s in pairs):
        return False
    return all(o >= s for o, s in pairs) and any(o > s for o, s in pairs)  # type: ignore[operator]


def pareto_front(metrics: list[VariantMetrics]) -> list[str]:
    """Variants no other variant beats on one objective without losing on another."""
    points = {m.name: _objectives(m) for m in metrics if m.accuracy.mean is not None}
    return [name for name, mine in points.items()
            if not any(dominates(other, mine) for other_name, other in points.items() if other_name != name)]


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
                                        -(m.cost_per_task.mean or 0.0), -metrics.index(m)))
    return best.name, note
