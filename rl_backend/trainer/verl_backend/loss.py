"""agl's rollout-normalized policy loss as a verl policy loss, `agl_rollout` in verl's POLICY_LOSS_REGISTRY.

verl's actor calls a policy loss with (old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)
and nothing else of the batch, so the per-rollout weight 1 / max(1, T_r · N) cannot arrive as a tensor of its own:
data.py puts Â = A_r · w in the DataProto's `advantages` (what rl_backend/trainer/loss.py feeds verl's loss too).
PPO-clip is linear in a positive scaling of the advantage, so the token-sum of the clipped loss on Â is exactly the
rollout-weighted loss. `agl_rollout` is verl's own `vanilla` PPO-clip aggregated by token sum (times the data-parallel
size verl passes in `global_batch_info`, so that FSDP's gradient averaging gives the global sum); it refuses any
other aggregation mode, since pre-weighted advantages under `token-mean` would be normalized twice.
"""

from __future__ import annotations

import functools
from typing import Any

# agl's rollout normalization, as a verl policy loss: advantages arrive pre-weighted, summed over tokens.
ROLLOUT_LOSS = "agl_rollout"


@functools.cache
def register() -> str:
    """Register `agl_rollout` (once per process; every verl worker process that trains must call it)."""
    from rl_backend.trainer.verl_compat import verl

    core_algos = verl().core_algos

    @core_algos.register_policy_loss(ROLLOUT_LOSS)
    def agl_rollout_policy_loss(
        old_log_prob: Any,
        log_prob: Any,
        advantages: Any,
        response_mask: Any,
        loss_agg_mode: str = "token-sum",
        config: Any = None,
        rollout_is_weights: Any = None,
    ) -> tuple[Any, dict[str, Any]]:
        if loss_agg_mode != "token-sum":
            raise ValueError(f"policy loss {ROLLOUT_LOSS!r} sums pre-weighted advantages over tokens: set "
                             f"actor.loss_agg_mode to token-sum, not {loss_agg_mode!r}")
        return core_algos.compute_policy_loss_vanilla(
            old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
            loss_agg_mode="token-sum", config=config, rollout_is_weights=rollout_is_weights,
        )

    return ROLLOUT_LOSS
