"""The reference policy of a KL penalty without LoRA: verl builds it as a second model from `ref.fsdp_config`, so
on a CPU that config must carry the actor's CPU overrides (float32 parameters, reductions and buffers; no
torch.compile). Here the config verl's worker builds the reference from (the same steps as its
ActorRolloutRefWorker) is compared with the actor's; the end-to-end run on the tiny model is in
tests/test_verl_cpu_e2e.py (the KL term is 0 before any update)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")


def _engines(**kw: Any) -> tuple[Any, Any, Any]:
    """(actor engine config, reference engine config, the full config) as verl's worker builds them."""
    from omegaconf import open_dict
    from verl.utils.config import omega_conf_to_dataclass

    from agl_cli.training.verl_job import render_config
    from rl_backend.trainer.verl_backend.config import VerlSettings

    settings = VerlSettings(spec_name="calc", model_path="HuggingFaceTB/SmolLM2-135M-Instruct", loss_agg="token-mean",
                            kl_coef=0.1, **kw)
    _, cfg = render_config(settings)
    ref = cfg.actor_rollout_ref.ref
    with open_dict(ref):  # verl.workers.engine_workers.ActorRolloutRefWorker, "build reference model"
        ref.ppo_mini_batch_size = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    return actor.engine, omega_conf_to_dataclass(ref).engine, cfg


def test_on_a_cpu_the_reference_computes_in_float32_like_the_actor() -> None:
    actor, ref, cfg = _engines(device="cpu", policy_server="embedded")
    assert cfg.actor_rollout_ref.actor.use_kl_loss and cfg.actor_rollout_ref.model.lora_rank == 0
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    assert dict(actor.mixed_precision) == fp32
    assert dict(ref.mixed_precision) == dict(actor.mixed_precision)
    assert ref.use_torch_compile is False and actor.use_torch_compile is False
    assert ref.strategy == actor.strategy == "fsdp2" and ref.model_dtype == actor.model_dtype == "fp32"
    assert ref.forward_only is True


def test_the_reference_batches_by_the_same_token_budget_as_the_actor() -> None:
    _, _, cfg = _engines(device="cpu", policy_server="embedded", max_prompt_length=20000, max_response_length=4000)
    ref, actor = cfg.actor_rollout_ref.ref, cfg.actor_rollout_ref.actor
    assert ref.use_dynamic_bsz is True and ref.ppo_max_token_len_per_gpu == actor.ppo_max_token_len_per_gpu == 24000


def test_on_gpus_the_reference_keeps_verls_own_precision() -> None:
    actor, ref, _ = _engines(device="cuda")
    assert actor.mixed_precision is None and ref.mixed_precision is None  # verl's bf16 parameters, fp32 reductions
