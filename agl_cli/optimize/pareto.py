"""The per-task Pareto front of the `reflect` strategy, and the seeded choice of the next parent from it.

As GEPA does: a candidate is on the front when it is best (ties included) on at least one search task and no other
candidate is at least as good on every task and better on one. Keeping every such candidate, rather than only the
best on average, keeps prompts that solve different tasks alive, so reflection does not collapse onto one line of
edits. Parents are drawn from the front with weight = the number of tasks each is best on.

Pure functions over per-task scores; the search (reflect.py) reads them from the store.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agl_cli.metrics.paired import PairKey

TaskScores = Mapping[str, float]  # task id -> mean reward over its seeds
_EPS = 1e-12


def task_means(scores: Mapping[PairKey, float]) -> dict[str, float]:
    """Rewards by (task, seed) to one number per task: the mean over the seeds that have a reward."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for (task, _seed), value in scores.items():
        sums[task] += value
        counts[task] += 1
    return {task: sums[task] / counts[task] for task in sums}


def dominates(a: TaskScores, b: TaskScores) -> bool:
    """a is at least as good as b on every task either has, and better on one (a task one lacks counts as -inf)."""
    tasks = set(a) | set(b)
    low = float("-inf")
    at_least = all(a.get(t, low) >= b.get(t, low) - _EPS for t in tasks)
    better = any(a.get(t, low) > b.get(t, low) + _EPS for t in tasks)
    return at_least and better


@dataclass
class Front:
    members: list[str]  # in the candidates' order
    wins: dict[str, int]  # candidate -> tasks it is best on (ties count for each tied candidate)

    def as_list(self) -> list[dict[str, Any]]:
        return [{"name": name, "tasks_best": self.wins[name]} for name in self.members]


def pareto_front(candidates: Mapping[str, TaskScores]) -> Front:
    """The front over the tasks any candidate has; a candidate with no scored task is never on it."""
    names = [name for name, scores in candidates.items() if scores]
    tasks = {t for name in names for t in candidates[name]}
    wins = dict.fromkeys(names, 0)
    for task in tasks:
        best = max(candidates[name][task] for name in names if task in candidates[name])
        for name in names:
            if task in candidates[name] and candidates[name][task] >= best - _EPS:
                wins[name] += 1
    members = [
        name for name in names
        if wins[name] > 0 and not any(dominates(candidates[other], candidates[name]) for other in names if other != name)
    ]
    return Front(members, {name: wins[name] for name in members})


class UniformSource(Protocol):
    def random(self) -> float: ...


def choose_parent(front: Front, rng: UniformSource) -> str:
    """One member, with probability proportional to the tasks it is best on; `rng` (seeded) makes it replayable."""
    if not front.members:
        raise ValueError("the front is empty: no candidate has a scored task")
    total = sum(front.wins[name] for name in front.members)
    point = rng.random() * total
    cumulative = 0.0
    for name in front.members:
        cumulative += front.wins[name]
        if point < cumulative:
            return name
    return front.members[-1]  # point == total only through rounding
