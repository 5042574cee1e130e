"""Model-call aggregates a report needs, summed by the store in SQL so a run with many large calls is never loaded whole:
per-rollout totals, the models that served each rollout, failed calls per rollout, and the spend-over-time series.
The series is what the run spent itself: calls of rollouts it reused from earlier runs are counted apart
(`reused_*`), never spent twice; the cost curve adds the priced calls only (`unpriced_calls` says how many it
leaves out)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_backend.store.db import RunStore
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


def read_usage(store: RunStore, reused: frozenset[str] | set[str] = frozenset()) -> CallUsage:
    """`reused`: ids of the rollouts this run copied from earlier runs (agl_cli.runs.run_spend)."""
    usage = CallUsage(totals=store.call_totals_by_rollout(), uses=store.model_use_by_rollout())
    for group in store.model_calls():
        if group.failed and group.rollout_id is not None:
            usage.failed_calls[group.rollout_id] = usage.failed_calls.get(group.rollout_id, 0) + group.calls
    usage.reused_rollouts = len(reused & usage.totals.keys())
    cost_sum, token_sum = 0.0, 0
    for point in store.spend_series():
        if point.rollout_id is None:
            usage.unattributed += 1
        if point.rollout_id in reused:
            usage.reused_calls += 1
            usage.reused_cost += float(point.cost_usd or 0.0)
            continue
        if point.cost_usd is None:
            usage.unpriced_calls += 1
        cost_sum += float(point.cost_usd or 0.0)
        token_sum += point.tokens
        usage.times.append(point.at)
        usage.cumulative_cost.append(cost_sum)
        usage.cumulative_tokens.append(token_sum)
    usage.calls = len(usage.times)
    return usage
