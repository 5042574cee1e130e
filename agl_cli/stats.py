"""Statistics for what agl shows a person: means with seeded bootstrap 95% intervals, percentiles, summaries.

Intervals resample tasks, not rollouts: several seeds of one task are correlated, so the task is the unit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 4000


@dataclass(frozen=True)
class Estimate:
    mean: float | None
    ci95: tuple[float, float] | None
    n: int

    def as_dict(self) -> dict[str, object]:
        return {"mean": self.mean, "ci95": list(self.ci95) if self.ci95 else None, "n": self.n}


def wilson_interval(successes: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Score interval for a proportion; used when every observation is identical, where a bootstrap collapses."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (float(max(0.0, centre - half)), float(min(1.0, centre + half)))


def bootstrap_mean(
    values: Sequence[float],
    clusters: Sequence[str] | None = None,
    *,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
) -> Estimate:
    """Mean with a percentile bootstrap 95% interval, resampling clusters (tasks) when given.

    When all values are 0/1 and identical the bootstrap interval is a single point, which overstates certainty;
    the Wilson score interval is used then instead.
    """
    data = np.asarray(values, dtype=float)
    n = int(data.size)
    if n == 0:
        return Estimate(None, None, 0)
    mean = float(data.mean())
    if np.all(data == data[0]):
        if data[0] in (0.0, 1.0):
            return Estimate(mean, wilson_interval(float(data.sum()), n), n)
        return Estimate(mean, (mean, mean), n)
    rng = np.random.default_rng(seed)
    if clusters is None:
        idx = rng.integers(0, n, size=(resamples, n))
        means = data[idx].mean(axis=1)
    else:
        groups: dict[str, list[float]] = defaultdict(list)
        for value, cluster in zip(data, clusters, strict=True):
            groups[cluster].append(float(value))
        sums = np.array([sum(g) for g in groups.values()])
        counts = np.array([len(g) for g in groups.values()])
        k = len(groups)
        idx = rng.integers(0, k, size=(resamples, k))
        means = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return Estimate(mean, (float(lo), float(hi)), n)


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))
