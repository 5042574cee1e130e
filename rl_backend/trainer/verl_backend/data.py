"""Training rows (rl_backend.trainer.batch.TrainRow) to `verl.DataProto` and back, and verl's step metrics to agl's.

verl's actor reads a batch of prompt/response pairs: `prompts` [B, P] left-padded, `responses` [B, R] right-padded,
`input_ids` = prompts ++ responses, `attention_mask` and `position_ids` over both, `response_mask` [B, R] (1 where the
model sampled the token: verl's multi-turn agent loop marks tool output inside the response with 0, as agl's loss
mask does) and `advantages` [B, R]. A row of agl becomes one pair: the prompt is everything before its first trained
token, the response the rest, its loss mask the response mask.

The logprobs the gateway recorded while sampling go in `rollout_log_probs`: verl recomputes `old_log_probs` with
the actor itself and corrects for the difference (its rollout correction), as it does for its own rollouts. Tokens
whose logprob was not recorded are flagged in `agl_recompute` (their rollout logprob is set to the recomputed one
once that exists, see `fill_unrecorded`).

`advantages` carries what the policy loss is fed: Â = A_r · w under rollout normalization (see loss.py), A_r
otherwise, zero outside the response mask. What verl does not read rides along for the way back, exactly: the rollout
id, A_r and w per row (`non_tensor_batch`, float64), and the batch totals (`meta_info`). Logprobs are float32.

Every data-parallel rank must get the same number of rows: `pad_rows` adds rows with an empty response mask, which
train nothing and count no token (verl counts trained tokens from the response mask).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rl_backend.trainer.batch import TrainRow, _totals

RECOMPUTE = "agl_recompute"
ROLLOUT_LOGPROBS = "rollout_log_probs"
PADDING_ID = "agl-padding"


def _first_trained(row: TrainRow) -> int:
    if row.rollout_id == PADDING_ID:
        return 1  # one prompt token, one response token that is not trained
    for i, m in enumerate(row.loss_mask):
        if m:
            if i == 0:
                raise ValueError(f"rollout {row.rollout_id}: a row's first token cannot be trained (no context)")
            return i
    raise ValueError(f"rollout {row.rollout_id}: a row with no trained token has no response")


def to_data_proto(rows: Sequence[TrainRow], *, pad_id: int, loss_agg: str = "rollout",
                  meta: Mapping[str, Any] | None = None) -> Any:
    """A DataProto of `rows` (see the module docstring for the layout)."""
    from verl import DataProto
    from verl.utils.model import compute_position_id_with_mask

    if not rows:
        raise ValueError("no rows to train on")
    cuts = [_first_trained(r) for r in rows]
    width_p = max(cuts)
    width_r = max(len(r.token_ids) - c for r, c in zip(rows, cuts, strict=True))
    n = len(rows)
    prompts = torch.full((n, width_p), pad_id, dtype=torch.long)
    prompt_attn = torch.zeros((n, width_p), dtype=torch.long)
    responses = torch.full((n, width_r), pad_id, dtype=torch.long)
    response_attn = torch.zeros((n, width_r), dtype=torch.long)
    response_mask = torch.zeros((n, width_r), dtype=torch.long)
    recorded = torch.zeros((n, width_r), dtype=torch.float32)
    recompute = torch.zeros((n, width_r), dtype=torch.bool)
    advantages = torch.zeros((n, width_r), dtype=torch.float32)
    for i, (row, cut) in enumerate(zip(rows, cuts, strict=True)):
        ids = row.token_ids
        prompts[i, width_p - cut:] = torch.tensor(ids[:cut], dtype=torch.long)  # left padding
        prompt_attn[i, width_p - cut:] = 1
        k = len(ids) - cut
        responses[i, :k] = torch.tensor(ids[cut:], dtype=torch.long)
        response_attn[i, :k] = 1
        mask = torch.tensor(row.loss_mask[cut:], dtype=torch.long)
        response_mask[i, :k] = mask
        logprobs = row.old_logprobs[cut:]
        recompute[i, :k] = torch.tensor([math.isnan(x) for x in logprobs]) & (mask > 0)
        recorded[i, :k] = torch.tensor([0.0 if math.isnan(x) else x for x in logprobs], dtype=torch.float32)
        fed = row.advantage * row.weight if loss_agg == "rollout" else row.advantage
        advantages[i, :k] = fed * mask.float()
    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    totals = _totals(rows)
    info = {"agl_loss_agg": loss_agg, "pad_id": pad_id, "n_rollouts": totals.n_rollouts,
            "trained_tokens": totals.trained_tokens, "n_sequences": totals.n_sequences,
            # The recorded logprobs are raw (temperature 1): the actor must not rescale its logits.
            "temperature": 1.0, "global_token_num": attention_mask.sum(dim=1).tolist(), **(meta or {})}
    return DataProto.from_dict(
        tensors={
            "prompts": prompts, "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
            "position_ids": compute_position_id_with_mask(attention_mask),
            "response_mask": response_mask, ROLLOUT_LOGPROBS: recorded, "advantages": advantages, RECOMPUTE: recompute,
        },
        non_tensors={
            "rollout_id": np.array([r.rollout_id for r in rows], dtype=object),
            "agl_advantage": np.array([r.advantage for r in rows], dtype=np.float64),
            "agl_weight": np.array([r.weight for r in rows], dtype=np.float64),
        },
        meta_info=info,
    )


def from_data_proto(data: Any) -> list[TrainRow]:
    """The rows a DataProto of to_data_proto carries (logprobs as float32, NaN where they were not recorded)."""
    batch, extra = data.batch, data.non_tensor_batch
    rows = []
    for i in range(len(data)):
        p_keep = batch["attention_mask"][i, : batch["prompts"].shape[1]].bool()
        r_keep = batch["attention_mask"][i, batch["prompts"].shape[1]:].bool()
        prompt = batch["prompts"][i][p_keep].tolist()
        response = batch["responses"][i][r_keep].tolist()
        old = batch[ROLLOUT_LOGPROBS][i][r_keep].tolist()
        missing = batch[RECOMPUTE][i][r_keep].tolist()
        rows.append(TrainRow(
            rollout_id=str(extra["rollout_id"][i]),
            token_ids=prompt + response,
            loss_mask=[0] * len(prompt) + batch["response_mask"][i][r_keep].tolist(),
            old_logprobs=[0.0] * len(prompt) + [math.nan if m else x for x, m in zip(old, missing, strict=True)],
            advantage=float(extra["agl_advantage"][i]),
            weight=float(extra["agl_weight"][i]),
        ))
    return rows


def pad_rows(rows: Sequence[TrainRow], multiple: int, pad_id: int) -> list[TrainRow]:
    """`rows` plus rows that train nothing (an empty loss mask after a one-token prompt), up to a multiple of
    `multiple` rows: every data-parallel rank gets the same number, and padding adds no trained token."""
    out = list(rows)
    while len(out) % max(1, multiple):
        out.append(TrainRow(PADDING_ID, [pad_id, pad_id], [0, 0], [0.0, 0.0], 0.0, 0.0))
    return out


def fill_unrecorded(data: Any) -> int:
    """Where the gateway recorded no logprob, take the actor's recomputed one as the rollout's (so the rollout
    correction weighs that token 1); returns how many tokens were filled. Needs `old_log_probs` in the batch."""
    batch = data.batch
    missing = batch[RECOMPUTE].bool()
    batch[ROLLOUT_LOGPROBS] = torch.where(missing, batch["old_log_probs"], batch[ROLLOUT_LOGPROBS])
    return int(missing.sum())


def _number(value: Any) -> float | None:
    if hasattr(value, "value"):  # verl.utils.metric.Metric
        value = value.value
    if isinstance(value, torch.Tensor):
        value = value.detach().float().mean().item()
    if isinstance(value, list | tuple):
        numbers = [x for x in (_number(v) for v in value) if x is not None]
        return sum(numbers) / len(numbers) if numbers else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


# verl's metric names -> the torch backend's, so both backends' step rows read the same.
METRIC_NAMES = {"actor/pg_loss": "pg_loss", "actor/pg_clipfrac": "pg_clipfrac", "actor/ppo_kl": "ppo_kl",
                "actor/pg_clipfrac_lower": "pg_clipfrac_lower", "actor/entropy_loss": "entropy", "kl_loss": "kl",
                "loss": "loss", "grad_norm": "grad_norm", "lr": "lr"}


def step_metrics(verl_metrics: Mapping[str, Any]) -> dict[str, float]:
    """verl's train metrics (lists per micro-batch, Metric objects, tensors) as agl's flat numbers."""
    out: dict[str, float] = {}
    for key, value in verl_metrics.items():
        number = _number(value)
        if number is not None:
            out[METRIC_NAMES.get(key, key.replace("/", "_"))] = number
    return out
