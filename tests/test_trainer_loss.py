"""Rollout-level credit against hand-computed values: GRPO advantages (verl's), and the three loss normalizations."""

from __future__ import annotations

import importlib.util
import math

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("verl") is None:  # found, not imported: importing verl configures logging
    pytest.skip("verl is not installed", allow_module_level=True)

from rl_backend.trainer.advantage import grpo_advantages  # noqa: E402
from rl_backend.trainer.batch import TrainRow, collate, make_batch, micro_batches, split_by_rollout  # noqa: E402
from rl_backend.trainer.loss import BatchTotals, LossConfig, PolicyLoss, normalized_advantage  # noqa: E402
from rl_backend.trainer.trajectory import RolloutTrajectory, TokenSequence  # noqa: E402


def seq(rid: str, prompt: int, trained: int) -> TokenSequence:
    s = TokenSequence(rid)
    s.token_ids = list(range(1, prompt + trained + 1))
    s.loss_mask = [0] * prompt + [1] * trained
    s.old_logprobs = [0.0] * prompt + [-1.0] * trained
    return s


def traj(rid: str, reward: float, group: str, trained: list[int]) -> RolloutTrajectory:
    return RolloutTrajectory(rid, group, reward, [seq(rid, 2, n) for n in trained])


def test_grpo_advantage_matches_hand_values() -> None:
    trajs = [traj("a", 1.0, "g", [3]), traj("b", 0.0, "g", [3]), traj("c", 0.0, "g", [3]), traj("d", 0.0, "g", [3])]
    # mean 0.25, unbiased std sqrt(0.75 / 3) = 0.5
    adv = grpo_advantages(trajs).advantages
    assert adv["a"] == pytest.approx(1.5, abs=1e-5) and adv["b"] == pytest.approx(-0.5, abs=1e-5)
    dr = grpo_advantages(trajs, norm_by_std=False).advantages
    assert dr["a"] == pytest.approx(0.75) and dr["d"] == pytest.approx(-0.25)


def test_equal_rewards_give_zero_advantage_and_singletons_are_reported() -> None:
    trajs = [traj("a", 0.7, "g1", [2]), traj("b", 0.7, "g1", [5, 1]), traj("c", 0.7, "g1", [1]), traj("s", 0.7, "g2", [1])]
    report = grpo_advantages(trajs)
    assert report.advantages == {"a": 0.0, "b": 0.0, "c": 0.0, "s": 0.0}
    assert (report.zero_signal_groups, report.singleton_groups, report.groups) == (1, 1, 2)
    # verl's own choice for a group of one: the raw reward (mean 0, std 1)
    assert grpo_advantages(trajs, singletons="verl").advantages["s"] == pytest.approx(0.7, abs=1e-5)


def test_advantage_is_per_rollout_not_per_sequence() -> None:
    # b's 3 sequences must not count as 3 members of the group
    trajs = [traj("a", 1.0, "g", [2]), traj("b", 0.0, "g", [1, 1, 1])]
    adv = grpo_advantages(trajs).advantages
    # mean 0.5, unbiased std sqrt(0.5): A = 0.5 / sqrt(0.5)
    assert adv["a"] == pytest.approx(math.sqrt(0.5), abs=1e-4) and adv["b"] == pytest.approx(-adv["a"])


def batch_loss(trajs: list[RolloutTrajectory], adv: dict[str, float], agg: str, *, micro: int = 10_000,
               new_logprob: float = -1.0) -> tuple[float, dict[str, float]]:
    """Loss of the batch with log_prob = new_logprob everywhere; also the gradient mass per rollout."""
    batch = make_batch(trajs, adv)
    fn = PolicyLoss(LossConfig(loss_agg=agg), batch.totals)  # type: ignore[arg-type]
    total = 0.0
    grad_mass: dict[str, float] = {}
    for rows in micro_batches(batch.rows, micro):
        t = collate(rows, pad_id=0)
        log_prob = torch.full_like(t["old_logprobs"], new_logprob, requires_grad=True)
        loss, _ = fn.policy(log_prob, t["old_logprobs"], t["advantages"], t["weights"], t["loss_mask"])
        loss.backward()
        total += loss.item()
        for i, r in enumerate(rows):
            grad_mass[r.rollout_id] = grad_mass.get(r.rollout_id, 0.0) + float(log_prob.grad[i].sum())
    return total, grad_mass


def test_rollout_normalization_split_rollout_weighs_the_same() -> None:
    adv = {"a": 1.0, "b": 0.5}
    one = [traj("a", 1, "g", [4]), traj("b", 0, "g", [6])]
    three = [traj("a", 1, "g", [4]), traj("b", 0, "g", [1, 2, 3])]
    for trajs in (one, three):
        loss, mass = batch_loss(trajs, adv, "rollout")
        # -(1/N) Σ_r A_r with N = 2 rollouts
        assert loss == pytest.approx(-(1.0 + 0.5) / 2)
        # each rollout's total gradient is -A_r / N, however it is split
        assert mass["a"] == pytest.approx(-0.5) and mass["b"] == pytest.approx(-0.25)
    # the same split through micro-batches of one row each adds up to the same loss
    assert batch_loss(three, adv, "rollout", micro=1)[0] == pytest.approx(-0.75)
    assert normalized_advantage(0.5, 6, 2) == pytest.approx(0.5 / 12)


def test_other_normalizations_for_comparison() -> None:
    adv = {"a": 1.0, "b": 0.5}
    one = [traj("a", 1, "g", [4]), traj("b", 0, "g", [6])]
    three = [traj("a", 1, "g", [4]), traj("b", 0, "g", [1, 2, 3])]
    # token-mean: -(4·1 + 6·0.5) / 10 whatever the split (but longer rollouts weigh more)
    assert batch_loss(one, adv, "token-mean")[0] == pytest.approx(-0.7)
    assert batch_loss(three, adv, "token-mean", micro=1)[0] == pytest.approx(-0.7)
    # seq-mean-token-mean: b split into 3 sequences counts 3 times
    assert batch_loss(one, adv, "seq-mean-token-mean")[0] == pytest.approx(-0.75)
    assert batch_loss(three, adv, "seq-mean-token-mean", micro=1)[0] == pytest.approx(-(1.0 + 3 * 0.5) / 4)


def test_clipping_goes_through_verl_ppo_clip() -> None:
    adv = {"a": 1.0}
    # ratio e^{0.4} ≈ 1.49 > 1.2 with a positive advantage: clipped at 1 + 0.2
    loss, _ = batch_loss([traj("a", 1, "g", [3])], adv, "rollout", new_logprob=-0.6)
    assert loss == pytest.approx(-1.2)


def test_kl_and_entropy_aggregate_like_the_policy_loss() -> None:
    fn = PolicyLoss(LossConfig(loss_agg="rollout"), BatchTotals(n_rollouts=2, trained_tokens=5, n_sequences=2))
    lp = torch.tensor([[-1.0, -1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0, -2.0]])
    kl = fn.kl(lp, ref)  # k3: e^{ref-lp} - (ref-lp) - 1
    assert float(kl[0, 0]) == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    weights = torch.full((1, 3), 0.25)
    assert float(fn.aggregate(kl, mask, weights)) == pytest.approx(0.25 * float(kl[0, 0]))


def test_mini_batches_keep_rollouts_whole_and_reweight() -> None:
    trajs = [traj("a", 1, "g", [4]), traj("b", 0, "g", [1, 2, 3]), traj("c", 0, "g", [2])]
    batch = make_batch(trajs, {"a": 1.0, "b": -0.5, "c": -0.5})
    assert batch.totals == BatchTotals(n_rollouts=3, trained_tokens=12, n_sequences=5)
    assert {r.rollout_id: r.weight for r in batch.rows}["b"] == pytest.approx(1 / 18)
    minis = split_by_rollout(batch, 2)
    assert [sorted({r.rollout_id for r in m.rows}) for m in minis] == [["a", "c"], ["b"]]
    assert minis[1].rows[0].weight == pytest.approx(1 / 6)


def test_collate_shifts_per_token_tensors_by_one() -> None:
    row = TrainRow("a", [5, 6, 7], [0, 1, 1], [0.0, -0.5, math.nan], 2.0, 0.25)
    t = collate([row, TrainRow("b", [5], [0], [0.0], 1.0)], pad_id=0)
    assert t["input_ids"].tolist() == [[5, 6, 7], [5, 0, 0]]
    assert t["loss_mask"].tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert t["old_logprobs"].tolist() == [[-0.5, 0.0], [0.0, 0.0]]
    assert t["recompute"].tolist() == [[False, True], [False, False]]
    assert t["weights"].tolist() == [[0.25, 0.25], [0.0, 0.0]]  # padding weighs nothing
