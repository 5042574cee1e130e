"""What the model calls of a run add up to, summed in SQL so that a run with many large calls is never loaded whole:
per rollout (calls, tokens, cost), per rollout and model (with latency and failed calls), which models served each
rollout, and the run's spend over time.

A call without a price (NULL cost) makes a cost unknown: every sum here counts such calls apart, never as $0.
A call failed when it has an error or an HTTP status of 400 or more.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from rl_backend.store.records import CallTotals, ModelUse, RouteKind

_FAILED = "(error IS NOT NULL OR status_code >= 400)"


@dataclass(frozen=True)
class ModelCalls:
    """The calls of one rollout (None: calls that named none) to one upstream and model, failed or not."""

    rollout_id: str | None
    upstream: str
    model: str  # the name the call was sent as, else the one the agent asked for, else "?"
    failed: bool
    calls: int
    with_token_ids: int  # calls whose completion token ids were recorded
    input_tokens: int
    output_tokens: int
    latency_s: float
    priced_usd: float  # the sum over the calls that have a price
    unpriced_calls: int

    @property
    def served(self) -> str:
        return f"{self.upstream}/{self.model}"


@dataclass(frozen=True)
class SpendPoint:
    """One call, in the order the calls ended: what the spend-over-time series adds up."""

    rollout_id: str | None
    at: float
    cost_usd: float | None
    tokens: int


def call_totals(conn: sqlite3.Connection) -> dict[str, CallTotals]:
    """Per rollout id, what its calls used (see CallTotals)."""
    return {
        str(rid): CallTotals(int(n), int(tin), int(tout), float(usd), int(unpriced or 0))
        for rid, n, tin, tout, usd, unpriced in conn.execute(
            "SELECT rollout_id, COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
            "COALESCE(SUM(cost_usd), 0.0), SUM(cost_usd IS NULL) "
            "FROM calls WHERE rollout_id IS NOT NULL GROUP BY rollout_id"
        )
    }


def model_use(conn: sqlite3.Connection) -> dict[str, list[ModelUse]]:
    """Per rollout id, its calls grouped by requested name, upstream/model served, route and reported name."""
    result: dict[str, list[ModelUse]] = {}
    for rid, requested, upstream, model, route, reported, n in conn.execute(
        "SELECT rollout_id, request_model, upstream, model, route, served_model, COUNT(*) FROM calls "
        "WHERE rollout_id IS NOT NULL GROUP BY rollout_id, request_model, upstream, model, route, served_model"
    ):
        served = f"{upstream}/{model}" if model else str(upstream)
        result.setdefault(str(rid), []).append(
            ModelUse(requested, served, RouteKind(route) if route else None, reported, int(n))
        )
    return result


def model_calls(conn: sqlite3.Connection) -> list[ModelCalls]:
    """The calls grouped by rollout, upstream, model and whether they failed."""
    return [
        ModelCalls(rid, str(upstream), str(model), bool(failed), int(n), int(ids or 0), int(tin), int(tout),
                   float(latency), float(usd), int(unpriced or 0))
        for rid, upstream, model, failed, n, ids, tin, tout, latency, usd, unpriced in conn.execute(
            f"SELECT rollout_id, upstream, COALESCE(model, request_model, '?') AS name, {_FAILED} AS failed, "
            "COUNT(*), SUM(completion_token_ids IS NOT NULL), COALESCE(SUM(input_tokens), 0), "
            "COALESCE(SUM(output_tokens), 0), COALESCE(SUM(latency_s), 0.0), COALESCE(SUM(cost_usd), 0.0), "
            "SUM(cost_usd IS NULL) FROM calls GROUP BY rollout_id, upstream, name, failed"
        )
    ]


def spend_series(conn: sqlite3.Connection) -> list[SpendPoint]:
    """Every call, by the time it ended (or started, when it never ended)."""
    return [
        SpendPoint(rid, float(at), cost, int(tokens))
        for rid, at, cost, tokens in conn.execute(
            "SELECT rollout_id, COALESCE(ended_at, started_at) AS t, cost_usd, "
            "COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) FROM calls ORDER BY t, seq"
        )
    ]


def sampling_overridden(conn: sqlite3.Connection) -> dict[str, int]:
    """Per request field, how many training calls had the agent's value of it overridden (the gateway records
    them under knobs_applied.sampling_overridden: rl_backend.gateway.training_fields)."""
    return {
        str(name): int(n)
        for name, n in conn.execute(
            "SELECT f.key, COUNT(*) FROM calls, json_each(calls.knobs_applied, '$.sampling_overridden') AS f "
            "WHERE calls.knobs_applied LIKE '%sampling_overridden%' GROUP BY f.key ORDER BY f.key"
        )
    }
