"""Cost per task and, at the user's volume, cost per month: what eval, compare, optimize and the reports show.

Cost per task is the mean cost of a finished rollout with its 95% interval (a bootstrap over tasks, as
agl_cli.metrics.variant measures it). Cost per month is that times the tasks per month (agl_cli.spec.volume): the volume
is the user's figure, not a measurement, so the interval scales with it. An unpriced call makes both unknown —
`None`, shown as "—" with the count of unpriced calls — never $0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agl_cli.metrics.fmt import usd
from agl_cli.metrics.stats import Estimate
from agl_cli.metrics.variant import VariantMetrics
from agl_cli.spec.volume import Volume


def at_volume(per_task: Estimate, volume: Volume | None) -> Estimate | None:
    """Cost per month at `volume` (None without one; a mean of None, unknown, stays unknown)."""
    if volume is None:
        return None
    scale = volume.per_month
    mean = None if per_task.mean is None else per_task.mean * scale
    ci = None if per_task.ci95 is None or mean is None else (per_task.ci95[0] * scale, per_task.ci95[1] * scale)
    return Estimate(mean, ci, per_task.n)


def cost_fields(metrics: VariantMetrics, volume: Volume | None) -> dict[str, Any]:
    """The JSON fields of a variant's cost: `cost_usd_per_task` {mean, ci95, n} and `cost_usd_per_month` (the same
    at the volume, with `tasks_per_month`; null without a volume). A mean of null is unknown (unpriced calls)."""
    monthly = at_volume(metrics.cost_per_task, volume)
    return {
        "cost_usd_per_task": metrics.cost_per_task.as_dict(),
        "cost_usd_per_month": None if monthly is None or volume is None
        else {**monthly.as_dict(), "tasks_per_month": volume.per_month},
    }


def difference_at_volume(cost_per_task: Mapping[str, Any], volume: Volume | None) -> dict[str, Any] | None:
    """A paired `cost_usd_per_task` document (agl_cli.metrics.rollout_costs.paired_cost) per month: the difference
    and its interval, and each side's mean over the shared pairs, times the tasks per month; `decided` when the
    interval excludes zero. None without a volume; means of None when a side's cost is unknown."""
    if volume is None:
        return None
    diff = cost_per_task.get("difference") or {}
    mean, ci = diff.get("mean"), diff.get("ci95")
    scale = volume.per_month

    def scaled(value: Any) -> float | None:
        return None if value is None else float(value) * scale

    return {
        "mean": scaled(mean),
        "ci95": None if mean is None or not ci else [ci[0] * scale, ci[1] * scale],
        "decided": decided(ci) if mean is not None else False,
        "baseline_mean": scaled(cost_per_task.get("baseline_mean")),
        "candidate_mean": scaled(cost_per_task.get("candidate_mean")),
        "tasks_per_month": scale,
    }


def month_difference_text(doc: Mapping[str, Any] | None) -> str | None:
    """`cost/month +$15.20 [+$14.90, +$15.50] ($4.40 -> $19.60 at 40,000 tasks/month)` from a
    difference_at_volume document; None when there is nothing to say (no volume, or an unknown cost: the per-task
    text says why)."""
    if doc is None or doc.get("mean") is None:
        return None
    text = f"cost/month {usd(doc['mean'], doc['ci95'], signed=True)}"
    sides = ""
    if doc.get("baseline_mean") is not None and doc.get("candidate_mean") is not None:
        sides = f"{usd(doc['baseline_mean'])} -> {usd(doc['candidate_mean'])} "
    return text + f" ({sides}at {doc['tasks_per_month']:,.0f} tasks/month)"


def decided(ci95: Any) -> bool:
    """A paired difference of a continuous measure is decided when its 95% interval excludes zero."""
    return bool(ci95) and (ci95[0] > 0 or ci95[1] < 0)


def per_task_text(metrics: VariantMetrics) -> str:
    return usd(metrics.cost_per_task.mean, metrics.cost_per_task.ci95, unpriced_calls=metrics.unpriced_calls)


def per_month_text(metrics: VariantMetrics, volume: Volume | None) -> str:
    monthly = at_volume(metrics.cost_per_task, volume)
    if monthly is None:
        return "—"
    return usd(monthly.mean, monthly.ci95, unpriced_calls=metrics.unpriced_calls)


def month_column(volume: Volume) -> str:
    """The column heading of cost per month, naming the volume it assumes."""
    return f"cost/month at {volume.tasks:,.10g} tasks/{volume.per} [95% CI]"
