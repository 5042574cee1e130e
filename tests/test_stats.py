"""Statistics against values computed by hand and by scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from agl_cli.stats import bootstrap_mean, percentile, wilson_interval


def test_wilson_matches_hand_computation() -> None:
    z2 = 1.959963984540054**2
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(z2 / (20 + z2))
    lo, hi = wilson_interval(20, 20)
    assert hi == 1.0 and lo == pytest.approx(20 / (20 + z2))


def test_bootstrap_agrees_with_scipy_percentile_bootstrap() -> None:
    rng = np.random.default_rng(7)
    values = (rng.random(200) < 0.3).astype(float)
    ours = bootstrap_mean(values, seed=1, resamples=20000)
    theirs = sps.bootstrap((values,), np.mean, method="percentile", n_resamples=20000, random_state=2)
    assert ours.mean == pytest.approx(values.mean())
    assert ours.ci95 is not None
    assert ours.ci95[0] == pytest.approx(theirs.confidence_interval.low, abs=0.01)
    assert ours.ci95[1] == pytest.approx(theirs.confidence_interval.high, abs=0.01)
    # Normal approximation as a third opinion: half-width about 1.96 * sd / sqrt(n).
    half = 1.96 * values.std(ddof=1) / np.sqrt(values.size)
    assert (ours.ci95[1] - ours.ci95[0]) / 2 == pytest.approx(half, rel=0.1)


def test_bootstrap_is_seeded_and_clusters_by_task() -> None:
    per_task = [1, 0, 1, 1, 0, 0, 1, 0, 0, 1]
    values = [v for v in per_task for _ in range(2)]
    assert bootstrap_mean(values, seed=3) == bootstrap_mean(values, seed=3)
    # Ten tasks, each run twice with identical outcomes: only 10 independent units, so a wider interval.
    clustered = bootstrap_mean(values, [str(i) for i in range(10) for _ in range(2)], seed=0)
    independent = bootstrap_mean(values, seed=0)
    assert clustered.ci95 is not None and independent.ci95 is not None
    assert clustered.ci95[1] - clustered.ci95[0] > independent.ci95[1] - independent.ci95[0]


def test_empty_and_constant_inputs() -> None:
    assert bootstrap_mean([]).mean is None and bootstrap_mean([]).n == 0
    constant = bootstrap_mean([1.0] * 10)
    assert constant.mean == 1.0 and constant.ci95 is not None and constant.ci95[0] < 1.0  # Wilson, not a point
    assert bootstrap_mean([0.5, 0.5]).ci95 == (0.5, 0.5)
    assert percentile([], 50) is None
    assert percentile([1, 2, 3, 4], 50) == 2.5
