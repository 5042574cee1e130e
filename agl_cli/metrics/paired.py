"""Paired statistics: is variant B better than variant A on the same tasks and seeds?

The unit of evidence is the task. A task's several seeds are correlated, so for each task both variants ran,
the difference `d_t` is the mean of (B - A) over the seeds both have, and everything resamples or counts tasks:

- the accuracy difference is the pooled mean of B - A over the shared (task, seed) pairs, with a seeded paired
  bootstrap 95% interval that resamples tasks;
- the p-value is an exact two-sided sign test on the signs of `d_t` (ties dropped). With one seed and 0/1
  rewards the non-zero `d_t` are exactly the discordant pairs, so this *is* the exact McNemar test;
- the verdict says `better` only when the interval excludes zero AND the (Holm-adjusted) p-value passes; `worse`
  symmetrically; otherwise `no detectable difference`, with about how many more tasks would likely decide it.
  Each comparison says which of the two checks decided it and why (`why`): "no detectable difference" beside a
  small p-value is the interval's doing, and says so. A difference of zero is "nothing suggests a difference",
  never a projection of astronomically many tasks; projections past any practical size are left out.

Pure Python and numpy (scipy is only used by the tests, to check these numbers).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from agl_cli.metrics.stats import containing

BETTER = "better"
WORSE = "worse"
NO_DIFFERENCE = "no detectable difference"
ALPHA = 0.05
POWER = 0.8
DEFAULT_RESAMPLES = 4000
# A mean difference this close to 0 is 0: rewards summed in floating point leave ~1e-17, not an effect.
ZERO_EFFECT = 1e-9
# A projection of more tasks than this (or than this many times the tasks compared) decides nothing in practice.
MAX_PROJECTED_TASKS = 100_000
MAX_PROJECTED_FACTOR = 100

PairKey = tuple[str, int]  # (task id, seed)
TEST_NAMES = {"mcnemar_exact": "McNemar exact test", "sign_test": "sign test", "none": "no test"}


# -- exact tests ------------------------------------------------------------------------------------------------


def binomial_two_sided(k: int, n: int) -> float:
    """Exact two-sided p-value of k successes in n fair coin flips: 2 * P(X <= min(k, n - k)), capped at 1."""
    if n <= 0:
        return 1.0
    low = min(k, n - k)
    if n <= 2000:
        # Exact integer arithmetic; int / int true division rounds correctly however large the numbers get.
        tail = sum(math.comb(n, i) for i in range(low + 1))
        return min(1.0, 2 * tail / 2**n)
    # Log-space for very large n, where 2**n no longer fits a float.
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2) for i in range(low + 1)]
    top = max(logs)
    return min(1.0, 2 * math.exp(top) * sum(math.exp(x - top) for x in logs))


def sign_test(differences: Sequence[float]) -> tuple[float, int, int]:
    """(p-value, positives, negatives) of the exact two-sided sign test; zero differences are dropped (and what
    floating point leaves of a zero: partial-credit rewards such as 0.1 + 0.2 against 0.3 differ by 5.6e-17)."""
    positive = sum(1 for d in differences if d > ZERO_EFFECT)
    negative = sum(1 for d in differences if d < -ZERO_EFFECT)
    return binomial_two_sided(positive, positive + negative), positive, negative


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: controls the chance of any false verdict among several comparisons."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


# -- pairing and the bootstrap ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Paired:
    """Shared pairs grouped by task: per task the sum and count of (B - A), and the raw means of A and B."""

    tasks: list[str]
    sums: np.ndarray
    counts: np.ndarray
    mean_a: float
    mean_b: float

    @property
    def n_tasks(self) -> int:
        return len(self.tasks)

    @property
    def n_pairs(self) -> int:
        return int(self.counts.sum())

    @property
    def task_differences(self) -> np.ndarray:
        return self.sums / self.counts

    @property
    def difference(self) -> float:
        return float(self.sums.sum() / self.counts.sum()) if self.tasks else 0.0


def pair_up(a: Mapping[PairKey, float], b: Mapping[PairKey, float]) -> Paired:
    """Keep the (task, seed) keys both sides have; group their differences by task."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    total_a = total_b = 0.0
    for key in sorted(set(a) & set(b)):
        sums[key[0]] += b[key] - a[key]
        counts[key[0]] += 1
        total_a += a[key]
        total_b += b[key]
    tasks = list(sums)
    n = sum(counts.values())
    return Paired(
        tasks=tasks,
        sums=np.array([sums[t] for t in tasks], dtype=float),
        counts=np.array([counts[t] for t in tasks], dtype=float),
        mean_a=total_a / n if n else math.nan,
        mean_b=total_b / n if n else math.nan,
    )


def paired_interval(paired: Paired, *, seed: int = 0, resamples: int = DEFAULT_RESAMPLES) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the pooled mean difference, resampling tasks (clusters of seeds)."""
    k = paired.n_tasks
    if k == 0:
        return (math.nan, math.nan)
    if np.all(paired.task_differences == paired.task_differences[0]) and np.all(paired.counts == paired.counts[0]):
        value = float(paired.task_differences[0])
        return (value, value)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, k, size=(resamples, k))
    means = paired.sums[idx].sum(axis=1) / paired.counts[idx].sum(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return containing(paired.difference, (float(lo), float(hi)))


def tasks_to_decide(differences: np.ndarray, *, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """About how many tasks in all a test would need to decide, with `power`, if the observed effect is real.

    Connor's formula for paired proportions, written on per-task differences: the spread under "no difference"
    is sqrt(mean d^2) (the discordance), under the alternative it is the sd of d. None when no effect was seen.
    """
    n = differences.size
    if n == 0:
        return None
    effect = float(differences.mean())
    if abs(effect) < ZERO_EFFECT:
        return None
    spread_null = math.sqrt(float(np.mean(differences**2)))
    spread_alt = float(differences.std(ddof=1)) if n > 1 else spread_null
    z_alpha = NormalDist().inv_cdf(1 - alpha / 2)
    z_power = NormalDist().inv_cdf(power)
    return math.ceil(((z_alpha * spread_null + z_power * spread_alt) / abs(effect)) ** 2)


# -- comparisons and verdicts -----------------------------------------------------------------------------------


def judge(ci95: tuple[float, float] | None, p_value: float, alpha: float = ALPHA) -> str:
    """B against A: a side is named only when the interval excludes zero and the p-value passes."""
    if ci95 is None or any(math.isnan(x) for x in ci95) or p_value >= alpha:
        return NO_DIFFERENCE
    if ci95[0] > 0:
        return BETTER
    if ci95[1] < 0:
        return WORSE
    return NO_DIFFERENCE


@dataclass
class Comparison:
    """B (candidate) judged against A (baseline) on what both have."""

    n_tasks: int
    n_pairs: int
    mean_a: float | None
    mean_b: float | None
    difference: float | None
    ci95: tuple[float, float] | None
    test: str
    b_better: int
    a_better: int
    p_value: float
    p_adjusted: float
    alpha: float
    verdict: str = NO_DIFFERENCE
    tasks_needed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def zero_difference(self) -> bool:
        return self.difference is not None and abs(self.difference) < ZERO_EFFECT

    @property
    def more_tasks(self) -> int | None:
        """About how many more tasks would likely decide an undecided comparison (at least one); None when nothing
        was seen to decide, or when the projection is past any practical size."""
        if self.verdict != NO_DIFFERENCE or self.tasks_needed is None or self.zero_difference:
            return None
        if self.tasks_needed > min(MAX_PROJECTED_TASKS, MAX_PROJECTED_FACTOR * max(self.n_tasks, 1)):
            return None
        return max(1, self.tasks_needed - self.n_tasks)

    def decide_with(self) -> str | None:
        """What more evidence would do for an undecided comparison, in words; None when decided or nothing was seen."""
        if self.verdict != NO_DIFFERENCE or self.zero_difference or self.n_tasks == 0:
            return None
        if self.more_tasks is not None:
            return f"about {self.more_tasks} more tasks would likely decide it"
        if self.tasks_needed is not None:
            return (f"the difference seen is too small for more tasks to decide it at any practical size (over "
                    f"{min(MAX_PROJECTED_TASKS, MAX_PROJECTED_FACTOR * max(self.n_tasks, 1)):,} tasks)")
        return None

    @property
    def interval_excludes_zero(self) -> bool | None:
        """None when no interval was computed (racing skips it once the test has failed)."""
        if self.ci95 is None or any(math.isnan(x) for x in self.ci95):
            return None
        return self.ci95[0] > 0 or self.ci95[1] < 0

    @property
    def test_passes(self) -> bool:
        return self.p_adjusted < self.alpha

    def decide(self) -> None:
        self.verdict = NO_DIFFERENCE if self.zero_difference else judge(self.ci95, self.p_adjusted, self.alpha)

    def why(self) -> str:
        """Which check decided the verdict, and why it is what it is, in a sentence for a person."""
        test = TEST_NAMES.get(self.test, self.test)
        adjusted = "Holm-adjusted " if self.p_adjusted != self.p_value else ""
        p = f"{adjusted}p={self.p_adjusted:.3g}"
        if self.n_tasks == 0:
            return "no task was scored on both sides"
        if self.zero_difference:
            if self.b_better == self.a_better == 0:
                return "every task scored the same on both sides: nothing in these tasks suggests a difference"
            return (f"the tasks each side did better on cancel out ({self.b_better} vs {self.a_better}): nothing in "
                    "these tasks suggests a difference")
        interval, passes = self.interval_excludes_zero, self.test_passes
        if self.verdict != NO_DIFFERENCE:
            return f"both checks agree: the interval excludes zero and the {test} passes ({p} < {self.alpha:g})"
        if interval is None:
            return f"the {test} does not pass ({p} >= {self.alpha:g}), so the interval was not needed"
        if interval and not passes:
            return (f"decided by the {test}: the interval excludes zero, but the test does not pass ({p} >= "
                    f"{self.alpha:g}; {self.b_better} tasks favour the candidate, {self.a_better} the baseline), "
                    "too few to rule out chance; a side is named only when both checks agree")
        if passes:
            return (f"decided by the interval: the {test} passes ({p} < {self.alpha:g}: {self.b_better} tasks favour "
                    f"the candidate, {self.a_better} the baseline), but the interval of the mean difference includes "
                    "zero, so the size of the difference is not clear of nothing; a side is named only when both "
                    "checks agree")
        return f"neither check passes: the interval includes zero and the {test} does not pass ({p} >= {self.alpha:g})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_tasks": self.n_tasks,
            "n_pairs": self.n_pairs,
            "baseline_mean": self.mean_a,
            "candidate_mean": self.mean_b,
            "difference": {"mean": self.difference, "ci95": list(self.ci95) if self.ci95 else None},
            "test": self.test,
            "discordant": {"candidate_better": self.b_better, "baseline_better": self.a_better},
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "alpha": self.alpha,
            "verdict": self.verdict,
            "checks": {"interval_excludes_zero": self.interval_excludes_zero, "test_passes": self.test_passes},
            "why": self.why(),
            "more_tasks": self.more_tasks,
            "decide_with": self.decide_with(),
            **self.extra,
        }


def _is_binary(values: Mapping[PairKey, float]) -> bool:
    return all(v in (0.0, 1.0) for v in values.values())


def compare(
    a: Mapping[PairKey, float],
    b: Mapping[PairKey, float],
    *,
    alpha: float = ALPHA,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    interval: bool = True,
) -> Comparison:
    """Paired comparison of B against A. `interval=False` skips the bootstrap when the p-value already fails
    (the verdict cannot change then); racing uses it to stay fast."""
    paired = pair_up(a, b)
    if paired.n_tasks == 0:
        return Comparison(0, 0, None, None, None, None, "none", 0, 0, 1.0, 1.0, alpha)
    diffs = paired.task_differences
    p_value, positive, negative = sign_test(diffs.tolist())
    binary = _is_binary(a) and _is_binary(b)
    one_seed = bool(np.all(paired.counts == 1))
    test = "mcnemar_exact" if binary and one_seed else "sign_test"
    ci = paired_interval(paired, seed=seed, resamples=resamples) if interval or p_value < alpha else None
    result = Comparison(
        n_tasks=paired.n_tasks, n_pairs=paired.n_pairs, mean_a=paired.mean_a, mean_b=paired.mean_b,
        difference=paired.difference, ci95=ci, test=test, b_better=positive, a_better=negative,
        p_value=p_value, p_adjusted=p_value, alpha=alpha, tasks_needed=tasks_to_decide(diffs, alpha=alpha),
    )
    result.decide()
    return result


def compare_many(
    baseline: Mapping[PairKey, float],
    candidates: Mapping[str, Mapping[PairKey, float]],
    *,
    alpha: float = ALPHA,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
) -> dict[str, Comparison]:
    """Each candidate against one baseline; with several, p-values are Holm-adjusted before the verdicts."""
    results = {
        name: compare(baseline, values, alpha=alpha, seed=seed, resamples=resamples)
        for name, values in candidates.items()
    }
    names = list(results)
    for name, adjusted in zip(names, holm([results[n].p_value for n in names]), strict=True):
        results[name].p_adjusted = adjusted
        results[name].decide()
    return results


@dataclass(frozen=True)
class Difference:
    """A paired difference of a continuous measure (cost, latency): B - A with a task-resampled interval."""

    n: int
    mean_a: float | None
    mean_b: float | None
    difference: float | None
    ci95: tuple[float, float] | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_pairs": self.n, "baseline_mean": self.mean_a, "candidate_mean": self.mean_b,
            "difference": {"mean": self.difference, "ci95": list(self.ci95) if self.ci95 else None},
        }


def difference(a: Mapping[PairKey, float], b: Mapping[PairKey, float], *, seed: int = 0) -> Difference:
    paired = pair_up(a, b)
    if paired.n_tasks == 0:
        return Difference(0, None, None, None, None)
    return Difference(paired.n_pairs, paired.mean_a, paired.mean_b, paired.difference, paired_interval(paired, seed=seed))
