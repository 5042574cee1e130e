"""Racing: every surviving variant runs on a growing prefix of the (shuffled) search tasks; after each round the
variants clearly worse than a variant that costs no more are dropped; it ends at one survivor, at the end of the
tasks, or at the budget.

Each variant is judged against one reference: the most accurate variant that is not decidedly more expensive than
it (its paired cost interval does not lie above zero; a cost nobody knows is no evidence of being cheaper). When
costs are equal or unknown that is the leader, the most accurate of all. A variant decidedly cheaper than every
variant that beats it stays: it may be the cheap end of the frontier the user chooses from
(agl_cli.optimize.frontier), and dropping it would hide that choice.

Why the drop rule keeps the best variant: the best is lost only if its one paired test against its reference says
`worse` in some round. Each such test runs at alpha / (planned rounds), so over the whole race that happens with
probability at most alpha (a union bound over rounds). No correction across the variants of one round is needed:
dropping a variant that is not the best costs nothing but its own chance.

Pure logic over two callbacks (run a batch, read the scores), so the CLI and the benchmark share it. Decisions
depend only on the rewards of the round's tasks, so replaying a finished race over a store that already holds
everything (a resume) takes the same decisions without running anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agl_cli.metrics.paired import ALPHA, WORSE, PairKey, compare, difference

Scores = Mapping[str, Mapping[PairKey, float]]
Costs = Mapping[str, Mapping[PairKey, float] | None]  # per variant, cost by (task, seed); None: unknown
GROWTH = 1.5  # finer than doubling: a race stops closer to the point where it is decided (bench/optimize)


def schedule(n_tasks: int, first: int | None = None, growth: float = GROWTH) -> list[int]:
    """Cumulative task counts per round: a first batch (a sixteenth of the tasks, at least 8), then growing."""
    if n_tasks <= 0:
        return []
    start = min(n_tasks, first if first is not None else max(8, math.ceil(n_tasks / 16)))
    counts = [max(1, start)]
    while counts[-1] < n_tasks:
        counts.append(min(n_tasks, max(counts[-1] + 1, math.ceil(counts[-1] * growth))))
    return counts


def restrict(values: Mapping[PairKey, float], tasks: set[str]) -> dict[PairKey, float]:
    return {key: value for key, value in values.items() if key[0] in tasks}


def mean_score(values: Mapping[PairKey, float]) -> float:
    return sum(values.values()) / len(values) if values else -math.inf


@dataclass
class Drop:
    variant: str
    reason: str  # "worse" (than the leader, by the paired rule) or "infeasible" (breaks a constraint)
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "reason": self.reason, **self.detail}


@dataclass
class Round:
    index: int
    tasks: int
    alpha: float
    leader: str
    survivors: list[str]
    dropped: list[Drop]
    partial: bool = False  # the budget stopped it before every rollout of the round ran

    def as_dict(self) -> dict[str, Any]:
        return {
            "round": self.index, "tasks": self.tasks, "alpha": self.alpha, "leader": self.leader,
            "survivors": self.survivors, "dropped": [d.as_dict() for d in self.dropped], "partial": self.partial,
        }


def _costlier(costs: Costs, reference: str, variant: str, tasks: set[str]) -> bool:
    """The reference is decidedly more expensive than the variant on these tasks (both costs known)."""
    mine, theirs = costs.get(variant), costs.get(reference)
    if mine is None or theirs is None:
        return False
    ci = difference(restrict(mine, tasks), restrict(theirs, tasks)).ci95
    return ci is not None and ci[0] > 0


def reference_for(variant: str, ranked: list[str], costs: Costs | None, tasks: set[str]) -> str | None:
    """The variant's reference: the most accurate other variant (`ranked`: most accurate first) that is not decidedly
    more expensive than it; None when every variant above it is (it stays)."""
    above = ranked[: ranked.index(variant)]
    if costs is None:
        return above[0] if above else None
    return next((other for other in above if not _costlier(costs, other, variant, tasks)), None)


def decide_round(
    scores: Scores,
    survivors: list[str],
    tasks: set[str],
    *,
    alpha: float,
    index: int = 1,
    infeasible: Mapping[str, str] | None = None,
    costs: Costs | None = None,
) -> Round:
    """Drop the variants that break a constraint, then those the paired rule calls worse than their reference (the
    most accurate variant that is not decidedly more expensive; without `costs`, the leader)."""
    infeasible = infeasible or {}
    dropped = [Drop(v, "infeasible", {"why": infeasible[v]}) for v in survivors if v in infeasible]
    racing = [v for v in survivors if v not in infeasible]
    if not racing:
        # Nothing meets the constraints: keep racing on accuracy so the report can still say what came closest.
        racing, dropped = list(survivors), []
    mine = {v: restrict(scores.get(v, {}), tasks) for v in racing}
    # Most accurate first; ties: the earlier one (the baseline comes first).
    ranked = sorted(racing, key=lambda v: (-mean_score(mine[v]), racing.index(v)))
    leader = ranked[0]
    kept = [leader]
    for variant in racing:
        if variant == leader:
            continue
        reference = reference_for(variant, ranked, costs, tasks)
        result = compare(mine[reference], mine[variant], alpha=alpha, interval=False) if reference else None
        if result is not None and result.verdict == WORSE:
            dropped.append(Drop(variant, "worse", {
                "against": reference, "difference": result.difference, "ci95": result.ci95,
                "p_value": result.p_value, "n_tasks": result.n_tasks,
            }))
        else:
            kept.append(variant)
    order = {v: i for i, v in enumerate(survivors)}
    return Round(index, len(tasks), alpha, leader, sorted(kept, key=order.__getitem__), dropped)


@dataclass
class RaceResult:
    survivors: list[str]
    rounds: list[Round]
    stopped_for_budget: bool
    tasks_used: int


def race(
    variants: list[str],
    task_order: list[str],
    run_batch: Callable[[list[str], list[str]], bool],
    read_scores: Callable[[], Scores],
    *,
    alpha: float = ALPHA,
    first: int | None = None,
    growth: float = GROWTH,
    infeasible: Callable[[list[str], set[str]], Mapping[str, str]] | None = None,
    on_round: Callable[[Round], None] | None = None,
    read_costs: Callable[[], Costs] | None = None,
) -> RaceResult:
    """Run the race. `run_batch(variants, tasks)` runs what is missing and returns False when the budget stopped it;
    `read_scores()` gives every variant's rewards by (task, seed); `infeasible(survivors, tasks)` names constraint
    breakers with the reason; `read_costs()` every variant's cost by (task, seed) (None: unknown), so that a variant
    decidedly cheaper than all that beat it stays in the race."""
    counts = schedule(len(task_order), first, growth)
    alpha_round = alpha / max(1, len(counts))
    survivors = list(variants)
    rounds: list[Round] = []
    stopped = False
    used = 0
    for index, count in enumerate(counts, start=1):
        used = count
        tasks = task_order[:count]
        completed = run_batch(survivors, tasks)
        task_set = set(tasks)
        breakers = infeasible(survivors, task_set) if infeasible else {}
        decision = decide_round(read_scores(), survivors, task_set, alpha=alpha_round, index=index, infeasible=breakers,
                                costs=read_costs() if read_costs else None)
        decision.partial = not completed
        rounds.append(decision)
        if on_round:
            on_round(decision)
        survivors = decision.survivors
        if not completed:
            stopped = True
            break
        if len(survivors) == 1:
            break
    return RaceResult(survivors, rounds, stopped, used)
