"""The policy loss and its normalization, on verl's `core_algos` (policy loss functions, `agg_loss`, `kl_penalty`).

`loss_agg` chooses how per-token losses become one number:

- `rollout` (default; Agent Lightning v1.0): every rollout weighs the same, however many calls or sequences it was
  split into. Each trained token of rollout r gets the advantage Â = A_r / max(1, T_r · N) (T_r: the rollout's
  trained tokens in the batch, N: the rollouts in the batch) and the token losses are summed ("token-sum" in verl).
  With ratio 1 the loss is -(1/N) Σ_r A_r, the mean over rollouts of each rollout's token-mean. Because the PPO-clip
  loss is linear in a positive scaling of the advantage, scaling Â is exactly a per-rollout weighting.
- `token-mean`: every trained token weighs the same (long rollouts weigh more).
- `seq-mean-token-mean`: every sequence weighs the same (a rollout split into k sequences weighs k times more).

Totals (tokens, sequences, rollouts) are those of the whole (mini-)batch, passed to verl as `global_batch_info`, so
micro-batches can be summed for gradient accumulation without rescaling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from rl_backend.trainer.verl_compat import verl

LossAgg = Literal["rollout", "token-mean", "seq-mean-token-mean"]
LOSS_AGGS: tuple[str, ...] = ("rollout", "token-mean", "seq-mean-token-mean")


@dataclass(frozen=True)
class LossConfig:
    loss_agg: LossAgg = "rollout"
    policy_loss: str = "vanilla"  # a name in verl's POLICY_LOSS_REGISTRY (vanilla = PPO-clip with dual clip)
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    kl_coef: float = 0.0  # > 0: add kl_coef · KL(policy ‖ reference) to the loss
    kl_type: str = "low_var_kl"  # verl's kl_penalty names: kl (k1), mse (k2), low_var_kl (k3), abs; "+" suffix too
    entropy_coef: float = 0.0  # > 0: subtract entropy_coef · entropy (a bonus)

    def __post_init__(self) -> None:
        if self.loss_agg not in LOSS_AGGS:
            raise ValueError(f"loss_agg must be one of {', '.join(LOSS_AGGS)}; got {self.loss_agg!r}")


@dataclass(frozen=True)
class BatchTotals:
    """Counts over the whole (mini-)batch that one optimizer step sees."""

    n_rollouts: int
    trained_tokens: int
    n_sequences: int  # sequences with at least one trained token


def rollout_weight(trained_tokens: int, n_rollouts: int) -> float:
    """The per-token weight 1 / max(1, T_r · N) of rollout normalization."""
    return 1.0 / max(1, trained_tokens * n_rollouts)


def normalized_advantage(advantage: float, trained_tokens: int, n_rollouts: int) -> float:
    """Â = A_r / max(1, T_r · N)."""
    return advantage * rollout_weight(trained_tokens, n_rollouts)


class PolicyLoss:
    """The loss of one (mini-)batch, evaluated micro-batch by micro-batch; the parts add up to the batch's loss."""

    def __init__(self, config: LossConfig, totals: BatchTotals) -> None:
        self.config = config
        self.totals = totals
        info: dict[str, Any] = {"dp_size": 1}
        if config.loss_agg == "rollout":
            self.verl_mode = "token-sum"
        elif config.loss_agg == "token-mean":
            self.verl_mode = "token-mean"
            info["batch_num_tokens"] = max(1, totals.trained_tokens)
        else:
            self.verl_mode = "seq-mean-token-mean"
            info["global_batch_size"] = max(1, totals.n_sequences)
        self.global_batch_info = info
        # verl's policy losses read their settings from an ActorConfig; the fields below are the ones they use.
        self.actor_config = verl().ActorConfig(
            strategy="fsdp",  # required by the dataclass, unused by the loss functions
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio=config.clip_ratio,
            clip_ratio_low=config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio,
            clip_ratio_high=config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio,
            clip_ratio_c=config.clip_ratio_c,
            loss_agg_mode=self.verl_mode,
            global_batch_info=info,
            use_torch_compile=False,
        )

    def advantages(self, advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """What the policy loss is fed: Â = A · w under rollout normalization, A otherwise."""
        return advantages * weights if self.config.loss_agg == "rollout" else advantages

    def aggregate(self, loss_mat: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Any per-token quantity (KL, entropy) aggregated the way the policy loss is."""
        agg_loss = verl().core_algos.agg_loss
        if self.config.loss_agg == "rollout":
            return agg_loss(loss_mat * weights, mask, "token-sum", dp_size=1)
        return agg_loss(loss_mat, mask, self.verl_mode, **self.global_batch_info)

    def policy(
        self,
        log_prob: torch.Tensor,
        old_log_prob: torch.Tensor,
        advantages: torch.Tensor,
        weights: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The policy-gradient loss of one micro-batch ([rows, tokens] tensors) and verl's metrics for it."""
        fn = verl().core_algos.get_policy_loss_fn(self.config.policy_loss)
        loss, metrics = fn(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=self.advantages(advantages, weights),
            response_mask=mask,
            loss_agg_mode=self.verl_mode,
            config=self.actor_config,
        )
        return loss, {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}

    def kl(self, log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
        """Per-token KL estimate of the policy against the reference (verl's kl_penalty)."""
        kl_penalty = verl().core_algos.kl_penalty
        return kl_penalty(log_prob, ref_log_prob, self.config.kl_type)
