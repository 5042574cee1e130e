"""Statistics for what agl shows a person: means with 95% intervals, percentiles.

Intervals treat the task as the unit: several seeds of one task are correlated, so they count as one cluster.

- A proportion (rewards that are all 0 or 1, a share of tasks) gets a Wilson score interval, which behaves at
  small n (1 of 3 is [6.1%, 79.2%], not the [0%, 100%] a bootstrap of three values gives). With several seeds per
  task its n is the effective sample size: n divided by the design effect the clusters show (Korn and Graubard's
  adjustment), between the number of tasks and the number of rollouts.
- A mean of partial-credit rewards (or of costs, latencies) gets a seeded percentile bootstrap that resamples
  tasks. Below MIN_BOOTSTRAP_TASKS tasks such an interval is too narrow as often as not: the estimate says so
  (`rough`), and whatever shows it says so too.

Every interval contains its point estimate (float rounding can put a bound a hair past it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

DEFAULT_RESAMPLES = 4000
MIN_BOOTSTRAP_TASKS = 10  # below this a percentile bootstrap of a mean undercovers; the estimate is marked rough
Z95 = 1.959963984540054

Method = Literal["wilson", "bootstrap", "constant", "none"]


@dataclass(frozen=True)
class Estimate:
    mean: float | None
    ci95: tuple[float, float] | None
    n: int
    method: Method = "bootstrap"  # how ci95 was made
    tasks: int | None = None  # independent units (tasks) behind it, when not n

    @property
    def rough(self) -> bool:
        """A bootstrap over too few tasks to trust its interval."""
        return self.method == "bootstrap" and self.ci95 is not None and (self.tasks or self.n) < MIN_BOOTSTRAP_TASKS

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"mean": self.mean, "ci95": list(self.ci95) if self.ci95 else None, "n": self.n,
                                  "interval": self.method}
        if self.rough:
            out["rough"] = (f"a bootstrap over {self.tasks or self.n} tasks (fewer than {MIN_BOOTSTRAP_TASKS}): "
                            "the interval is likely too narrow")
        return out


def containing(mean: float, interval: tuple[float, float]) -> tuple[float, float]:
    """The interval widened, if rounding left it short, to contain its point estimate."""
    return (min(float(interval[0]), mean), max(float(interval[1]), mean))


def wilson_interval(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Score interval for a proportion of `successes` in `n` (n may be an effective, fractional sample size)."""
    if n <= 0:
        return (0.0, 1.0)
    p = min(max(successes / n, 0.0), 1.0)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo, hi = float(max(0.0, centre - half)), float(min(1.0, centre + half))
    # At p = 0 or 1 the bound is exact in theory; rounding can leave 0.9999999999999999.
    return containing(p, (0.0 if p == 0.0 else lo, 1.0 if p == 1.0 else hi))


def _clusters(values: np.ndarray, clusters: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray]:
    """Per cluster (task): the sum of its values and their count; each value its own cluster without `clusters`."""
    if clusters is None:
        return values, np.ones_like(values)
    groups: dict[str, list[float]] = defaultdict(list)
    for value, cluster in zip(values, clusters, strict=True):
        groups[cluster].append(float(value))
    return np.array([sum(g) for g in groups.values()]), np.array([float(len(g)) for g in groups.values()])


def proportion(values: Sequence[float], clusters: Sequence[str] | None = None) -> Estimate:
    """The share of 1s among 0/1 values with a Wilson 95% interval, its n the effective sample size of the
    clusters (the tasks): n over the design effect, kept between the number of tasks and of values."""
    data = np.asarray(values, dtype=float)
    n = int(data.size)
    if n == 0:
        return Estimate(None, None, 0, "none")
    p = float(data.mean())
    sums, counts = _clusters(data, clusters)
    k = int(sums.size)
    if k > 1 and 0.0 < p < 1.0:
        # Linearised variance of a ratio estimator over clusters; the effective n is what a simple sample would need.
        variance = k / (k - 1) * float(np.sum((sums - p * counts) ** 2)) / n**2
        effective = p * (1 - p) / variance if variance > 0 else float(n)
    else:
        effective = float(k)  # all 0 or all 1: no spread to measure, so count tasks, the independent units
    effective = min(max(effective, float(k)), float(n))
    return Estimate(p, wilson_interval(p * effective, effective), n, "wilson", k)


def bootstrap_mean(
    values: Sequence[float],
    clusters: Sequence[str] | None = None,
    *,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
) -> Estimate:
    """Mean with a percentile bootstrap 95% interval, resampling clusters (tasks) when given. Equal values give a
    zero-width interval (method `constant`): a bootstrap cannot see spread that is not there."""
    data = np.asarray(values, dtype=float)
    n = int(data.size)
    if n == 0:
        return Estimate(None, None, 0, "none")
    mean = float(data.mean())
    sums, counts = _clusters(data, clusters)
    k = int(sums.size)
    if np.all(data == data[0]):
        return Estimate(mean, (mean, mean), n, "constant", k)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, k, size=(resamples, k))
    means = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return Estimate(mean, containing(mean, (float(lo), float(hi))), n, "bootstrap", k)


def is_binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def mean_reward(values: Sequence[float], clusters: Sequence[str] | None = None, *, seed: int = 0) -> Estimate:
    """Accuracy, the mean reward: a proportion when every reward is 0 or 1, else a bootstrapped mean (rough at
    small n). The one rule every accuracy interval agl shows is made by."""
    if is_binary(values):
        return proportion(values, clusters)
    return bootstrap_mean(values, clusters, seed=seed)


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))
