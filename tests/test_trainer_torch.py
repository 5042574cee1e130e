"""The torch backend on a tiny random Llama: metrics, micro-batching, recomputed logprobs, KL, LoRA, checkpoints."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("verl") is None:  # found, not imported: importing verl configures logging
    pytest.skip("verl is not installed", allow_module_level=True)

from rl_backend.trainer.advantage import grpo_advantages  # noqa: E402
from rl_backend.trainer.batch import TrainBatch, make_batch  # noqa: E402
from rl_backend.trainer.loss import LossConfig  # noqa: E402
from rl_backend.trainer.torch_backend import LoraSettings, TorchTrainer, TrainerConfig  # noqa: E402
from rl_backend.trainer.toy import make_tasks, run_rollouts, tiny_llama  # noqa: E402
from rl_backend.trainer.trajectory import build_trajectories  # noqa: E402

pytestmark = pytest.mark.usefixtures("two_torch_threads")


def toy_batch(model: object, step: int = 0, *, drop_logprobs: bool = False) -> TrainBatch:
    toy = run_rollouts(model, make_tasks(), 8, step=step, version=f"step-{step}")
    if drop_logprobs:
        for calls in toy.calls.values():
            for c in calls:
                c.logprobs = None
    trajs, _ = build_trajectories(toy.rollouts, toy.calls)
    return make_batch(trajs, grpo_advantages(trajs).advantages)


def params(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.serving_state_dict().items()}


def test_one_step_metrics_and_on_policy_logprobs() -> None:
    trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=1e-2))
    before = params(trainer)
    batch = toy_batch(trainer.model)
    m = trainer.train_step(batch)
    for key in ("loss", "entropy", "grad_norm", "tokens_per_s", "ppo_kl", "pg_clipfrac", "logprob_abs_diff"):
        assert math.isfinite(m[key]), key
    # the sampler's recorded logprobs are the trainer's own: the shift and masks line up
    assert m["logprob_abs_diff"] < 1e-4
    assert m["entropy"] > 2.0  # near uniform over 12 tokens at random init (ln 12 = 2.48)
    assert m["rollouts"] == 16 and m["optimizer_steps"] == 1 and trainer.step == 1
    after = params(trainer)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_micro_batching_and_checkpointing_do_not_change_the_gradient() -> None:
    batch = toy_batch(tiny_llama())
    norms = []
    for budget, checkpointing in ((4096, False), (8, False), (8, True)):
        cfg = TrainerConfig(lr=1e-3, micro_batch_tokens=budget, gradient_checkpointing=checkpointing)
        norms.append(TorchTrainer(tiny_llama(), cfg).train_step(batch))
    for other in norms[1:]:
        assert norms[0]["grad_norm"] == pytest.approx(other["grad_norm"], rel=1e-4)
        assert norms[0]["loss"] == pytest.approx(other["loss"], abs=1e-6)


def test_missing_logprobs_are_recomputed_from_the_current_policy() -> None:
    trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=1e-2))
    m = trainer.train_step(toy_batch(trainer.model, drop_logprobs=True))
    assert m["ppo_kl"] == pytest.approx(0.0, abs=1e-6) and m["logprob_abs_diff"] < 1e-6


def test_at_a_sampling_temperature_the_old_logprobs_are_those_of_the_tempered_policy() -> None:
    """The engine records raw (temperature 1) logprobs; tokens sampled at T come from softmax(logits / T). The
    trainer at logit_temperature T recomputes the old logprobs at T (the sync loop's weights sampled the batch), so
    the first update's ratio is 1, not the raw-vs-tempered gap."""
    trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=1e-2, logit_temperature=0.5))
    batch = toy_batch(trainer.model)
    recorded = [lp for row in batch.rows for lp in row.old_logprobs if lp != 0.0]
    assert recorded and all(math.isfinite(lp) for lp in recorded)
    m = trainer.train_step(batch)
    assert m["ppo_kl"] == pytest.approx(0.0, abs=1e-6) and m["logprob_abs_diff"] < 1e-5
    assert m["pg_clipfrac"] == 0.0


def test_kl_to_reference_is_zero_then_grows() -> None:
    cfg = TrainerConfig(lr=2e-2, loss=LossConfig(kl_coef=0.1), ppo_epochs=2)
    trainer = TorchTrainer(tiny_llama(), cfg)
    first = trainer.train_step(toy_batch(trainer.model, 0))
    second = trainer.train_step(toy_batch(trainer.model, 1))
    assert first["kl"] == pytest.approx(0.0, abs=1e-7) and second["kl"] > 1e-6
    # 2 epochs x 2 mini-batches of whole rollouts; the KL measured after the first optimizer step is no longer 0
    split = TorchTrainer(tiny_llama(), TrainerConfig(lr=2e-2, loss=LossConfig(kl_coef=0.1), ppo_epochs=2, mini_batches=2))
    m = split.train_step(toy_batch(split.model, 0))
    assert m["optimizer_steps"] == 4 and m["kl"] > 1e-6


def test_lora_trains_only_the_adapter_and_serves_merged_weights() -> None:
    pytest.importorskip("peft")
    trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=5e-2, lora=LoraSettings(r=4, alpha=8)))
    plain = tiny_llama()
    assert trainer.trainable_parameters < sum(p.numel() for p in plain.parameters()) / 4
    trainer.train_step(toy_batch(trainer.model, 0))
    trainer.train_step(toy_batch(trainer.model, 1))
    merged = trainer.serving_state_dict()
    plain.load_state_dict(merged, strict=True)  # the base model's own key names
    ids = torch.tensor([[0, 2, 5, 1]])
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
        got = plain(input_ids=ids).logits
        base = tiny_llama()(input_ids=ids).logits
    assert torch.allclose(expected, got, atol=1e-5)
    assert not torch.allclose(base, got, atol=1e-5)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_checkpoint_resumes_exactly(tmp_path: Path, lora: bool) -> None:
    if lora:
        pytest.importorskip("peft")
    cfg = TrainerConfig(lr=1e-2, lora=LoraSettings(r=4, alpha=8) if lora else None, loss=LossConfig(kl_coef=0.05))
    trainer = TorchTrainer(tiny_llama(), cfg)
    trainer.train_step(toy_batch(trainer.model, 0))
    path = trainer.save_checkpoint(tmp_path / "step-1", {"model_version": "step-1"})
    assert (path / "model" / "model.safetensors").is_file() and (path / "optimizer.pt").is_file()
    assert (path / "adapter").is_dir() == lora and not (tmp_path / "step-1.tmp").exists()
    batch = toy_batch(trainer.model, 1)
    trainer.train_step(batch)
    resumed = TorchTrainer.from_checkpoint(path)
    assert resumed.step == 1 and resumed.config == cfg
    resumed.train_step(batch)
    a, b = params(trainer), params(resumed)
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_hands_weights_to_the_serving_engine() -> None:
    engine_mod = pytest.importorskip("rl_backend.serving.engine")
    from rl_backend.serving.model_store import LoadedModel

    served = tiny_llama()
    loaded = LoadedModel(name="tiny", path=Path("."), model=served.eval(), tokenizer=None, stop_token_ids=frozenset(),
                         context_length=64)
    engine = engine_mod.Engine(loaded).start()
    try:
        trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=1e-2))
        trainer.train_step(toy_batch(trainer.model))
        engine.load_state_dict(trainer.serving_state_dict(), "step-1", timeout_s=30)
        assert engine.model_version == "step-1"
        theirs = served.state_dict()
        assert all(torch.equal(theirs[k], v) for k, v in trainer.model.state_dict().items())
    finally:
        engine.stop()
