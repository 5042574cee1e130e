"""The verl backend's pieces, each on its own: its rendered config against verl's own schema (and only keys its code
path reads), the DataProto round trip on real toy trajectories with padding that trains nothing, the `agl_rollout`
policy loss against the torch backend's, verl's actor loss path updating a tiny model, the `cpu` platform that
registers verl's FSDP engine for the CPU, what every Ray worker registers, the resource pool, the LoRA adapter
merge of the embedded policy server and the export of a trained model. The whole driver runs in
tests/test_verl_cpu_e2e.py."""

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
from rl_backend.trainer.verl_backend.data import (  # noqa: E402
    RECOMPUTE,
    ROLLOUT_LOGPROBS,
    fill_unrecorded,
    from_data_proto,
    pad_rows,
    step_metrics,
    to_data_proto,
)
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


def _rendered(settings: vconfig.VerlSettings) -> tuple[str, Any]:
    from agl_cli.training.verl_job import render_config

    return render_config(settings)


# -- config ------------------------------------------------------------------------------------------------------


def test_rendered_config_is_accepted_by_verls_schema_and_dataclasses() -> None:
    settings = _settings(lr=3e-6, tensor_parallel=2, gpus_per_node=4, gpu_memory_utilization=0.35, lora_rank=16)
    text, cfg = _rendered(settings)
    assert "agl train calc --backend verl" in text
    ref = cfg.actor_rollout_ref
    assert (ref.rollout.name, ref.rollout.tensor_model_parallel_size, ref.rollout.gpu_memory_utilization) == \
        ("vllm", 2, 0.35)
    assert ref.actor.optim.lr == 3e-6 and ref.actor.policy_loss.loss_mode == "agl_rollout"
    assert ref.actor.loss_agg_mode == "token-sum" and ref.model.lora_rank == 16
    # vLLM's OpenAI server cannot select an adapter verl loads in-process: on GPUs the adapter is merged.
    assert ref.model.lora.merge is True and ref.rollout.load_format == "dummy"
    assert ref.actor.strategy == "fsdp2" and ref.rollout.checkpoint_engine.backend == "naive"
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.total_training_steps) == (4, 8)
    assert cfg.algorithm.rollout_correction.rollout_is == "token"
    _, token_mean = _rendered(_settings(loss_agg="token-mean", kl_coef=0.01))
    assert token_mean.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    assert token_mean.actor_rollout_ref.actor.use_kl_loss is True


def test_the_cpu_config_serves_from_the_embedded_engine_in_float32() -> None:
    _, cfg = _rendered(_settings(device="cpu", policy_server="embedded", lora_rank=12))
    ref = cfg.actor_rollout_ref
    assert ref.rollout.name == "agl_embedded" and ref.rollout.load_format == "auto"
    assert ref.model.lora.merge is False  # the embedded server takes the adapter itself (a hot-load)
    assert dict(ref.actor.fsdp_config.mixed_precision) == {"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                             "buffer_dtype": "fp32"}
    assert cfg.trainer.device == "cpu"


def test_the_cpu_config_for_vllm_turns_off_what_vllms_cpu_build_lacks() -> None:
    """vLLM's CPU build has no sleep mode and would compile for minutes: the servers keep their memory, run eagerly
    in float32 (the actor's precision on a CPU), and take the weights through a shared-memory bucket."""
    _, cfg = _rendered(_settings(device="cpu", policy_server="vllm", tool_call_parser="hermes"))
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.name == "vllm" and rollout.load_format == "dummy" and rollout.dtype == "float32"
    assert (rollout.enforce_eager, rollout.free_cache_engine, rollout.enable_sleep_mode) == (True, False, False)
    assert rollout.checkpoint_engine.update_weights_bucket_megabytes == 512
    assert dict(rollout.engine_kwargs.vllm) == {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    _, gpu = _rendered(_settings(tool_call_parser=None))
    assert gpu.actor_rollout_ref.rollout.dtype == "bfloat16" and gpu.actor_rollout_ref.rollout.enable_sleep_mode
    assert not gpu.actor_rollout_ref.rollout.engine_kwargs.vllm  # no parser: vLLM starts without tool calls


def test_only_keys_the_verl_path_reads_are_rendered() -> None:
    """The dry run once validated `data.*`, `trainer.default_local_dir`, `rollout.n` and the like, which never
    reached the code: what is rendered now is what the driver (RayPPOTrainer and its workers) reads."""
    text, _ = _rendered(_settings())
    for absent in ("data:", "default_local_dir", "resume_mode", "adv_estimator", '"n":', "temperature:",
                   "ppo_mini_batch_size", "save_freq", "max_actor_ckpt_to_keep"):
        assert absent not in text, absent


def test_attention_is_sdpa_unless_flash_attn_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl defaults to flash_attention_2, which neither extra installs."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    assert vconfig.default_attention() == "sdpa"
    _, cfg = _rendered(_settings(attn_implementation=vconfig.default_attention()))
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a))
    assert vconfig.default_attention() == "flash_attention_2"


def test_a_misspelt_key_or_a_value_verl_rejects_fails_on_the_cpu() -> None:
    text, _ = _rendered(_settings())
    with pytest.raises(vconfig.VerlConfigError, match="no config key .*clip_ratoi"):
        vconfig.validate(text.replace("clip_ratio_c:", "clip_ratoi_c:"), _settings())
    with pytest.raises(vconfig.VerlConfigError, match="verl rejects `actor_rollout_ref.actor`.*loss_agg_mode"):
        vconfig.validate(text.replace('loss_agg_mode: "token-sum"', 'loss_agg_mode: "token-avg"'), _settings())
    with pytest.raises(vconfig.VerlConfigError, match="not in verl's registry"):
        vconfig.validate(text.replace('"agl_rollout"', '"agl_rolout"'), _settings())
    for bad, message in ((_settings(kl_coef=0.1), "kl-coef"), (_settings(tensor_parallel=3, gpus_per_node=4),
                         "tensor parallel size 3"),
                         (_settings(device="cpu", tensor_parallel=2, gpus_per_node=2), "vLLM on a CPU"),
                         (_settings(rollout_dtype="fp8"), "rollout dtype 'fp8'"),
                         (_settings(policy_server="embedded", tensor_parallel=2, gpus_per_node=2), "no tensor")):
        with pytest.raises(vconfig.VerlConfigError, match=message):
            bad.check()


def test_model_path_for_local_dirs_known_names_and_hub_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_backend.serving import model_store

    (tmp_path / "ckpt").mkdir()
    assert vconfig.model_path_for("ckpt", tmp_path) == str((tmp_path / "ckpt").resolve())
    # A known name: the same local weights `agl eval` serves (converted from the packaged GGUF), never a download.
    monkeypatch.setattr(model_store, "resolve_model_dir", lambda name: tmp_path / "converted" / name)
    assert vconfig.model_path_for("smollm2-135m-instruct", tmp_path) == str(tmp_path / "converted" /
                                                                           "smollm2-135m-instruct")
    assert vconfig.model_path_for("Qwen/Qwen3-8B", tmp_path) == "Qwen/Qwen3-8B"


# -- DataProto ---------------------------------------------------------------------------------------------------


def test_data_proto_has_verls_actor_keys_and_round_trips_exactly(toy_batch: Any) -> None:
    rows = list(toy_batch.rows)
    nan_row = TrainRow("r-nan", [0, 3, 7, 1, 9], [0, 0, 1, 0, 1], [0.0, 0.0, math.nan, 0.0, -1.25], 0.5, 0.125)
    rows.append(nan_row)
    dp = to_data_proto(rows, pad_id=11)
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask",
                ROLLOUT_LOGPROBS, "advantages"):
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


def test_padding_rows_train_nothing_and_count_no_token(toy_batch: Any) -> None:
    """Every data-parallel rank gets as many rows; the added ones have an empty response mask, so verl (which
    counts trained tokens from the response mask) neither trains them nor counts them under token-mean."""
    rows = list(toy_batch.rows)
    padded = pad_rows(rows, 4, pad_id=0)
    assert len(padded) % 4 == 0 and len(padded) >= len(rows) and padded[:len(rows)] == rows
    dp = to_data_proto(padded, pad_id=0, loss_agg="token-mean")
    assert int(dp.batch["response_mask"].sum()) == toy_batch.totals.trained_tokens
    assert float(dp.batch["advantages"][len(rows):].abs().sum()) == 0.0


def test_unrecorded_logprobs_take_the_actors_recomputed_ones() -> None:
    rows = [TrainRow("r", [0, 3, 7, 1, 9], [0, 0, 1, 0, 1], [0.0, 0.0, math.nan, 0.0, -1.25], 0.5, 1.0)]
    dp = to_data_proto(rows, pad_id=11)
    dp.batch["old_log_probs"] = torch.full_like(dp.batch[ROLLOUT_LOGPROBS], -3.0)
    assert fill_unrecorded(dp) == 1
    assert dp.batch[ROLLOUT_LOGPROBS][0].tolist()[:3] == [-3.0, 0.0, -1.25]


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

        _, cfg = _rendered(_settings(loss_agg=loss_agg))
        actor = _actor_config(cfg, toy_batch)
        dp = to_data_proto(rows, pad_id=0, loss_agg=loss_agg)
        fn = verl().core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
        verl_loss, metrics = fn(old_log_prob=dp.batch[ROLLOUT_LOGPROBS], log_prob=_response_logprobs(model, dp),
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
    The recorded logprobs stand for the old ones here (verl recomputes them before an update)."""
    from tensordict import NonTensorData
    from verl.workers.utils.losses import ppo_loss

    register()
    _, cfg = _rendered(_settings())
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
    data["old_log_probs"] = data[ROLLOUT_LOGPROBS]
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


CPU_PLATFORM = """
import os, warnings
os.environ["VERL_PLATFORM"] = "cpu"
warnings.simplefilter("ignore")
from rl_backend.trainer.verl_backend.cpu import register
register()
from verl.utils.device import get_device_id, get_device_name, get_nccl_backend, get_resource_name
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
engines = EngineRegistry._engines["language_model"]
assert engines["fsdp2"]["cpu"] is FSDPEngineWithLMHead is engines["fsdp2"]["cuda"]
print(get_device_name(), get_device_id(), get_nccl_backend(), get_resource_name())
"""


def test_the_cpu_platform_gives_verls_fsdp_engine_to_the_cpu() -> None:
    """verl 0.9.1 ships no CPU platform and registers its FSDP engine for cuda and npu only; agl's `cpu` platform
    (VERL_PLATFORM=cpu) registers the same engine class for the CPU. In a process of its own: verl resolves its
    platform once per process."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CPU_PLATFORM], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-4:] == ["cpu", "cpu", "gloo", "CPU"]


def test_ray_workers_register_what_verl_looks_up_by_name() -> None:
    """verl's registries live in each process: the Ray workers find the loss, the rollout backend and its replica."""
    ray = pytest.importorskip("ray")  # installed with the verl extra
    from rl_backend.trainer.verl_backend.embedded_policy import ROLLOUT_NAME
    from rl_backend.trainer.verl_backend.plugins import SETUP_HOOK

    @ray.remote
    def registered() -> list[bool]:
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
        from verl.workers.rollout.base import _ROLLOUT_REGISTRY
        from verl.workers.rollout.replica import RolloutReplicaRegistry

        return [vconfig.ROLLOUT_LOSS in POLICY_LOSS_REGISTRY, (ROLLOUT_NAME, "async") in _ROLLOUT_REGISTRY,
                RolloutReplicaRegistry.get(ROLLOUT_NAME).__name__ == "EmbeddedReplica"]

    ray.init(num_cpus=1, include_dashboard=False, runtime_env={"worker_process_setup_hook": SETUP_HOOK},
             log_to_driver=False)
    try:
        assert ray.get(registered.remote(), timeout=120) == [True, True, True]
    finally:
        ray.shutdown()


def test_the_resource_pool_asks_for_one_cpu_per_device() -> None:
    """verl's default pool asks 3 to 10 CPUs per GPU bundle (more than a 4-CPU pod has: placement waited forever);
    FSDP runs actor, rollout adapter and reference in one process, so one CPU per device is what it needs."""
    from verl.trainer.ppo.ray_trainer import Role

    from rl_backend.trainer.verl_backend.trainer import _resource_pool_manager

    manager, role = _resource_pool_manager(_settings(gpus_per_node=8, nnodes=2))
    assert manager.max_colocate_count == 1 and manager.resource_pool_spec == {"global_pool": [8, 8]}
    assert role == Role.ActorRollout
    # A KL penalty on full fine-tuning needs a reference model of its own; with LoRA it is the actor sans adapter.
    assert _resource_pool_manager(_settings(loss_agg="token-mean", kl_coef=0.1))[1] == Role.ActorRolloutRef
    assert _resource_pool_manager(_settings(loss_agg="token-mean", kl_coef=0.1, lora_rank=8))[1] == Role.ActorRollout


# -- the embedded policy server's adapter hot-load, and the export of the trained model ------------------------------


def _peft_tiny(rank: int = 4) -> Any:
    from peft import LoraConfig, get_peft_model

    model = tiny_llama(seed=2)
    peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    return peft


def test_the_adapter_hot_load_serves_what_peft_merges() -> None:
    from rl_backend.trainer.verl_backend.embedded_policy import merge_adapter

    peft = _peft_tiny()
    base = {k: v.detach().clone() for k, v in peft.get_base_model().state_dict().items()}
    base = {k.replace(".base_layer.", "."): v for k, v in base.items() if "lora_" not in k}
    adapter = {k: v for k, v in peft.state_dict().items() if "lora_" in k}
    served = merge_adapter(base, adapter, {"r": 4, "lora_alpha": 8})
    merged = peft.merge_and_unload().state_dict()
    assert set(served) == set(merged)
    assert all(torch.allclose(served[k], merged[k], atol=1e-6) for k in merged)
    with pytest.raises(ValueError, match="no lora_A"):
        merge_adapter(base, {"model.norm.weight": base["model.norm.weight"]}, {"r": 4})


def test_export_copies_a_full_checkpoint_and_refuses_one_without_its_model(tmp_path: Path) -> None:
    from rl_backend.trainer.verl_backend.export import ExportError, export_trained

    hf = tmp_path / "actor" / "huggingface"
    tiny_llama(seed=3).save_pretrained(hf)
    written = export_trained(tmp_path / "actor", tmp_path / "trained-model", tmp_path / "trained-adapter")
    assert written == {"model": str(tmp_path / "trained-model")}
    assert (tmp_path / "trained-model" / "config.json").is_file() and not (tmp_path / "trained-adapter").exists()
    with pytest.raises(ExportError, match="hf_model"):
        export_trained(tmp_path / "nothing", tmp_path / "out")
