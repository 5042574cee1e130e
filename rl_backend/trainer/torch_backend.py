"""The embedded trainer: one policy-gradient update of a Hugging Face causal LM on the CPU or one GPU.

`TorchTrainer.train_step(batch)` takes a TrainBatch (batch.py) and, for each PPO epoch and each mini-batch of whole
rollouts, accumulates gradients over micro-batches (rows packed up to `micro_batch_tokens` padded tokens) and takes
one optimizer step. The loss is verl's PPO-clip policy loss against the old logprobs the serving engine recorded
(loss.py), normalized per rollout by default, plus an optional KL to a reference model (the initial weights; for
LoRA, the base model with the adapter switched off) and an optional entropy bonus.

Full fine-tuning, or LoRA through `peft` (`TrainerConfig.lora`). Checkpoints (checkpoint.py) are Hugging Face model
directories in safetensors plus the optimizer state, and resume exactly.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_backend.trainer import checkpoint
from rl_backend.trainer.batch import TrainBatch, collate, micro_batches, split_by_rollout
from rl_backend.trainer.checkpoint import is_peft
from rl_backend.trainer.loss import LossConfig, PolicyLoss
from rl_backend.trainer.verl_compat import verl


@dataclass(frozen=True)
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0  # dropout makes the policy being trained differ from the one that sampled
    target_modules: str | list[str] = "all-linear"


@dataclass(frozen=True)
class TrainerConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 2048  # padded tokens per forward pass: the memory knob
    ppo_epochs: int = 1
    mini_batches: int = 1  # optimizer steps per epoch, each over whole rollouts
    max_seq_len: int | None = None
    loss: LossConfig = field(default_factory=LossConfig)
    lora: LoraSettings | None = None
    device: str = "cpu"  # never left to verl's default device, which is "cuda"
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    # The temperature the rollouts were sampled at: the loss models that distribution. The engine records raw
    # (temperature 1) logprobs, so at any other temperature the old logprobs are recomputed (see _prepare).
    logit_temperature: float = 1.0
    seed: int = 0  # LoRA adapter initialisation

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerConfig:
        data = dict(data)
        data["loss"] = LossConfig(**data.get("loss", {}))
        data["lora"] = LoraSettings(**data["lora"]) if data.get("lora") else None
        data["betas"] = tuple(data.get("betas", (0.9, 0.999)))
        return cls(**data)


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


class TorchTrainer:
    """Owns the policy model, its optimizer and (when needed) the reference; see the module docstring."""

    def __init__(
        self,
        model: Any,
        config: TrainerConfig,
        *,
        tokenizer: Any = None,
        base_model_path: str | Path | None = None,
        reference: Any = None,
    ) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.tokenizer = tokenizer
        self.base_model_path = str(base_model_path) if base_model_path is not None else None
        self.step = 0
        model = model.to(device=self.device, dtype=_dtype(config.dtype))
        if config.lora is not None and not is_peft(model):
            from peft import LoraConfig, get_peft_model

            lora = config.lora
            with torch.random.fork_rng(devices=[]):  # seeded adapter init without touching the caller's RNG
                torch.manual_seed(config.seed)
                model = get_peft_model(
                    model,
                    LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                               target_modules=lora.target_modules, task_type="CAUSAL_LM"),
                )
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if config.lora is not None:
                model.enable_input_require_grads()
        self.model = model
        self.model.train()
        self.reference = reference
        if config.loss.kl_coef > 0 and reference is None and config.lora is None:
            # Full fine-tuning: the reference is a frozen copy of the weights training starts from.
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self.pad_id = int(pad) if pad is not None else 0  # any id works: padding is masked out

    @classmethod
    def from_pretrained(cls, path: str | Path, config: TrainerConfig, **kwargs: Any) -> TorchTrainer:
        """Train the Hugging Face model directory at `path` (its tokenizer, if any, is kept for checkpoints)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_dtype(config.dtype))
        tokenizer = None
        with contextlib.suppress(Exception):  # a bare weights directory has no tokenizer; that is fine here
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        return cls(model, config, tokenizer=tokenizer, base_model_path=path, **kwargs)

    @property
    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    # -- forward -----------------------------------------------------------------------------------------------

    def _logprobs(
        self, model: Any, t: dict[str, torch.Tensor], *, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log p(token_t | tokens_<t) for t = 1..L-1 ([B, L-1]), and the entropy at trained positions if asked."""
        verl_F = verl().F
        out = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], use_cache=False)
        logits = out.logits[:, :-1, :].float()
        if self.config.logit_temperature != 1.0:
            logits = logits / self.config.logit_temperature
        logp = verl_F.logprobs_from_logits(logits, t["input_ids"][:, 1:])
        ent = None
        if entropy:
            # Only at trained positions: the full [B, L, V] softmax is the largest tensor of the step.
            ent = torch.zeros_like(logp)
            where = t["loss_mask"] > 0
            ent[where] = verl_F.entropy_from_logits(logits[where])
        return logp, ent

    @contextlib.contextmanager
    def _reference(self) -> Iterator[Any]:
        if self.reference is not None:
            yield self.reference
        elif self.config.lora is not None:
            with self.model.disable_adapter():
                yield self.model
        else:
            raise RuntimeError("no reference model: KL needs kl_coef > 0 at construction")

    def _prepare(self, micro: list[dict[str, torch.Tensor]]) -> None:
        """Fill old logprobs the calls did not record, and the reference's logprobs, before any weight changes."""
        need_ref = self.config.loss.kl_coef > 0
        # Tokens sampled at temperature T came from softmax(logits / T); the recorded logprobs are of softmax(logits).
        # The weights that sampled them are these (the sync loop updates the engine after each step), so the
        # sampling distribution's logprobs are recomputed here rather than taken from the record.
        tempered = self.config.logit_temperature != 1.0
        with torch.no_grad():
            for t in micro:
                if tempered:
                    t["recompute"] = t["loss_mask"] > 0
                if bool(t["recompute"].any()):
                    logp, _ = self._logprobs(self.model, t, entropy=False)
                    t["old_logprobs"] = torch.where(t["recompute"], logp, t["old_logprobs"])
                if need_ref:
                    with self._reference() as ref:
                        t["ref_logprobs"], _ = self._logprobs(ref, t, entropy=False)

    # -- the update --------------------------------------------------------------------------------------------

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy update over `batch`; returns its metrics (loss, entropy, kl, grad_norm, tokens_per_s, ...)."""
        if not batch.rows:
            raise ValueError("the batch has no trainable rows")
        cfg = self.config
        started = time.perf_counter()
        minis = split_by_rollout(batch, cfg.mini_batches)
        prepared = []
        for mini in minis:
            micro = [collate(rows, self.pad_id, self.device) for rows in micro_batches(mini.rows, cfg.micro_batch_tokens)]
            self._prepare(micro)
            prepared.append((mini, micro))
        sums: dict[str, float] = {}

        def add(key: str, value: float) -> None:
            sums[key] = sums.get(key, 0.0) + value

        opt_steps = skipped = 0
        grad_norms: list[float] = []
        tokens_seen = 0
        for epoch in range(cfg.ppo_epochs):
            for mini, micro in prepared:
                fn = PolicyLoss(cfg.loss, mini.totals)
                self.optimizer.zero_grad(set_to_none=True)
                step_loss = 0.0
                for t in micro:
                    mask, weights = t["loss_mask"], t["weights"]
                    n_tok = float(mask.sum())
                    want_entropy = epoch == 0 or cfg.loss.entropy_coef > 0
                    logp, ent = self._logprobs(self.model, t, entropy=want_entropy)
                    loss, pg_metrics = fn.policy(logp, t["old_logprobs"], t["advantages"], weights, mask)
                    add("pg_loss", float(loss.detach()))
                    if cfg.loss.kl_coef > 0:
                        kl_mat = fn.kl(logp, t["ref_logprobs"])
                        loss = loss + cfg.loss.kl_coef * fn.aggregate(kl_mat, mask, weights)
                        if epoch == 0:
                            add("kl_sum", float((kl_mat.detach() * mask).sum()))
                    if cfg.loss.entropy_coef > 0 and ent is not None:
                        loss = loss - cfg.loss.entropy_coef * fn.aggregate(ent, mask, weights)
                    loss.backward()
                    step_loss += float(loss.detach())
                    tokens_seen += int(t["attention_mask"].sum())
                    if epoch == 0:
                        add("trained_tokens", n_tok)
                        if ent is not None:
                            add("entropy_sum", float((ent.detach() * mask).sum()))
                        # How far the trainer's logprobs are from those the engine recorded (0 if identical).
                        add("logprob_diff_sum", float(((logp.detach() - t["old_logprobs"]).abs() * mask).sum()))
                    for k, v in pg_metrics.items():
                        add(k.removeprefix("actor/") + "_tw", v * n_tok)  # token-weighted across micro-batches
                    add("metric_tokens", n_tok)
                norm = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.model.parameters() if p.requires_grad], cfg.max_grad_norm
                )
                if not torch.isfinite(norm):
                    # A non-finite gradient would poison Adam's moments for good: skip this step instead.
                    self.optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                    continue
                self.optimizer.step()
                opt_steps += 1
                grad_norms.append(float(norm))
                add("loss", step_loss)
        elapsed = time.perf_counter() - started
        if opt_steps:  # the version only moves when the weights did
            self.step += 1
        trained = max(1.0, sums.get("trained_tokens", 0.0))
        metric_tokens = max(1.0, sums.get("metric_tokens", 0.0))
        metrics: dict[str, float] = {
            "step": float(self.step),
            "loss": sums.get("loss", 0.0) / max(1, opt_steps),
            "pg_loss": sums.get("pg_loss", 0.0) / max(1, cfg.ppo_epochs * len(minis)),
            "entropy": sums.get("entropy_sum", 0.0) / trained,
            "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
            "optimizer_steps": float(opt_steps),
            "skipped_steps": float(skipped),
            "logprob_abs_diff": sums.get("logprob_diff_sum", 0.0) / trained,
            "rollouts": float(batch.totals.n_rollouts),
            "sequences": float(len(batch.rows)),
            "trained_tokens": float(batch.totals.trained_tokens),
            "tokens": float(batch.tokens),
            "tokens_per_s": tokens_seen / elapsed if elapsed > 0 else 0.0,
            "time_s": elapsed,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
        }
        if cfg.loss.kl_coef > 0:
            metrics["kl"] = sums.get("kl_sum", 0.0) / trained
        for key in list(sums):
            if key.endswith("_tw"):
                metrics[key.removesuffix("_tw")] = sums[key] / metric_tokens
        return metrics

    # -- weights out -------------------------------------------------------------------------------------------

    def serving_state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights under the base model's own names (LoRA merged in), on the CPU, for the engine."""
        return checkpoint.serving_state_dict(self.model)

    def save_checkpoint(self, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
        return checkpoint.save_checkpoint(self, Path(directory), extra or {})

    @classmethod
    def from_checkpoint(cls, directory: str | Path, config: TrainerConfig | None = None) -> TorchTrainer:
        """A trainer that continues exactly where the checkpoint left off (weights, optimizer moments, step)."""
        directory = Path(directory)
        state = checkpoint.read_state(directory)
        cfg = config or TrainerConfig.from_dict(state["config"])
        weights = checkpoint.load_weights(directory, state, dtype=_dtype(cfg.dtype), kl_reference=cfg.loss.kl_coef > 0)
        trainer = cls(weights.model, cfg, tokenizer=weights.tokenizer, base_model_path=state.get("base_model_path"),
                      reference=weights.reference)
        if weights.reference is not None:
            trainer.reference = weights.reference.to(trainer.device)
        checkpoint.restore_optimizer(trainer.optimizer, directory, trainer.device)
        for group in trainer.optimizer.param_groups:  # the moments resume; the hyperparameters are the config's
            group.update(lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        trainer.step = int(state["step"])
        return trainer
