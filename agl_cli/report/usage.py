"""Model-call aggregates a report needs, read with SQL so a run with many large calls is never loaded whole:
per-rollout totals, failed calls per rollout, and the spend-over-time series."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from rl_backend.store.db import StoreError


@dataclass
class CallUsage:
    totals: dict[str, dict[str, float]] = field(default_factory=dict)  # rollout id -> calls, tokens, cost
    failed_calls: dict[str, int] = field(default_factory=dict)  # rollout id -> calls with an error
    times: list[float] = field(default_factory=list)  # when each call ended, in order
    cumulative_cost: list[float] = field(default_factory=list)
    cumulative_tokens: list[int] = field(default_factory=list)
    calls: int = 0
    unattributed: int = 0  # calls that named no rollout (a health check, an agent outside agl)

    @property
    def total_cost(self) -> float:
        return self.cumulative_cost[-1] if self.cumulative_cost else 0.0

    @property
    def total_tokens(self) -> int:
        return self.cumulative_tokens[-1] if self.cumulative_tokens else 0

    @property
    def duration_s(self) -> float:
        return self.times[-1] - self.times[0] if len(self.times) > 1 else 0.0


def read_usage(store_path: Path) -> CallUsage:
    usage = CallUsage()
    if not store_path.is_file():
        return usage
    # A separate read-only-in-practice connection: RunStore has no query for these, and this never writes.
    conn = sqlite3.connect(store_path, timeout=30.0)
    try:
        _read_into(usage, conn)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{store_path} is damaged and cannot be read ({exc}); restore it from a copy") from None
    finally:
        conn.close()
    return usage


def _read_into(usage: CallUsage, conn: sqlite3.Connection) -> None:
    for rid, n, tin, tout, cost in conn.execute(
        "SELECT rollout_id, COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
        "COALESCE(SUM(cost_usd), 0.0) FROM calls WHERE rollout_id IS NOT NULL GROUP BY rollout_id"
    ):
        usage.totals[rid] = {"calls": n, "input_tokens": tin, "output_tokens": tout, "cost_usd": cost}
    usage.failed_calls = dict(conn.execute(
        "SELECT rollout_id, COUNT(*) FROM calls WHERE rollout_id IS NOT NULL "
        "AND (error IS NOT NULL OR status_code >= 400) GROUP BY rollout_id"
    ).fetchall())
    usage.unattributed = int(conn.execute("SELECT COUNT(*) FROM calls WHERE rollout_id IS NULL").fetchone()[0])
    cost_sum, token_sum = 0.0, 0
    for when, cost, tokens in conn.execute(
        "SELECT COALESCE(ended_at, started_at) AS t, COALESCE(cost_usd, 0.0), "
        "COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) FROM calls ORDER BY t, seq"
    ):
        cost_sum += float(cost)
        token_sum += int(tokens)
        usage.times.append(float(when))
        usage.cumulative_cost.append(cost_sum)
        usage.cumulative_tokens.append(token_sum)
    usage.calls = len(usage.times)
