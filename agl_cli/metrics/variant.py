"""One variant's metrics, measured from its rollouts and their recorded calls: what `agl eval` prints, what a
report tabulates and plots, what `agl optimize` ranks and constrains.

- accuracy: the mean reward of the scored rollouts, with a 95% interval over tasks (n = scored rollouts; Wilson
  for 0/1 rewards, a bootstrap for partial credit, marked rough at few tasks: agl_cli.metrics.stats.mean_reward); a rollout
  without a reward is missing, with its reason, never a 0;
- fully right: with partial credit, the share of scored rollouts at reward 1 beside the mean, with its interval;
- wrong: scored rollouts below the pass threshold (rl_backend.rewards); pass^k: the share of tasks whose k seeds
  all passed (n = tasks with k scored seeds), with a Wilson interval;
- errors: agent errors and timeouts among the finished rollouts, with a Wilson interval; latency p50 and p95;
- tokens and calls; cost: the total of every recorded call (a rollout the budget stopped, or an earlier attempt
  of one, was paid for too), and the mean per finished rollout with its interval, both unknown (None) when a call
  has no price (`unpriced_calls` says how many);
- the models that served the calls, with a warning when the agent asked for another.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agl_cli.evaluation.served import ServedModels, served_models
from agl_cli.metrics.rollout_costs import rollout_costs, totals_of
from agl_cli.metrics.stats import (
    MIN_BOOTSTRAP_TASKS,
    Estimate,
    bootstrap_mean,
    mean_reward,
    percentile,
    proportion,
    wilson_interval,
)
from rl_backend.rewards import DEFAULT_PASS_THRESHOLD, passed
from rl_backend.store.records import CallTotals, ModelUse, Rollout, RolloutStatus

NO_CALLS = CallTotals()


@dataclass
class VariantMetrics:
    name: str
    planned: int  # rollouts planned: the denominator of `missing`
    finished: int  # rollouts that ended, whatever their status
    n_tasks: int  # distinct tasks among the finished rollouts
    accuracy: Estimate
    wrong: int  # scored rollouts below the pass threshold
    missing: int  # planned rollouts without a reward
    missing_reasons: dict[str, int]
    error_rate: Estimate  # agent errors and timeouts among the finished rollouts
    timeout_rate: float | None
    latency_p50: float | None
    latency_p95: float | None
    input_tokens: int
    output_tokens: int
    calls: int
    cost_usd: float | None  # None: some call has no price (see unpriced_calls)
    unpriced_calls: int
    cost_per_task: Estimate  # per finished rollout; mean None when a cost is unknown
    tokens_per_task: Estimate  # input + output tokens per finished rollout
    pass_k: Estimate  # mean None when no task has k scored seeds
    k: int
    pass_threshold: float
    knobs: dict[str, Any] = field(default_factory=dict)
    served: ServedModels = field(default_factory=ServedModels)
    fully_right: Estimate = field(default_factory=lambda: Estimate(None, None, 0, "none"))  # share at reward 1
    partial_credit: bool = False  # some reward lies strictly between 0 and 1: then fully_right says more than accuracy

    @property
    def model_warnings(self) -> list[str]:
        return self.served.warnings(self.name)

    def summary_json(self) -> dict[str, Any]:
        """The variant as `agl eval --json` prints it."""
        return {
            "name": self.name,
            "n": self.accuracy.n,
            "planned": self.planned,
            "finished": self.finished,
            "accuracy": self.accuracy.as_dict(),
            "fully_right": self.fully_right.as_dict(),
            "partial_credit": self.partial_credit,
            "missing": self.missing,
            "missing_reasons": self.missing_reasons,
            "error_rate": self.error_rate.mean,
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

    def objectives_json(self) -> dict[str, Any]:
        """The variant as a study's result lists it (`agl optimize --json`): what optimize ranks and constrains."""
        return {
            "name": self.name, "n_tasks": self.n_tasks, "rollouts": self.finished,
            "accuracy": self.accuracy.as_dict(), "fully_right": self.fully_right.as_dict(),
            "cost_per_task_usd": self.cost_per_task.mean,
            "unpriced_calls": self.unpriced_calls,
            "latency_p95_s": self.latency_p95,
            "pass_k": {"k": self.k, "mean": self.pass_k.mean, "n_tasks": self.pass_k.n},
            "tokens": {"input": self.input_tokens, "output": self.output_tokens},
        }


def rough_note(rows: list[VariantMetrics]) -> str | None:
    """Which accuracies rest on too few tasks for their (bootstrap) interval, as words; None when none does."""
    rough = [r for r in rows if r.accuracy.rough]
    if not rough:
        return None
    tasks = max(r.accuracy.tasks or r.accuracy.n for r in rough)
    return (f"accuracy of {', '.join(r.name for r in rough)}: partial-credit rewards over "
            f"{'' if len(rough) == 1 else 'at most '}{tasks} tasks, fewer than {MIN_BOOTSTRAP_TASKS}: read its "
            "interval as rough (likely too narrow)")


def _spread(values: list[float] | None, tasks: list[str]) -> Estimate:
    """Mean cost (or tokens) per rollout with a task-resampled interval; none when a cost is unknown. Equal values
    (a free local model) have a zero-width interval."""
    if not values:
        return Estimate(None, None, 0, "none")
    return bootstrap_mean(values, tasks)


def _pass_k(scored: list[tuple[str, float]], k: int, threshold: float) -> Estimate:
    """`scored`: (task, reward) of every scored rollout."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for task, reward in scored:
        by_task[task].append(reward)
    complete = [values for values in by_task.values() if len(values) >= k]
    if not complete:
        return Estimate(None, None, 0)
    hits = sum(1 for values in complete if all(passed(v, threshold) for v in values))
    return Estimate(hits / len(complete), wilson_interval(hits, len(complete)), len(complete), "wilson")


def measure(
    name: str, rollouts: list[Rollout], totals: Mapping[str, CallTotals], *, planned: int | None = None,
    uses: Mapping[str, list[ModelUse]] | None = None, knobs: dict[str, Any] | None = None, k: int = 1,
    pass_threshold: float = DEFAULT_PASS_THRESHOLD, attempts: list[Rollout] | None = None,
) -> VariantMetrics:
    """The metrics of one variant over `rollouts` (the latest attempt of each; those still running count as not
    finished). `planned`: how many rollouts it should have (default: those finished), so that unrun ones count as
    missing; `k`: the seeds per task pass^k asks for; `attempts`: every attempt of these rollouts (default:
    `rollouts`), whose calls the totals of calls, tokens and cost count, whatever became of them."""
    finished = [r for r in rollouts if r.status.terminal]
    scored = [(r.task_id, float(reward)) for r in finished if (reward := r.reward) is not None]
    planned = len(finished) if planned is None else planned
    reasons = Counter(r.failure.value if r.failure else "unknown" for r in finished if r.reward is None)
    if planned > len(finished):
        reasons["not_run"] += planned - len(finished)
    errors = sum(1 for r in finished if r.status == RolloutStatus.failed and r.failure and "agent" in r.failure.value)
    timeouts = sum(1 for r in finished if r.status == RolloutStatus.timed_out)
    bad = errors + timeouts
    durations = [d for r in finished if (d := r.duration_s) is not None]
    used = totals_of(rollouts if attempts is None else attempts, totals)
    tasks = [r.task_id for r in finished]
    return VariantMetrics(
        name=name,
        planned=planned,
        finished=len(finished),
        n_tasks=len(set(tasks)),
        accuracy=mean_reward([reward for _, reward in scored], [task for task, _ in scored]),
        wrong=sum(1 for _, reward in scored if not passed(reward, pass_threshold)),
        missing=planned - len(scored),
        missing_reasons=dict(reasons),
        error_rate=Estimate(bad / len(finished), wilson_interval(bad, len(finished)), len(finished), "wilson")
        if finished else Estimate(None, None, 0, "none"),
        timeout_rate=timeouts / len(finished) if finished else None,
        latency_p50=percentile(durations, 50),
        latency_p95=percentile(durations, 95),
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        calls=used.calls,
        cost_usd=used.cost_usd,
        unpriced_calls=used.unpriced_calls,
        cost_per_task=_spread(rollout_costs(finished, totals), tasks),
        tokens_per_task=_spread([float(totals.get(r.id, NO_CALLS).tokens) for r in finished], tasks),
        pass_k=_pass_k(scored, k, pass_threshold),
        k=k,
        pass_threshold=pass_threshold,
        knobs=knobs or {},
        served=served_models(finished, uses or {}),
        fully_right=proportion([float(reward == 1.0) for _, reward in scored], [task for task, _ in scored]),
        partial_credit=any(0.0 < reward < 1.0 for _, reward in scored),
    )
