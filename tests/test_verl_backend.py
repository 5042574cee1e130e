"""The verl backend on a CPU: its rendered config against verl's own schema, the DataProto round trip on real toy
trajectories, the `agl_rollout` policy loss against the torch backend's, and verl's actor loss path updating a tiny
model. verl's FSDP engine itself registers for CUDA/NPU devices only, so it is not run here (see test at the end)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("verl") is None:  # found, not imported: importing verl configures logging
    pytest.skip("verl is not installed", allow_module_level=True)

from rl_backend.trainer.advantage import grpo_advantages  # noqa: E402
from rl_backend.trainer.batch import TrainRow, collate, make_batch  # noqa: E402
from rl_backend.trainer.loss import LossConfig, PolicyLoss  # noqa: E402
from rl_backend.trainer.toy import make_tasks, run_rollouts, tiny_llama  # noqa: E402
from rl_backend.trainer.trajectory import build_trajectories  # noqa: E402
from rl_backend.trainer.verl_backend import config as vconfig  # noqa: E402
from rl_backend.trainer.verl_backend.data import RECOMPUTE, from_data_proto, step_metrics, to_data_proto  # noqa: E402
from rl_backend.trainer.verl_backend.loss import register  # noqa: E402
from rl_backend.trainer.verl_compat import verl  # noqa: E402


@pytest.fixture(scope="module")
def toy_batch() -> Any:
    """A batch of real toy trajectories: merged two-call rows (a tool token inside the response) and split ones."""
    model = tiny_llama(seed=0)
    toy = run_rollouts(model, make_tasks(seed=0), 6, step=0, version="base")
    trajs, report = build_trajectories(toy.rollouts, toy.calls)
    assert any(n > 1 for n in report.sequences_per_rollout.values())
    return make_batch(trajs, grpo_advantages(trajs).advantages)


def _settings(**kw: Any) -> vconfig.VerlSettings:
    return vconfig.VerlSettings(spec_name="calc", model_path="HuggingFaceTB/SmolLM2-135M-Instruct", **kw)


# -- config ------------------------------------------------------------------------------------------------------


def test_rendered_config_is_accepted_by_verls_schema_and_dataclasses() -> None:
    settings = _settings(group_size=8, tasks_per_step=4, lr=3e-6, tensor_parallel=2, gpus_per_node=4,
                         gpu_memory_utilization=0.35, checkpoint_dir="/checkpoints/verl", resume=True, lora_rank=16)
    text, cfg = vconfig.rendered_config(settings)
    assert "agl train calc --backend verl" in text
    ref = cfg.actor_rollout_ref
    assert (ref.rollout.n, ref.rollout.tensor_model_parallel_size, ref.rollout.gpu_memory_utilization) == (8, 2, 0.35)
    assert ref.actor.optim.lr == 3e-6 and ref.actor.policy_loss.loss_mode == "agl_rollout"
    assert ref.actor.loss_agg_mode == "token-sum" and ref.model.lora_rank == 16
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.resume_mode) == (4, "auto")
    assert cfg.trainer.default_local_dir == "/checkpoints/verl" and cfg.algorithm.adv_estimator == "grpo"
    _, token_mean = vconfig.rendered_config(_settings(loss_agg="token-mean", kl_coef=0.01))
    assert token_mean.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    assert token_mean.actor_rollout_ref.actor.use_kl_loss is True


def test_a_misspelt_key_or_a_value_verl_rejects_fails_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    text = vconfig.render(_settings())
    with pytest.raises(vconfig.VerlConfigError, match="no config key .*clip_ratoi"):
        vconfig.validate(text.replace("clip_ratio_c:", "clip_ratoi_c:"), _settings())
    with pytest.raises(vconfig.VerlConfigError, match="verl rejects `actor_rollout_ref.actor`.*loss_agg_mode"):
        vconfig.validate(text.replace('loss_agg_mode: "token-sum"', 'loss_agg_mode: "token-avg"'), _settings())
    with pytest.raises(vconfig.VerlConfigError, match="not in verl's registry"):
        vconfig.validate(text.replace('"agl_rollout"', '"agl_rolout"'), _settings())
    with pytest.raises(vconfig.VerlConfigError, match="kl-coef"):
        vconfig.render(_settings(kl_coef=0.1))
    with pytest.raises(vconfig.VerlConfigError, match="tensor parallel size 3"):
        vconfig.render(_settings(tensor_parallel=3, gpus_per_node=4))


def test_model_path_for_known_names_local_dirs_and_hub_ids(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    assert vconfig.model_path_for("ckpt", tmp_path) == str((tmp_path / "ckpt").resolve())
    assert vconfig.model_path_for("smollm2-135m-instruct", tmp_path) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert vconfig.model_path_for("Qwen/Qwen3-8B", tmp_path) == "Qwen/Qwen3-8B"


# -- DataProto ---------------------------------------------------------------------------------------------------


def test_data_proto_has_verls_actor_keys_and_round_trips_exactly(toy_batch: Any) -> None:
    rows = list(toy_batch.rows)
    nan_row = TrainRow("r-nan", [0, 3, 7, 1, 9], [0, 0, 1, 0, 1], [0.0, 0.0, math.nan, 0.0, -1.25], 0.5, 0.125)
    rows.append(nan_row)
    dp = to_data_proto(rows, pad_id=11)
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask",
                "old_log_probs", "advantages"):
        assert key in dp.batch, key
    assert len(dp) == len(rows) and dp.meta_info["temperature"] == 1.0
    width_p = dp.batch["prompts"].shape[1]
    assert torch.equal(dp.batch["input_ids"][:, width_p:], dp.batch["responses"])
    # position ids count the real tokens only (prompts are left-padded)
    assert torch.equal(dp.batch["position_ids"][0][dp.batch["attention_mask"][0].bool()],
                       torch.arange(int(dp.batch["attention_mask"][0].sum())))
    # rollout normalization: the advantage fed to the loss is A_r · w, and 0 off the response mask
    fed = dp.batch["advantages"][0]
    mask = dp.batch["response_mask"][0].float()
    assert torch.allclose(fed, torch.tensor(rows[0].advantage * rows[0].weight, dtype=torch.float32) * mask)
    assert dp.batch[RECOMPUTE][-1].tolist()[:1] == [True] and not bool(dp.batch[RECOMPUTE][:-1].any())

    back = from_data_proto(dp)
    for before, after in zip(rows, back, strict=True):
        assert after.rollout_id == before.rollout_id and after.token_ids == before.token_ids
        assert after.loss_mask == before.loss_mask
        assert (after.advantage, after.weight) == (before.advantage, before.weight)
        want = [float(torch.tensor(x, dtype=torch.float32)) for x in before.old_logprobs]  # both backends: float32
        assert [("nan" if math.isnan(x) else x) for x in after.old_logprobs] == \
               [("nan" if math.isnan(x) else x) for x in want]
    assert to_data_proto(back, pad_id=11).batch["advantages"].equal(dp.batch["advantages"])


def test_step_metrics_flatten_verls_lists_and_names() -> None:
    metrics = step_metrics({"actor/pg_loss": [0.5, 1.5], "actor/ppo_kl": torch.tensor(0.25), "grad_norm": 2.0,
                            "perf/max_memory_allocated_gb": 1, "flag": True, "text": "x"})
    assert metrics == {"pg_loss": 1.0, "ppo_kl": 0.25, "grad_norm": 2.0, "perf_max_memory_allocated_gb": 1.0}


# -- the loss ----------------------------------------------------------------------------------------------------


def _response_logprobs(model: Any, dp: Any) -> Any:
    """log p of each response token under `model` ([B, R]), from the full padded sequence."""
    ids, attn = dp.batch["input_ids"], dp.batch["attention_mask"]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=dp.batch["position_ids"]).logits.float()
    logp = verl().F.logprobs_from_logits(logits[:, :-1], ids[:, 1:])
    width_r = dp.batch["responses"].shape[1]
    return logp[:, -width_r:]


@pytest.mark.parametrize("loss_agg", ["rollout", "token-mean", "seq-mean-token-mean"])
def test_registered_loss_equals_the_torch_backends_on_the_same_batch(toy_batch: Any, loss_agg: str) -> None:
    register()
    model = tiny_llama(seed=1).eval()  # not the sampling model: ratios differ from 1 and some get clipped
    rows = toy_batch.rows
    with torch.no_grad():
        t = collate(rows, pad_id=0)
        logp_t = verl().F.logprobs_from_logits(model(input_ids=t["input_ids"], attention_mask=t["attention_mask"])
                                               .logits[:, :-1].float(), t["input_ids"][:, 1:])
        torch_loss, _ = PolicyLoss(LossConfig(loss_agg=loss_agg), toy_batch.totals).policy(  # type: ignore[arg-type]
            logp_t, t["old_logprobs"], t["advantages"], t["weights"], t["loss_mask"])

        settings = _settings(loss_agg=loss_agg)
        _, cfg = vconfig.rendered_config(settings)
        actor = _actor_config(cfg, toy_batch)
        dp = to_data_proto(rows, pad_id=0, loss_agg=loss_agg)
        fn = verl().core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
        verl_loss, metrics = fn(old_log_prob=dp.batch["old_log_probs"], log_prob=_response_logprobs(model, dp),
                                advantages=dp.batch["advantages"], response_mask=dp.batch["response_mask"].bool(),
                                loss_agg_mode=actor.loss_agg_mode, config=actor)
    assert abs(float(verl_loss) - float(torch_loss)) < 1e-6, (float(verl_loss), float(torch_loss))
    assert metrics["actor/pg_clipfrac"] > 0 or loss_agg != "rollout"


def _actor_config(cfg: Any, batch: Any) -> Any:
    from verl.utils.config import omega_conf_to_dataclass

    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    # What verl's actor sets per mini-batch (verl/workers/utils/losses.py): global totals for the aggregation.
    actor.global_batch_info.update(dp_size=1, batch_num_tokens=batch.totals.trained_tokens,
                                   global_batch_size=batch.totals.n_sequences)
    return actor


def test_verls_other_aggregation_modes_stay_available_and_agl_rollout_refuses_them() -> None:
    register()
    core = verl().core_algos
    mat, mask = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    assert float(core.agg_loss(mat, mask, "token-mean")) == 1.5
    assert float(core.agg_loss(mat, mask, "token-sum")) == 3.0
    assert float(core.agg_loss(mat, mask, "seq-mean-token-sum")) == 3.0
    assert "vanilla" in core.POLICY_LOSS_REGISTRY and "agl_rollout" in core.POLICY_LOSS_REGISTRY
    with pytest.raises(ValueError, match="token-sum"):
        core.get_policy_loss_fn("agl_rollout")(mat, mat, mat, mask.bool(), "token-mean", None)


# -- verl's actor loss on a tiny model ---------------------------------------------------------------------------


def test_verls_actor_loss_trains_a_tiny_model_on_our_data_proto(toy_batch: Any) -> None:
    """verl's own actor loss (verl.workers.utils.losses.ppo_loss, what its FSDP engine calls per micro-batch) on our
    DataProto with `agl_rollout`: finite, equal to the torch backend's loss, and one AdamW step moves the weights.
    The forward pass is ours (the FSDP engine that would run it registers for CUDA/NPU only)."""
    from tensordict import NonTensorData
    from verl.workers.utils.losses import ppo_loss

    register()
    _, cfg = vconfig.rendered_config(_settings())
    actor = _actor_config(cfg, toy_batch)
    model = tiny_llama(seed=1)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dp = to_data_proto(toy_batch.rows, pad_id=0)
    ids, attn = dp.batch["input_ids"], dp.batch["attention_mask"]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=dp.batch["position_ids"]).logits.float()
    logp_next = verl().F.logprobs_from_logits(logits[:, :-1], ids[:, 1:])
    # verl's no-padding layout: one flat vector over the real tokens, token j holding log p(token j+1)
    flat = torch.cat([torch.cat([logp_next[i], logp_next.new_zeros(1)])[attn[i].bool()] for i in range(len(dp))])
    data = dp.batch.clone()
    for key, value in (("dp_size", 1), ("batch_num_tokens", None), ("global_batch_size", None)):
        data[key] = NonTensorData(value)
    loss, metrics = ppo_loss(actor, {"log_probs": flat}, data)
    assert torch.isfinite(loss)
    with torch.no_grad():
        t = collate(toy_batch.rows, pad_id=0)
        logp_t = verl().F.logprobs_from_logits(model(input_ids=t["input_ids"], attention_mask=t["attention_mask"])
                                               .logits[:, :-1].float(), t["input_ids"][:, 1:])
        torch_loss, _ = PolicyLoss(LossConfig(), toy_batch.totals).policy(
            logp_t, t["old_logprobs"], t["advantages"], t["weights"], t["loss_mask"])
    assert abs(float(loss.detach()) - float(torch_loss)) < 1e-6
    loss.backward()
    optimizer.step()
    moved = sum(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))
    assert moved > 0 and "actor/pg_loss" in metrics


def test_verls_fsdp_engine_is_not_available_on_a_cpu() -> None:
    """Why the FSDP engine's own train_batch is not run here: verl 0.9.1 registers it for cuda and npu only (on a
    machine without either, verl still names the device "cuda" and the engine fails at its first CUDA call), and
    `DataParallelPPOActor` (verl/workers/actor/dp_actor.py) no longer exists in 0.9.1."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl announces every optional engine it cannot import
        from verl.workers.engine import EngineRegistry

    assert importlib.util.find_spec("verl.workers.actor") is None
    devices = {key if isinstance(key, str) else key[0] for key in EngineRegistry._engines["language_model"]["fsdp"]}
    assert "cpu" not in devices and "cuda" in devices


def test_ray_workers_register_the_loss_at_start_up() -> None:
    """verl's loss registry lives in each process: the Ray workers that train must find `agl_rollout` too."""
    ray = pytest.importorskip("ray")  # installed with the verl extra
    from rl_backend.trainer.verl_backend.driver import RAY_RUNTIME_ENV

    @ray.remote
    def registered() -> bool:
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

        return vconfig.ROLLOUT_LOSS in POLICY_LOSS_REGISTRY

    ray.init(num_cpus=1, include_dashboard=False, runtime_env=RAY_RUNTIME_ENV, log_to_driver=False)
    try:
        assert ray.get(registered.remote(), timeout=120)
    finally:
        ray.shutdown()


def test_the_tensordict_for_verls_workers_is_complete(toy_batch: Any) -> None:
    """What VerlTrainer hands verl's workers per mini-batch, built on the CPU without the Ray group: rows padded to
    the data-parallel size with rows that train nothing, and every key verl's engine reads without a default."""
    from rl_backend.trainer.verl_backend.driver import VerlTrainer

    trainer = object.__new__(VerlTrainer)  # the worker group needs GPUs; _tensordict does not
    trainer.settings, trainer.pad_id, trainer.dp_size = _settings(gpus_per_node=4), 0, 4
    td = trainer._tensordict(toy_batch)
    padded = -(-len(toy_batch.rows) // 4) * 4
    assert td["mini_batch_size"] == padded and td["dp_size"] == 4
    assert td["temperature"] == 1.0  # raw logprobs, as the gateway records them
    assert td["batch_num_tokens"] == toy_batch.totals.trained_tokens
    trained = sum(int(row.sum()) for row in td["response_mask"].unbind())  # one (nested) row per sequence
    assert trained == toy_batch.totals.trained_tokens  # the padding rows train nothing
