"""Per-variant summaries of a run: accuracy with its interval, missing rewards and why, errors, latency, spend
(unknown when a call has no price), and the model that served the variant's calls."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agl_cli.costs import totals_of
from agl_cli.served import ServedModels, served_models
from agl_cli.stats import Estimate, bootstrap_mean, percentile
from rl_backend.store.db import RunStore
from rl_backend.store.records import CallTotals, ModelUse, Rollout, RolloutStatus


@dataclass
class VariantSummary:
    name: str
    planned: int
    finished: int
    accuracy: Estimate
    missing: int
    missing_reasons: dict[str, int]
    error_rate: float | None
    timeout_rate: float | None
    latency_p50: float | None
    latency_p95: float | None
    input_tokens: int
    output_tokens: int
    calls: int
    cost_usd: float | None  # None: some call has no price (see unpriced_calls)
    unpriced_calls: int = 0
    knobs: dict[str, Any] = field(default_factory=dict)
    served: ServedModels = field(default_factory=ServedModels)

    @property
    def model_warnings(self) -> list[str]:
        return self.served.warnings(self.name)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "n": self.accuracy.n,
            "planned": self.planned,
            "finished": self.finished,
            "accuracy": {"mean": self.accuracy.mean, "ci95": list(self.accuracy.ci95) if self.accuracy.ci95 else None},
            "missing": self.missing,
            "missing_reasons": self.missing_reasons,
            "error_rate": self.error_rate,
            "timeout_rate": self.timeout_rate,
            "latency_s": {"p50": self.latency_p50, "p95": self.latency_p95},
            "tokens": {"input": self.input_tokens, "output": self.output_tokens},
            "calls": self.calls,
            "cost_usd": self.cost_usd,
            "unpriced_calls": self.unpriced_calls,
            "knobs": self.knobs,
            "served_by": self.served.served,
            "models": self.served.as_json(),
            "model_warnings": self.model_warnings,
        }


def summarize_variant(
    name: str, rollouts: list[Rollout], planned: int, totals: Mapping[str, CallTotals], knobs: dict[str, Any],
    uses: Mapping[str, list[ModelUse]] | None = None,
) -> VariantSummary:
    finished = [r for r in rollouts if r.status.terminal]
    scored = [r for r in finished if r.reward is not None]
    reasons = Counter(r.failure.value if r.failure else "unknown" for r in finished if r.reward is None)
    not_run = planned - len(finished)
    if not_run > 0:
        reasons["not_run"] += not_run
    errors = sum(1 for r in finished if r.status == RolloutStatus.failed and r.failure and "agent" in r.failure.value)
    timeouts = sum(1 for r in finished if r.status == RolloutStatus.timed_out)
    durations = [d for r in finished if (d := r.duration_s) is not None]
    used = totals_of(finished, totals)
    return VariantSummary(
        name=name,
        planned=planned,
        finished=len(finished),
        accuracy=bootstrap_mean([float(r.reward) for r in scored if r.reward is not None], [r.task_id for r in scored]),
        missing=planned - len(scored),
        missing_reasons=dict(reasons),
        error_rate=(errors + timeouts) / len(finished) if finished else None,
        timeout_rate=timeouts / len(finished) if finished else None,
        latency_p50=percentile(durations, 50),
        latency_p95=percentile(durations, 95),
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        calls=used.calls,
        cost_usd=used.cost_usd,
        unpriced_calls=used.unpriced_calls,
        knobs=knobs,
        served=served_models(finished, uses or {}),
    )


def summarize_run(store: RunStore, planned_keys: dict[str, list[str]]) -> list[VariantSummary]:
    """`planned_keys`: variant name -> the rollout keys the run planned for it (its denominator)."""
    latest = store.rollouts(latest_only=True)
    totals = store.call_totals_by_rollout()
    uses = store.model_use_by_rollout()
    variants = store.variants()
    result = []
    for name, keys in planned_keys.items():
        wanted = set(keys)
        mine = [r for r in latest if r.key in wanted]
        result.append(summarize_variant(name, mine, len(keys), totals, variants.get(name, {}).get("knobs", {}), uses))
    return result
