"""Training curves in the run store: one `train_steps` row per iteration of the training loop.

The table comes from a migration appended to `rl_backend.store.db.MIGRATIONS` (its text is TRAIN_STEPS_MIGRATION
below); nothing here creates tables, so a store is only ever changed by its migrations. Pure Python (no torch): the
CLI reads curves with `read_curve` without loading the training stack.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from rl_backend.store.db import MIGRATIONS

# Appended to MIGRATIONS as one entry. The migration runner splits on ";", so no ";" inside.
TRAIN_STEPS_MIGRATION = MIGRATIONS[1]

_COLUMNS = (
    "step", "model_version", "updated", "started_at", "ended_at", "rollouts", "trained_rollouts", "reward_mean",
    "pass_rate", "entropy", "kl", "loss", "grad_norm", "tokens_per_s", "rollouts_per_min", "staleness_mean",
    "staleness_max", "checkpoint",
)


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


def _finite(value: Any) -> Any:
    # SQLite and JSON both dislike NaN: a metric that could not be computed is stored as missing.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def has_table(store: Any) -> bool:
    with store.transaction() as conn:
        row = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'train_steps'").fetchone()
    return row is not None


def record_step(store: Any, record: StepRecord) -> None:
    values = [_finite(getattr(record, c)) for c in _COLUMNS]
    values[_COLUMNS.index("updated")] = int(record.updated)
    metrics = json.dumps(_clean(record.metrics), default=str)
    sql = f"INSERT INTO train_steps ({', '.join(_COLUMNS)}, metrics) VALUES ({', '.join('?' for _ in _COLUMNS)}, ?)"
    with store.transaction() as conn:
        conn.execute(sql, (*values, metrics))


def read_curve(store: Any) -> list[StepRecord]:
    with store.transaction() as conn:
        rows = conn.execute(f"SELECT {', '.join(_COLUMNS)}, metrics FROM train_steps ORDER BY seq").fetchall()
    out = []
    for row in rows:
        data = {c: row[c] for c in _COLUMNS}
        data["updated"] = bool(data["updated"])
        out.append(StepRecord(**data, metrics=json.loads(row["metrics"])))
    return out


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return _finite(value)
