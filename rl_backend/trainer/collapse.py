"""When a training run has collapsed, and why further updates would only spend the budget.

GRPO learns from the differences between the rewards of one group (one task sampled several times). A policy whose
sampling entropy has fallen far below where it started answers each task the same way every time; once every
group's rollouts score alike, every advantage is zero and an update has nothing to move the weights toward. That is
a collapse: entropy fell to at most `entropy_ratio` of the first update's, and the last `patience` iterations in a
row had no learning signal. The loops (loop.py, async_loop.py) stop there instead of running the remaining steps.

A run whose entropy is still high but whose groups carry no signal is not collapsed: the tasks may be too hard or
too easy for now, and sampling still varies; the CLI says "no learning signal" for those steps and goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rl_backend.trainer.curves import StepRecord


@dataclass(frozen=True)
class CollapseRule:
    enabled: bool = True
    entropy_ratio: float = 0.5  # collapsed: the latest entropy is at most this share of the first update's
    patience: int = 2  # iterations in a row whose groups all scored alike

    def __post_init__(self) -> None:
        if not 0.0 < self.entropy_ratio < 1.0:
            raise ValueError(f"entropy_ratio must be between 0 and 1, got {self.entropy_ratio}")
        if self.patience < 1:
            raise ValueError(f"patience must be at least 1, got {self.patience}")


def no_signal(record: StepRecord) -> bool:
    """Every group of this iteration scored alike (an iteration with no group at all says nothing either way)."""
    groups = (record.metrics.get("advantages") or {}).get("groups") or 0
    return bool(groups) and (record.metrics.get("advantages") or {}).get("zero_signal_groups") == groups


def collapse_reason(records: Sequence[StepRecord], rule: CollapseRule) -> str | None:
    """Why the run should stop now (the records so far, oldest first), or None to go on."""
    if not rule.enabled or len(records) < rule.patience:
        return None
    entropies = [r.entropy for r in records if r.entropy is not None]
    if len(entropies) < 2 or entropies[0] <= 0:
        return None
    first, latest = entropies[0], entropies[-1]
    streak = 0
    for record in reversed(records):
        if not no_signal(record):
            break
        streak += 1
    if streak < rule.patience or latest > rule.entropy_ratio * first:
        return None
    return (f"the policy collapsed: its entropy fell from {first:.2f} to {latest:.2f} ({latest / first:.0%} of the "
            f"first update's) and in each of the last {streak} iterations every group's rollouts scored the same, "
            "so no update has a learning signal left")
