"""Statistics against values computed by hand and by scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from agl_cli.metrics.stats import MIN_BOOTSTRAP_TASKS, bootstrap_mean, mean_reward, percentile, proportion, wilson_interval


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
    constant = mean_reward([1.0] * 10)
    assert constant.mean == 1.0 and constant.ci95 is not None and constant.ci95[0] < 1.0  # Wilson, not a point
    assert mean_reward([0.5, 0.5]).ci95 == (0.5, 0.5) and bootstrap_mean([1.0] * 3).ci95 == (1.0, 1.0)
    assert percentile([], 50) is None
    assert percentile([1, 2, 3, 4], 50) == 2.5


def test_accuracy_at_tiny_n_is_a_wilson_interval_not_a_bootstrap_of_three_values() -> None:
    """0/3, 1/3 and 3/3 once gave [0, 56.1], [0, 100] and [43.9, 100]: a bootstrap of three 0/1 values can only
    land on 0, 1/3, 2/3 or 1. Every 0/1 accuracy is now a Wilson interval, as scipy computes it."""
    for hits in range(4):
        estimate = mean_reward([1.0] * hits + [0.0] * (3 - hits), [f"t{i}" for i in range(3)])
        theirs = sps.binomtest(hits, 3).proportion_ci(method="wilson")
        assert estimate.method == "wilson" and estimate.ci95 is not None and not estimate.rough
        assert estimate.ci95 == pytest.approx((theirs.low, theirs.high))
    one_in_three = mean_reward([1.0, 0.0, 0.0]).ci95
    assert one_in_three is not None and one_in_three[0] > 0.05 and one_in_three[1] < 0.8


def test_an_interval_always_contains_its_point_estimate() -> None:
    """All right of 10 printed 100.0% with an upper bound of 0.9999999999999999; none of 3 a lower bound above 0."""
    for n in range(1, 200):
        for hits in range(n + 1):
            lo, hi = wilson_interval(hits, n)
            assert lo <= hits / n <= hi, (hits, n)
        assert wilson_interval(n, n)[1] == 1.0 and wilson_interval(0, n)[0] == 0.0
    rng = np.random.default_rng(3)
    for _ in range(50):
        values = rng.choice([0.0, 0.25, 1.0], size=int(rng.integers(2, 8)), p=[0.1, 0.1, 0.8])
        estimate = mean_reward(values.tolist(), seed=int(rng.integers(100)))
        assert estimate.ci95 is not None and estimate.ci95[0] <= estimate.mean <= estimate.ci95[1]  # type: ignore[operator]


def test_several_seeds_of_a_task_count_as_one_task_in_a_proportion() -> None:
    """Ten tasks run twice with identical outcomes are ten independent units, not twenty: the effective n is 10."""
    per_task = [1, 0, 1, 1, 0, 0, 1, 0, 0, 1]
    values = [float(v) for v in per_task for _ in range(2)]
    clustered = proportion(values, [str(i) for i in range(10) for _ in range(2)])
    assert clustered.ci95 == pytest.approx(wilson_interval(5, 10)) and clustered.n == 20 and clustered.tasks == 10
    assert proportion(values).ci95 == pytest.approx(wilson_interval(10, 20))
    # Seeds that disagree within every task carry more information than one rollout per task.
    mixed = proportion([1.0, 0.0] * 10, [str(i) for i in range(10) for _ in range(2)])
    assert mixed.ci95 == pytest.approx(wilson_interval(10, 20))
    # All right on every seed: the tasks, not the rollouts, are what can be counted.
    assert proportion([1.0] * 8, ["a", "a", "b", "b", "c", "c", "d", "d"]).ci95 == pytest.approx(wilson_interval(4, 4))


def test_partial_credit_keeps_the_bootstrap_and_says_when_there_are_too_few_tasks() -> None:
    few = mean_reward([0.2, 0.5, 1.0, 0.7], ["a", "b", "c", "d"])
    assert few.method == "bootstrap" and few.rough and "4 tasks" in str(few.as_dict()["rough"])
    enough = mean_reward([0.2, 0.5, 1.0, 0.7] * 3, [str(i) for i in range(12)])
    assert enough.method == "bootstrap" and not enough.rough and "rough" not in enough.as_dict()
    # Rough is about tasks: three seeds of four tasks are still four tasks.
    seeded = mean_reward([0.2, 0.5, 1.0, 0.7] * 3, ["a", "b", "c", "d"] * 3)
    assert seeded.rough and seeded.n == 12 and seeded.tasks == 4 < MIN_BOOTSTRAP_TASKS
