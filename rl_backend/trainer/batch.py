"""Training rows from trajectories and advantages; mini-batches by rollout, micro-batches by token budget, padding.

A row is one sequence of one rollout, carrying that rollout's advantage A_r and its rollout-normalization weight
1 / max(1, T_r · N) (see loss.py). Mini-batches split the batch by rollout, never inside one, so each keeps whole
rollouts and its own N; weights are recomputed per mini-batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_backend.trainer.loss import BatchTotals, rollout_weight
from rl_backend.trainer.trajectory import RolloutTrajectory


@dataclass
class TrainRow:
    rollout_id: str
    token_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]  # NaN: recompute from the current policy
    advantage: float
    weight: float = 1.0

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class TrainBatch:
    rows: list[TrainRow]
    totals: BatchTotals
    rewards: dict[str, float] = field(default_factory=dict)  # rollout id -> reward, for metrics
    truncated_tokens: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows)


def _totals(rows: Sequence[TrainRow]) -> BatchTotals:
    return BatchTotals(
        n_rollouts=len({r.rollout_id for r in rows}),
        trained_tokens=sum(r.trained_tokens for r in rows),
        n_sequences=sum(1 for r in rows if r.trained_tokens > 0),
    )


def _reweight(rows: list[TrainRow]) -> BatchTotals:
    totals = _totals(rows)
    per_rollout: dict[str, int] = {}
    for r in rows:
        per_rollout[r.rollout_id] = per_rollout.get(r.rollout_id, 0) + r.trained_tokens
    for r in rows:
        r.weight = rollout_weight(per_rollout[r.rollout_id], totals.n_rollouts)
    return totals


def make_batch(
    trajectories: Sequence[RolloutTrajectory], advantages: Mapping[str, float], *, max_seq_len: int | None = None
) -> TrainBatch:
    """Rows for every sequence; a sequence longer than max_seq_len loses its tail (counted in truncated_tokens)."""
    rows: list[TrainRow] = []
    truncated = 0
    for traj in trajectories:
        adv = float(advantages[traj.rollout_id])
        for seq in traj.sequences:
            ids, mask, old = seq.token_ids, seq.loss_mask, seq.old_logprobs
            if max_seq_len is not None and len(ids) > max_seq_len:
                truncated += len(ids) - max_seq_len
                ids, mask, old = ids[:max_seq_len], mask[:max_seq_len], old[:max_seq_len]
            if sum(mask) == 0:
                continue
            rows.append(TrainRow(traj.rollout_id, list(ids), list(mask), list(old), adv))
    totals = _reweight(rows)
    kept = {r.rollout_id for r in rows}
    rewards = {t.rollout_id: t.reward for t in trajectories if t.rollout_id in kept}
    return TrainBatch(rows, totals, rewards, truncated)


def split_by_rollout(batch: TrainBatch, n: int) -> list[TrainBatch]:
    """n mini-batches of whole rollouts (round-robin in batch order), each with its own totals and weights."""
    order: list[str] = list(dict.fromkeys(r.rollout_id for r in batch.rows))
    if n <= 1 or len(order) <= 1:
        return [batch]
    slot = {rid: i % n for i, rid in enumerate(order)}
    out = []
    for k in range(min(n, len(order))):
        rows = [TrainRow(r.rollout_id, r.token_ids, r.loss_mask, r.old_logprobs, r.advantage) for r in batch.rows
                if slot[r.rollout_id] == k]
        totals = _reweight(rows)
        out.append(TrainBatch(rows, totals, {rid: batch.rewards[rid] for rid in slot if slot[rid] == k}))
    return out


def micro_batches(rows: Sequence[TrainRow], max_tokens: int) -> list[list[TrainRow]]:
    """Group rows so that rows × longest row stays within max_tokens (a single longer row goes alone).

    Rows are sorted by length first, so padding stays small.
    """
    ordered = sorted(rows, key=lambda r: len(r.token_ids), reverse=True)
    groups: list[list[TrainRow]] = []
    current: list[TrainRow] = []
    width = 0
    for row in ordered:
        new_width = max(width, len(row.token_ids))
        if current and new_width * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, new_width = [], len(row.token_ids)
        current.append(row)
        width = new_width
    if current:
        groups.append(current)
    return groups


def collate(rows: Sequence[TrainRow], pad_id: int, device: Any = "cpu") -> dict[str, Any]:
    """Right-padded tensors: input_ids and attention_mask [B, L]; per predicted token (positions 1..L-1) the loss
    mask, old logprobs, a flag where they must be recomputed, advantages and weights [B, L-1]."""
    import torch

    width = max(len(r.token_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)
    old = torch.zeros((len(rows), width), dtype=torch.float32)
    adv = torch.zeros((len(rows), width), dtype=torch.float32)
    weight = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        n = len(r.token_ids)
        ids[i, :n] = torch.tensor(r.token_ids, dtype=torch.long)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(r.loss_mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(r.old_logprobs, dtype=torch.float32)
        adv[i, :n] = r.advantage
        weight[i, :n] = r.weight
    missing = torch.isnan(old)
    # Token t is predicted by the logits at t-1: drop position 0 from every per-token tensor.
    return {
        "input_ids": ids.to(device),
        "attention_mask": attn.to(device),
        "loss_mask": mask[:, 1:].to(device),
        "old_logprobs": torch.nan_to_num(old[:, 1:], nan=0.0).to(device),
        "recompute": (missing[:, 1:] & (mask[:, 1:] > 0)).to(device),
        "advantages": adv[:, 1:].to(device),
        "weights": weight[:, 1:].to(device),
    }
