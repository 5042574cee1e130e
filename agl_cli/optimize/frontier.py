"""The frontier a user chooses from: the configurations no other one beats on accuracy, cost and p95 latency at once,
priced at the user's volume (cost per task and per month, with intervals), each step between neighbours judged by
the paired rule, so the output says which differences are decided and which are not.

- the members: variants with a measured accuracy that no other variant dominates (at least as accurate, as cheap
  and as fast, and better on one); a variant of unknown cost is never dominated (it may be far cheaper) and
  dominates nothing (it may be far dearer), so it stays, its cost shown as unknown. With constraints, only variants
  that meet them (when any does);
- the ends: the most accurate member, and the cheapest good one: the cheapest member at least as accurate as the
  baseline (the setting kept so far), since a cheaper configuration that is worse than what the user has is no
  option they asked for;
- a choice: when the two ends differ, more accuracy costs more money (or time), and that trade is the user's to
  make: agl shows it, the coding agent puts it to the user.

Steps pair each member with the next cheaper one on the tasks both ran: the accuracy verdict (agl_cli.metrics.paired), the
cost and latency differences with their intervals, each marked `decided` or not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agl_cli.metrics.cost import cost_fields, decided, difference_at_volume
from agl_cli.metrics.fmt import points, seconds, usd
from agl_cli.metrics.paired import NO_DIFFERENCE, compare, difference
from agl_cli.metrics.rollout_costs import latencies
from agl_cli.metrics.run import costs_of, scores_of
from agl_cli.metrics.variant import VariantMetrics
from agl_cli.optimize.objectives import dominates
from agl_cli.spec.volume import Volume
from rl_backend.store.records import CallTotals, Rollout

MOST_ACCURATE = "most accurate"
CHEAPEST_GOOD = "cheapest good"


def _point(m: VariantMetrics) -> tuple[float | None, float | None, float | None]:
    """Accuracy, cost and p95 latency, each as "larger is better"; None where unknown."""
    cost = None if m.unpriced_calls or m.cost_per_task.mean is None else -m.cost_per_task.mean
    return (m.accuracy.mean, cost, None if m.latency_p95 is None else -m.latency_p95)


def members(metrics: list[VariantMetrics]) -> list[VariantMetrics]:
    """The non-dominated variants, most accurate first (ties: the cheaper, then the earlier)."""
    measured = [m for m in metrics if m.accuracy.mean is not None]
    points = {m.name: _point(m) for m in measured}
    front = [m for m in measured
             if not any(dominates(points[o.name], points[m.name]) for o in measured if o.name != m.name)]

    def rank(m: VariantMetrics) -> tuple[float, float, int]:
        cost = _point(m)[1]
        return (-(m.accuracy.mean or 0.0), -(cost if cost is not None else float("-inf")), metrics.index(m))

    return sorted(front, key=rank)


def ends(front: list[VariantMetrics], baseline: VariantMetrics | None) -> tuple[str | None, str | None]:
    """(most accurate, cheapest good): the cheapest member with a known cost at least as accurate as the baseline
    (any member, when the baseline has no accuracy)."""
    if not front:
        return None, None
    floor = baseline.accuracy.mean if baseline is not None else None
    good = [m for m in front if _point(m)[1] is not None
            and (floor is None or (m.accuracy.mean is not None and m.accuracy.mean >= floor))]
    cheapest = max(good, key=lambda m: (_point(m)[1], m.accuracy.mean), default=None)
    return front[0].name, cheapest.name if cheapest else None


def step(cheaper: list[Rollout], richer: list[Rollout], totals: Mapping[str, CallTotals],
         volume: Volume | None) -> dict[str, Any]:
    """The richer configuration against the cheaper one on the (task, seed) pairs both have: what the step buys
    and what it costs, each difference with its interval and whether it is decided."""
    accuracy = compare(scores_of(cheaper), scores_of(richer))
    a, b = costs_of(cheaper, totals), costs_of(richer, totals)
    cost = difference(a or {}, b or {}).as_dict() if a is not None and b is not None else None
    latency = difference(latencies(cheaper), latencies(richer)).as_dict()
    return {
        "n_tasks": accuracy.n_tasks,
        "accuracy": {**accuracy.as_dict(), "decided": accuracy.verdict != NO_DIFFERENCE},
        "cost_usd_per_task": None if cost is None else {**cost, "decided": decided(cost["difference"]["ci95"])},
        "cost_usd_per_month": None if cost is None else difference_at_volume(cost, volume),
        "latency_s": {**latency, "decided": decided(latency["difference"]["ci95"])},
    }


def member_doc(m: VariantMetrics, settings: Mapping[str, Any], volume: Volume | None) -> dict[str, Any]:
    return {
        "name": m.name, "knobs": dict(settings), "accuracy": m.accuracy.as_dict(), **cost_fields(m, volume),
        "unpriced_calls": m.unpriced_calls, "latency_p95_s": m.latency_p95, "ends": [],
    }


def frontier(metrics: list[VariantMetrics], rollouts: Mapping[str, list[Rollout]], totals: Mapping[str, CallTotals],
             *, baseline: str, settings: Mapping[str, Mapping[str, Any]], split: str, volume: Volume | None,
             feasible: set[str] | None = None) -> dict[str, Any]:
    """The frontier document of a study's search split (`feasible`: the variants that meet the constraints)."""
    pool = [m for m in metrics if m.name in feasible] if feasible else metrics
    front = members(pool)
    base = next((m for m in metrics if m.name == baseline), None)
    accurate, cheap = ends(front, base)
    docs = [member_doc(m, settings.get(m.name, {}), volume) for m in front]
    for doc in docs:
        doc["ends"] = [label for label, name in ((MOST_ACCURATE, accurate), (CHEAPEST_GOOD, cheap))
                       if doc["name"] == name]
    steps = [{"from": lower.name, "to": upper.name,
              **step(rollouts.get(lower.name, []), rollouts.get(upper.name, []), totals, volume)}
             for upper, lower in zip(front, front[1:], strict=False)]
    choice = accurate is not None and cheap is not None and accurate != cheap
    return {
        "split": split,
        "volume": volume.as_dict() if volume is not None else None,
        "objectives": ["accuracy", "cost per month" if volume is not None else "cost per task", "latency p95"],
        "members": docs,
        "steps": steps,
        "most_accurate": accurate,
        "cheapest_good": cheap,
        "choice": choice,
        # The two ends paired directly, on the search split, then (filled in by the engine) on held-out tasks.
        "ends": {"from": cheap, "to": accurate, "split": split,
                 **step(rollouts.get(cheap or "", []), rollouts.get(accurate or "", []), totals, volume)}
        if choice else None,
        "held_out": None,
    }


def held_out(doc: dict[str, Any], rollouts: Mapping[str, list[Rollout]], totals: Mapping[str, CallTotals], *,
             split: str, volume: Volume | None) -> dict[str, Any] | None:
    """The two ends of a frontier with a choice, paired on the held-out split, when both ran there."""
    cheap, accurate = doc.get("cheapest_good"), doc.get("most_accurate")
    if not doc.get("choice") or not rollouts.get(cheap or "") or not rollouts.get(accurate or ""):
        return None
    return {"from": cheap, "to": accurate, "split": split,
            **step(rollouts[cheap or ""], rollouts[accurate or ""], totals, volume)}


def _marked(text: str, is_decided: bool) -> str:
    return f"{text} ({'decided' if is_decided else 'undecided'})"


def step_text(doc: Mapping[str, Any]) -> str:
    """`+13.0 points [+5.0, +21.0] (decided), cost/month +$15.20 [...] (decided), p95 ... (undecided)`: what the
    step from `from` to `to` buys and costs, each difference marked decided or not."""
    acc = doc["accuracy"]
    parts = [_marked(points(acc["difference"]["mean"], acc["difference"]["ci95"]), acc["decided"])]
    monthly, per_task = doc.get("cost_usd_per_month"), doc.get("cost_usd_per_task")
    if monthly is not None and monthly["mean"] is not None:
        parts.append(_marked(f"cost/month {usd(monthly['mean'], monthly['ci95'], signed=True)}", monthly["decided"]))
    elif per_task is not None and per_task["difference"]["mean"] is not None:
        diff = per_task["difference"]
        parts.append(_marked(f"cost/task {usd(diff['mean'], diff['ci95'], signed=True)}", per_task["decided"]))
    else:
        parts.append("cost difference unknown (unpriced calls)")
    latency = doc["latency_s"]["difference"]
    if latency["mean"] is not None:
        parts.append(_marked(f"latency {seconds(latency['mean'], latency['ci95'], signed=True)}",
                             doc["latency_s"]["decided"]))
    return ", ".join(parts) + f" over {doc['n_tasks']} tasks"


def choice_message(doc: Mapping[str, Any]) -> str | None:
    """The sentence that hands the trade-off to the user; None when there is none."""
    if not doc.get("choice"):
        return None
    judged = doc.get("held_out") or doc.get("ends")
    if judged is None:
        return None
    where = f"on the held-out {judged['split']} split" if doc.get("held_out") else f"on {judged['split']} only"
    return (f"a choice for the user: {doc['most_accurate']} is the most accurate and {doc['cheapest_good']} the "
            f"cheapest good configuration; {where}, {doc['most_accurate']} vs {doc['cheapest_good']}: "
            f"{step_text(judged)}. Which is worth it depends on what the user values: put the frontier to them")
