"""Rollout-level credit: one GRPO advantage per rollout, broadcast to every token it trains.

GRPO groups the n rollouts of one task (under one variant) and scores each against its group: A = (r - mean) / std
(or r - mean with `norm_by_std=False`, as Dr.GRPO). The arithmetic is verl's own
`core_algos.compute_grpo_outcome_advantage`, called with one one-token "response" per rollout: a rollout counts once
whatever number of calls or sequences it made, which is the point of computing credit at the rollout level.

A group whose rewards are all equal carries no signal and gets advantage 0 everywhere. verl gives a group of one
rollout its raw reward (mean 0, std 1); `singletons="zero"` (the default here) zeroes it instead, because a reward
with no baseline would push the policy in whatever direction the reward's sign says, not towards better rollouts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from rl_backend.trainer.trajectory import RolloutTrajectory
from rl_backend.trainer.verl_compat import verl

Singletons = Literal["zero", "verl"]


@dataclass
class AdvantageReport:
    advantages: dict[str, float]  # rollout id -> A_r
    groups: int = 0
    singleton_groups: int = 0
    zero_signal_groups: int = 0  # all rewards equal: every advantage 0
    group_sizes: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        values = list(self.advantages.values())
        return {
            "groups": self.groups,
            "singleton_groups": self.singleton_groups,
            "zero_signal_groups": self.zero_signal_groups,
            "nonzero_rollouts": sum(1 for v in values if v != 0.0),
            "advantage_abs_mean": float(np.mean(np.abs(values))) if values else 0.0,
        }


def grpo_advantages(
    trajectories: Sequence[RolloutTrajectory],
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    singletons: Singletons = "zero",
) -> AdvantageReport:
    """A_r for each rollout, from verl's GRPO outcome advantage on CPU tensors."""
    if not trajectories:
        return AdvantageReport({})
    rewards = torch.tensor([[t.reward] for t in trajectories], dtype=torch.float32, device="cpu")
    mask = torch.ones_like(rewards)
    index = np.array([t.group for t in trajectories], dtype=object)
    scores, _ = verl().core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=rewards, response_mask=mask, index=index, epsilon=epsilon, norm_adv_by_std_in_grpo=norm_by_std
    )
    values = scores[:, 0].tolist()

    members: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        members[t.group].append(i)
    report = AdvantageReport({}, groups=len(members), group_sizes={g: len(ix) for g, ix in members.items()})
    for ix in members.values():
        if len(ix) == 1:
            report.singleton_groups += 1
            if singletons == "zero":
                values[ix[0]] = 0.0
        elif len({trajectories[i].reward for i in ix}) == 1:
            report.zero_signal_groups += 1
            for i in ix:  # verl returns (r - mean) / (0 + eps) = 0 up to rounding; make it exact
                values[i] = 0.0
    report.advantages = {t.rollout_id: float(v) for t, v in zip(trajectories, values, strict=True)}
    return report
