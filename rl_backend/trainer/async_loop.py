"""The collocated-async loop: rollouts keep running while the policy trains on the groups that finished.

A `RolloutSource` (interfaces.py) keeps a steady number of rollouts in flight, launched group by group (one GRPO
group: the same task `group_size` times), and hands over groups only once every rollout of the group has finished.
Each update:

  1. take complete groups, the oldest first (later ones carry over to the next update), dropping the rollouts that
     are too stale: a rollout is `staleness` updates old when its oldest call was served by model version
     `step-<s>` and the trainer is at step `s + staleness`; above `max_staleness` it is not trained on (counted as
     `stale` in the step record); until `groups_per_step` groups have at least two fresh rollouts each,
  2. pause the gateway (`Gate.pause`): new model calls wait or get 429 + Retry-After, calls in flight drain, so the
     device the server shares with the trainer is free and no call straddles the weight swap,
  4. `TrainingLoop.train_on` (loop.py): trajectories, advantages, update, the new weights served as `step-<n+1>`,
  5. resume the gateway as soon as the new weights are served (the checkpoint is written while rollouts run again).

Rollouts that were in flight during the update carry on afterwards on the new weights: their earlier calls keep the
version that served them, so the PPO ratio uses the right old logprobs and the staleness check sees them. Pure
Python here: the source and the gate are protocols (interfaces.py; agl_cli/training/async_job.py fills them in).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rl_backend.store.db import RunStore
from rl_backend.trainer.curves import StepRecord
from rl_backend.trainer.interfaces import Gate, RolloutGroup, RolloutSource
from rl_backend.trainer.loop import TrainingLoop, version_step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AsyncConfig:
    iterations: int = 10
    groups_per_step: int = 4
    max_staleness: int = 1  # updates a rollout's oldest call may lag behind the policy being trained
    group_timeout_s: float | None = 3600.0  # no complete group for this long: the rollouts are stuck, stop
    max_groups_per_step: int | None = None  # groups looked at per update (default 4 x groups_per_step): when most
    # rollouts fail or are stale, the update goes ahead on what there is (or is recorded as skipped, like sync's)


class NoRolloutsError(RuntimeError):
    """The source produced no complete group in time."""


def rollout_staleness(store: RunStore, rollout_id: str, trainer_step: int) -> int | None:
    """How many updates behind `trainer_step` the oldest recorded call of a rollout was served; None when no call
    names a known model version (then nothing says it is stale)."""
    steps = [s for c in store.calls(rollout_id) if (s := version_step(c.model_version)) is not None]
    return trainer_step - min(steps) if steps else None


class AsyncTrainingLoop:
    """Drives a TrainingLoop from a RolloutSource, pausing the Gate around each update."""

    def __init__(self, loop: TrainingLoop, source: RolloutSource, gate: Gate, config: AsyncConfig) -> None:
        if config.max_staleness < 0:
            raise ValueError(f"max_staleness must be 0 or more, got {config.max_staleness}")
        self.loop, self.source, self.gate, self.config = loop, source, gate, config

    def run(self) -> list[StepRecord]:
        if self.loop.trainer.step > 0:
            self.loop.sync_engine()  # resumed from a checkpoint: serve what was trained before anything samples
        started = time.time()
        self.source.start()
        records: list[StepRecord] = []
        try:
            for iteration in range(self.config.iterations):
                records.append(self.iterate(iteration, since=records[-1].ended_at if records else started,
                                            loop_started=started))
                if self.loop.stopped:  # collapsed (loop.py): the remaining updates would change nothing
                    break
        finally:
            self.source.stop()
        return records

    def split_stale(self, rollout_ids: Iterable[str]) -> tuple[list[str], list[str], dict[str, int]]:
        """(fresh, stale, staleness by rollout) at the trainer's current step."""
        step = self.loop.trainer.step
        fresh: list[str] = []
        stale: list[str] = []
        ages: dict[str, int] = {}
        for rid in rollout_ids:
            age = rollout_staleness(self.loop.store, rid, step)
            if age is not None:
                ages[rid] = age
            (stale if age is not None and age > self.config.max_staleness else fresh).append(rid)
        return fresh, stale, ages

    def collect(self) -> tuple[list[RolloutGroup], list[str], list[str], dict[str, int]]:
        """Complete groups until `groups_per_step` of them have at least two fresh rollouts (a GRPO group needs two),
        or `max_groups_per_step` were looked at: (groups, fresh ids, stale ids, staleness by rollout). The trainer's
        step cannot change meanwhile (only this thread updates), so what is fresh now is fresh at the update."""
        cfg = self.config
        groups: list[RolloutGroup] = []
        fresh: list[str] = []
        stale: list[str] = []
        ages: dict[str, int] = {}
        usable = 0
        limit = cfg.max_groups_per_step or 4 * cfg.groups_per_step
        while usable < cfg.groups_per_step and len(groups) < limit:
            wanted = min(cfg.groups_per_step - usable, limit - len(groups))
            got = self.source.next_groups(wanted, cfg.group_timeout_s)
            if len(got) < wanted:
                timeout = "ever" if cfg.group_timeout_s is None else f"{cfg.group_timeout_s:g} s"
                raise NoRolloutsError(
                    f"only {usable + len(got)} of {cfg.groups_per_step} rollout groups finished within {timeout}: "
                    "look at the rollouts' errors (agl show RUN)"
                )
            for group in got:
                group_fresh, group_stale, group_ages = self.split_stale(group.rollout_ids)
                groups.append(group)
                fresh += group_fresh
                stale += group_stale
                ages.update(group_ages)
                usable += len(group_fresh) >= 2
        return groups, fresh, stale, ages

    def iterate(self, iteration: int, *, since: float, loop_started: float) -> StepRecord:
        groups, fresh, stale, ages = self.collect()
        if stale:
            log.info("iteration %d: %d rollouts older than %d updates are not trained on",
                     iteration, len(stale), self.config.max_staleness)
        rollout_s = time.time() - since  # the rollouts had the gateway from the last resume until now
        pause = self.gate.pause()
        resumed: dict[str, Any] = {}

        def resume() -> None:
            if not resumed:
                resumed.update(self.gate.resume(self.loop.version))

        metrics = {
            "loop": "collocated-async",
            "groups": [g.key for g in groups],
            "stale": len(stale),
            "stale_rollout_ids": stale,
            "rollout_staleness": _summary(ages.values()),
            "max_staleness": self.config.max_staleness,
            "pause": pause,
            "resume": resumed,  # filled by resume() before the row is written
            "elapsed_s": round(time.time() - loop_started, 4),
        }
        try:
            return self.loop.train_on(fresh, iteration=iteration, started_at=since, rollout_s=rollout_s,
                                      metrics=metrics, after_sync=resume)
        finally:
            resume()  # also when the update failed: rollouts must not wait forever on a paused gateway


def _summary(values: Iterable[int]) -> dict[str, float | int | None]:
    seq: Sequence[int] = list(values)
    return {"mean": sum(seq) / len(seq) if seq else None, "max": max(seq) if seq else None}
