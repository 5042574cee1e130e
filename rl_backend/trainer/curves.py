"""Training curves in the run store: one `train_steps` row per iteration of the training loop.

The store owns the table (its `add_train_steps` migration) and the row format (rl_backend.store.codec); this module
owns what a step records. Pure Python (no torch): the CLI reads curves with `read_curve` without loading the
training stack.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rl_backend.store.db import RunStore


@dataclass
class StepRecord:
    """One iteration of the loop: `step` and `model_version` are the trainer's after it (unchanged when skipped)."""

    step: int
    model_version: str
    updated: bool
    started_at: float
    ended_at: float
    rollouts: int
    trained_rollouts: int
    reward_mean: float | None = None
    pass_rate: float | None = None
    entropy: float | None = None
    kl: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = None
    rollouts_per_min: float | None = None
    staleness_mean: float | None = None
    staleness_max: int | None = None
    checkpoint: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # everything else: timings, reports, trainer metrics

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def record_step(store: RunStore, record: StepRecord) -> None:
    store.add_train_step(asdict(record))


def read_curve(store: RunStore) -> list[StepRecord]:
    return [StepRecord(**row) for row in store.train_steps()]
