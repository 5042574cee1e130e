"""Model-call aggregates a report needs, read with SQL so a run with many large calls is never loaded whole:
per-rollout totals, the models that served each rollout, failed calls per rollout, and the spend-over-time series.
The series is what the run spent itself: calls of rollouts it reused from earlier runs are counted apart
(`reused_*`), never spent twice; the cost curve adds the priced calls only (`unpriced_calls` says how many it
leaves out)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from rl_backend.store.db import StoreError, call_totals, model_use
from rl_backend.store.records import CallTotals, ModelUse


@dataclass
class CallUsage:
    totals: dict[str, CallTotals] = field(default_factory=dict)  # rollout id -> calls, tokens, cost
    uses: dict[str, list[ModelUse]] = field(default_factory=dict)  # rollout id -> requested and served models
    failed_calls: dict[str, int] = field(default_factory=dict)  # rollout id -> calls with an error
    times: list[float] = field(default_factory=list)  # when each call ended, in order
    cumulative_cost: list[float] = field(default_factory=list)
    cumulative_tokens: list[int] = field(default_factory=list)
    calls: int = 0
    unattributed: int = 0  # calls that named no rollout (a health check, an agent outside agl)
    unpriced_calls: int = 0  # this run's own calls without a price: its total cost is unknown when there are any
    reused_rollouts: int = 0  # rollouts copied from earlier runs by the result cache
    reused_calls: int = 0
    reused_cost: float = 0.0  # the priced calls of those, spent by the runs they came from, not by this one

    @property
    def priced_cost(self) -> float:
        return self.cumulative_cost[-1] if self.cumulative_cost else 0.0

    @property
    def total_cost(self) -> float | None:
        return None if self.unpriced_calls else self.priced_cost

    @property
    def total_tokens(self) -> int:
        return self.cumulative_tokens[-1] if self.cumulative_tokens else 0

    @property
    def duration_s(self) -> float:
        return self.times[-1] - self.times[0] if len(self.times) > 1 else 0.0


def read_usage(store_path: Path, reused: frozenset[str] | set[str] = frozenset()) -> CallUsage:
    """`reused`: ids of the rollouts this run copied from earlier runs (agl_cli.run_spend)."""
    usage = CallUsage()
    if not store_path.is_file():
        return usage
    # A separate read-only-in-practice connection: RunStore has no query for these, and this never writes.
    conn = sqlite3.connect(store_path, timeout=30.0)
    try:
        _read_into(usage, conn, reused)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{store_path} is damaged and cannot be read ({exc}); restore it from a copy") from None
    finally:
        conn.close()
    return usage


def _read_into(usage: CallUsage, conn: sqlite3.Connection, reused: frozenset[str] | set[str]) -> None:
    usage.totals = call_totals(conn)
    usage.uses = model_use(conn)
    usage.failed_calls = dict(conn.execute(
        "SELECT rollout_id, COUNT(*) FROM calls WHERE rollout_id IS NOT NULL "
        "AND (error IS NOT NULL OR status_code >= 400) GROUP BY rollout_id"
    ).fetchall())
    usage.unattributed = int(conn.execute("SELECT COUNT(*) FROM calls WHERE rollout_id IS NULL").fetchone()[0])
    usage.reused_rollouts = len(reused & usage.totals.keys())
    cost_sum, token_sum = 0.0, 0
    for rid, when, cost, tokens in conn.execute(
        "SELECT rollout_id, COALESCE(ended_at, started_at) AS t, cost_usd, "
        "COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) FROM calls ORDER BY t, seq"
    ):
        if rid in reused:
            usage.reused_calls += 1
            usage.reused_cost += float(cost or 0.0)
            continue
        if cost is None:
            usage.unpriced_calls += 1
        cost_sum += float(cost or 0.0)
        token_sum += int(tokens)
        usage.times.append(float(when))
        usage.cumulative_cost.append(cost_sum)
        usage.cumulative_tokens.append(token_sum)
    usage.calls = len(usage.times)
