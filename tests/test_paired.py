"""Paired statistics against values computed by hand and by scipy, and the verdict rule's error rates on seeded
synthetic paired data (the synthetic agent's model: each variant right with its own probability, independently
per (task, seed, variant))."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from agl_cli.metrics.paired import (
    BETTER,
    NO_DIFFERENCE,
    WORSE,
    binomial_two_sided,
    compare,
    compare_many,
    difference,
    holm,
    judge,
    pair_up,
    paired_interval,
    sign_test,
    tasks_to_decide,
)


def _binary(outcomes: np.ndarray, seeds: int = 1) -> dict[tuple[str, int], float]:
    return {(f"t{i // seeds}", i % seeds): float(x) for i, x in enumerate(outcomes)}


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (3, 10), (10, 12), (50, 100), (7, 7), (120, 250), (1500, 2900)])
def test_exact_binomial_matches_scipy(k: int, n: int) -> None:
    assert binomial_two_sided(k, n) == pytest.approx(sps.binomtest(k, n).pvalue, rel=1e-9, abs=1e-300)


def test_mcnemar_by_hand() -> None:
    # 10 tasks where B is right and A wrong, 2 the other way: 2 * P(X <= 2 | n=12) = 2 * (1 + 12 + 66) / 4096.
    a = {(f"t{i}", 0): v for i, v in enumerate([0] * 10 + [1] * 2 + [1] * 30 + [0] * 8)}
    b = {(f"t{i}", 0): v for i, v in enumerate([1] * 10 + [0] * 2 + [1] * 30 + [0] * 8)}
    result = compare(a, b)
    assert result.test == "mcnemar_exact"
    assert (result.b_better, result.a_better) == (10, 2)
    assert result.p_value == pytest.approx(158 / 4096)
    assert result.difference == pytest.approx(8 / 50)
    assert result.mean_a == pytest.approx(32 / 50) and result.mean_b == pytest.approx(40 / 50)


def test_sign_test_drops_ties_and_holm_by_hand() -> None:
    p, positive, negative = sign_test([0.5, 0.0, -1.0, 0.25, 0.0, 1.0])
    assert (positive, negative) == (3, 1) and p == pytest.approx(sps.binomtest(3, 4).pvalue)
    # Sorted 0.01, 0.03, 0.04 -> 3 * 0.01, max(0.03, 2 * 0.03), max(0.06, 1 * 0.04).
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_paired_interval_agrees_with_scipy_bootstrap() -> None:
    rng = np.random.default_rng(3)
    a = _binary(rng.random(300) < 0.55)
    b = _binary(rng.random(300) < 0.65)
    paired = pair_up(a, b)
    ours = paired_interval(paired, seed=1, resamples=20000)
    theirs = sps.bootstrap((paired.task_differences,), np.mean, method="percentile", n_resamples=20000,
                           random_state=2).confidence_interval
    assert ours[0] == pytest.approx(theirs.low, abs=0.01) and ours[1] == pytest.approx(theirs.high, abs=0.01)


def test_seeds_cluster_by_task() -> None:
    # Three seeds per task: the test counts tasks (sign test on per-task means), not 3x as many pairs.
    rng = np.random.default_rng(5)
    a = _binary(rng.random(120) < 0.5, seeds=3)
    b = _binary(rng.random(120) < 0.5, seeds=3)
    result = compare(a, b)
    assert result.n_tasks == 40 and result.n_pairs == 120 and result.test == "sign_test"
    diffs = pair_up(a, b).task_differences
    assert result.p_value == pytest.approx(sps.binomtest(int((diffs > 0).sum()), int((diffs != 0).sum())).pvalue)


def test_only_shared_keys_are_paired() -> None:
    a = {("t1", 0): 1.0, ("t2", 0): 0.0, ("t3", 0): 1.0}
    b = {("t2", 0): 1.0, ("t3", 0): 1.0, ("t4", 0): 0.0}
    result = compare(a, b)
    assert result.n_pairs == 2 and result.difference == pytest.approx(0.5)
    empty = compare(a, {("x", 0): 1.0})
    assert empty.n_tasks == 0 and empty.verdict == NO_DIFFERENCE and empty.ci95 is None


def test_verdict_needs_both_the_interval_and_the_p_value() -> None:
    assert judge((0.01, 0.2), 0.01) == BETTER
    assert judge((-0.2, -0.01), 0.01) == WORSE
    assert judge((0.01, 0.2), 0.06) == NO_DIFFERENCE  # interval excludes zero, p fails
    assert judge((-0.01, 0.2), 0.001) == NO_DIFFERENCE  # p passes, interval holds zero
    assert judge(None, 0.0) == NO_DIFFERENCE


def test_tasks_to_decide_is_connors_formula() -> None:
    # 100 tasks: 20 where B wins, 10 where A wins -> discordance q = 0.3, effect d = 0.1.
    diffs = np.array([1.0] * 20 + [-1.0] * 10 + [0.0] * 70)
    q, d = 0.3, 0.1
    sd_alt = float(diffs.std(ddof=1))
    expected = math.ceil(((1.959963984540054 * math.sqrt(q) + 0.8416212335729143 * sd_alt) / d) ** 2)
    assert tasks_to_decide(diffs) == expected
    a = {(f"t{i}", 0): 0.0 if x > 0 else 1.0 if x < 0 else 0.0 for i, x in enumerate(diffs)}
    b = {(f"t{i}", 0): 1.0 if x > 0 else 0.0 for i, x in enumerate(diffs)}
    result = compare(a, b)
    assert result.verdict == NO_DIFFERENCE and result.more_tasks == expected - 100
    assert tasks_to_decide(np.zeros(10)) is None


def test_holm_across_candidates() -> None:
    rng = np.random.default_rng(9)
    base = _binary(rng.random(300) < 0.5)
    candidates = {name: _binary(rng.random(300) < p) for name, p in [("same", 0.5), ("up", 0.7), ("down", 0.3)]}
    results = compare_many(base, candidates)
    raw = [results[n].p_value for n in candidates]
    assert [results[n].p_adjusted for n in candidates] == pytest.approx(holm(raw))
    assert results["up"].verdict == BETTER and results["down"].verdict == WORSE
    assert results["same"].verdict == NO_DIFFERENCE


def test_holm_can_turn_a_lone_better_into_no_detectable_difference() -> None:
    # 14 tasks where B wins, 4 where A wins, 82 ties: p = 0.031 alone, 3 x 0.031 = 0.093 among three candidates.
    a = {(f"t{i}", 0): v for i, v in enumerate([0.0] * 14 + [1.0] * 4 + [1.0] * 82)}
    b = {(f"t{i}", 0): v for i, v in enumerate([1.0] * 14 + [0.0] * 4 + [1.0] * 82)}
    alone = compare(a, b)
    assert alone.p_value == pytest.approx(sps.binomtest(14, 18).pvalue) and alone.verdict == BETTER
    together = compare_many(a, {"b": b, "same1": dict(a), "same2": dict(a)})
    assert together["b"].p_adjusted == pytest.approx(3 * alone.p_value)
    assert together["b"].verdict == NO_DIFFERENCE and together["b"].more_tasks is not None


def test_continuous_difference_interval() -> None:
    rng = np.random.default_rng(11)
    cost_a = {(f"t{i}", 0): float(x) for i, x in enumerate(rng.normal(1.0, 0.1, 200))}
    cost_b = {k: v + 0.05 + float(rng.normal(0, 0.02)) for k, v in cost_a.items()}
    result = difference(cost_a, cost_b)
    assert result.n == 200 and result.difference == pytest.approx(0.05, abs=0.01)
    assert result.ci95 is not None and result.ci95[0] < 0.05 < result.ci95[1] and result.ci95[0] > 0


def _rate(p_a: float, p_b: float, n: int, reps: int, verdict: str) -> float:
    hits = 0
    for rep in range(reps):
        rng = np.random.default_rng(1000 + rep)
        a, b = _binary(rng.random(n) < p_a), _binary(rng.random(n) < p_b)
        # interval=False only skips the bootstrap when the p-value already fails: the verdict is the same.
        hits += compare(a, b, interval=False, resamples=1000).verdict == verdict
    return hits / reps


def test_aa_says_no_detectable_difference_at_least_95_percent() -> None:
    assert _rate(0.6, 0.6, 200, 200, NO_DIFFERENCE) >= 0.95
    assert _rate(0.5, 0.5, 400, 200, NO_DIFFERENCE) >= 0.95


def test_ten_points_better_is_found_at_least_80_percent_at_n400() -> None:
    # Power depends on the base rate. With independent outcomes the exact test alone has power 0.89 at 0.7 -> 0.8,
    # 0.83 at 0.6 -> 0.7 and 0.79 at 0.5 -> 0.6 (computed exactly from the binomial; bench/optimize measures the
    # whole rule): an exact two-sided test pays a little power for never exceeding its 5%.
    assert _rate(0.7, 0.8, 400, 250, BETTER) >= 0.80
    assert _rate(0.6, 0.7, 400, 150, BETTER) >= 0.75
    assert _rate(0.8, 0.7, 400, 50, BETTER) == 0.0  # and never the wrong way round


def _partial(values: list[float]) -> dict[tuple[str, int], float]:
    return {(f"t{i}", 0): v for i, v in enumerate(values)}


def test_a_zero_difference_suggests_nothing_and_projects_no_task_count() -> None:
    """A partial-credit grader (the mean of three fields) scores a task 0.1 + 0.2 on one side and 0.3 on the other:
    a difference of 5.6e-17, once read as an effect that "about 10^35 more tasks would likely decide"."""
    a = _partial([0.1 + 0.2, 1.0, 2 / 3, 0.0, 1 / 3] * 4)
    b = _partial([0.3, 1.0, 2 / 3, 0.0, 1 / 3] * 4)
    result = compare(a, b)
    assert result.verdict == NO_DIFFERENCE and result.b_better == result.a_better == 0
    assert result.more_tasks is None and result.decide_with() is None
    assert "nothing in these tasks suggests a difference" in result.why()
    doc = result.as_dict()
    assert doc["more_tasks"] is None and "nothing in these tasks suggests a difference" in doc["why"]
    # Wins and losses that cancel (up to floating point: -0.30000000000000004 against +0.3, a mean of -4e-18 that
    # Connor's formula turned into ~10^33 tasks): the same words, with the counts.
    even = compare(_partial([0.1 + 0.2, 0.3] * 5), _partial([0.0, 0.6] * 5))
    assert even.tasks_needed is None and even.more_tasks is None and even.decide_with() is None
    assert "cancel out (5 vs 5): nothing in these tasks suggests a difference" in even.why()


def test_a_tiny_effect_projects_no_absurd_task_count() -> None:
    """10 tasks won and 9 lost of 40: Connor's formula asks for thousands of tasks, a number that decides nothing for
    a task set of 40; said as such, not as a count to go and get."""
    a = _partial([0.0] * 10 + [1.0] * 9 + [0.5] * 21)
    b = _partial([1.0] * 10 + [0.0] * 9 + [0.5] * 21)
    result = compare(a, b)
    assert result.tasks_needed is not None and result.tasks_needed > 100 * 40
    assert result.more_tasks is None and "too small for more tasks to decide it" in (result.decide_with() or "")
    # A real but undecided effect still gets its projection.
    near = compare(_partial([0.0] * 8 + [1.0] * 2 + [0.5] * 10), _partial([1.0] * 8 + [0.0] * 2 + [0.5] * 10))
    assert near.more_tasks is not None and near.decide_with() == f"about {near.more_tasks} more tasks would likely decide it"


def test_every_verdict_says_which_check_decided_it() -> None:
    # The sign test passes (9 tasks up a little, 1 down a lot: p = 0.021), the mean difference's interval holds 0.
    a = _partial([0.5] * 10)
    b = _partial([0.55] * 9 + [0.0])
    undecided = compare(a, b)
    assert undecided.p_value < 0.05 and undecided.verdict == NO_DIFFERENCE
    assert undecided.as_dict()["checks"] == {"interval_excludes_zero": False, "test_passes": True}
    assert undecided.why().startswith("decided by the interval: the sign test passes (p=0.0215 < 0.05")
    # The interval clear of zero, the test not passing: 3 of 3 tasks up.
    few = compare(_partial([0.0, 0.0, 0.0]), _partial([1.0, 1.0, 1.0]))
    assert few.interval_excludes_zero and not few.test_passes and few.verdict == NO_DIFFERENCE
    assert few.why().startswith("decided by the McNemar exact test: the interval excludes zero, but the test does not "
                                "pass (p=0.25 >= 0.05; 3 tasks favour the candidate, 0 the baseline)")
    decided = compare(_partial([0.0] * 12), _partial([1.0] * 12))
    assert decided.verdict == BETTER and decided.why().startswith("both checks agree")
    neither = compare(_partial([0.0, 1.0] * 6), _partial([1.0, 0.0] * 5 + [1.0, 1.0]))
    assert neither.verdict == NO_DIFFERENCE and neither.why().startswith("neither check passes")


def test_a_paired_interval_contains_the_difference() -> None:
    rng = np.random.default_rng(5)
    for _ in range(30):
        n = int(rng.integers(2, 7))
        a = _partial(rng.choice([0.0, 1.0], size=n).tolist())
        b = _partial(rng.choice([0.0, 1.0], size=n, p=[0.2, 0.8]).tolist())
        lo, hi = paired_interval(pair_up(a, b), seed=int(rng.integers(1000)))
        assert lo <= pair_up(a, b).difference <= hi
