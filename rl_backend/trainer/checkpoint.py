"""Checkpoints of the torch trainer, and the weights it hands to the serving engine.

A checkpoint directory:

    model/              Hugging Face model directory (config, safetensors, tokenizer when known): servable as is,
                        LoRA merged in
    adapter/            LoRA only: the peft adapter, what training resumes from
    initial/            only when the starting weights have no path on disk and are still needed (the LoRA base,
                        or the KL reference of full fine-tuning)
    optimizer.pt        the optimizer's state
    trainer_state.json  step, TrainerConfig, base model path, whatever the loop adds (model version, metrics)

Written to `<dir>.tmp` and renamed, so a crash never leaves a half checkpoint under the final name. This module knows
the layout only: it writes from, and reads back into, whatever has a trainer's parts (`TrainerParts`); the torch
trainer (torch_backend.py) assembles itself from what `load_weights` and `restore_optimizer` return.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from rl_backend.serving.model_store import quiet_progress

FORMAT = 1


class TrainerParts(Protocol):
    """What a checkpoint holds of a trainer (TorchTrainer has it); read only."""

    @property
    def model(self) -> Any: ...
    @property
    def tokenizer(self) -> Any: ...
    @property
    def reference(self) -> Any: ...  # the frozen KL reference of full fine-tuning, or None
    @property
    def base_model_path(self) -> str | None: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def step(self) -> int: ...
    @property
    def config(self) -> Any: ...  # with to_dict()


@dataclass
class LoadedWeights:
    """A checkpoint's models, before a trainer is built around them."""

    model: Any
    tokenizer: Any
    reference: Any


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config")


def _base_state_dict(model: Any, *, merged: bool) -> dict[str, torch.Tensor]:
    """The weights of a peft-wrapped model under the base model's names; with `merged`, adapter deltas added."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out = {
        k.replace(".base_layer.", "."): v.detach()
        for k, v in base.state_dict().items()
        if "lora_" not in k
    }
    if merged:
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                layer: Any = module  # get_delta_weight lives on the concrete layer classes
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        key = f"{name}.weight"
                        out[key] = (out[key] + layer.get_delta_weight(adapter)).detach()
    return out


def serving_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Weights for `Engine.load_state_dict`. For full fine-tuning they share memory with the live weights: hand them
    over before the next train_step (the engine copies them before it returns)."""
    sd = _base_state_dict(model, merged=True) if is_peft(model) else {k: v.detach() for k, v in model.state_dict().items()}
    return {k: v.to("cpu") for k, v in sd.items()}


def _save_hf(model: Any, state_dict: dict[str, torch.Tensor] | None, folder: Path, tokenizer: Any) -> None:
    # One save per step: transformers' progress bar would interleave with agl's one line per step.
    with quiet_progress():
        if state_dict is None:
            model.save_pretrained(str(folder))
        else:
            model.save_pretrained(str(folder), state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def save_checkpoint(trainer: TrainerParts, directory: Path, extra: dict[str, Any]) -> Path:
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    lora = is_peft(trainer.model)
    if lora:
        base = trainer.model.get_base_model()
        _save_hf(base, serving_state_dict(trainer.model), tmp / "model", trainer.tokenizer)
        trainer.model.save_pretrained(str(tmp / "adapter"))
        if trainer.base_model_path is None:
            _save_hf(base, _base_state_dict(trainer.model, merged=False), tmp / "initial", None)
    else:
        _save_hf(trainer.model, None, tmp / "model", trainer.tokenizer)
        if trainer.reference is not None and trainer.base_model_path is None:
            _save_hf(trainer.reference, None, tmp / "initial", None)
    torch.save({"optimizer": trainer.optimizer.state_dict()}, tmp / "optimizer.pt")
    state = {
        "format": FORMAT,
        "step": trainer.step,
        "lora": lora,
        "base_model_path": trainer.base_model_path,
        "config": trainer.config.to_dict(),
        "saved_at": time.time(),
        **extra,
    }
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2, default=str))
    if directory.exists():
        shutil.rmtree(directory)
    tmp.rename(directory)
    return directory


def read_state(directory: Path) -> dict[str, Any]:
    path = directory / "trainer_state.json"
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a trainer checkpoint (no trainer_state.json)")
    state: dict[str, Any] = json.loads(path.read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"{directory}: checkpoint format {state.get('format')} is not {FORMAT}")
    return state


def load_weights(directory: Path, state: dict[str, Any], *, dtype: torch.dtype, kl_reference: bool) -> LoadedWeights:
    """The model a checkpoint continues from (LoRA: its base with the adapter, trainable), its tokenizer, and — for
    full fine-tuning with `kl_reference` — the frozen initial weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    initial = directory / "initial"
    start_path = str(initial) if initial.is_dir() else state.get("base_model_path")
    reference = None
    model: Any
    if state["lora"]:
        from peft import PeftModel

        if start_path is None:
            raise ValueError(f"{directory}: LoRA checkpoint without its base model path")
        base = AutoModelForCausalLM.from_pretrained(start_path, dtype=dtype)
        model = PeftModel.from_pretrained(base, str(directory / "adapter"), is_trainable=True)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(directory / "model"), dtype=dtype)
        if kl_reference:
            if start_path is None:
                raise ValueError(f"{directory}: KL needs the initial weights, and the checkpoint has no path to them")
            reference = AutoModelForCausalLM.from_pretrained(start_path, dtype=dtype).eval().requires_grad_(False)
    tokenizer = None
    with contextlib.suppress(Exception):
        tokenizer = AutoTokenizer.from_pretrained(str(directory / "model"))
    return LoadedWeights(model, tokenizer, reference)


def restore_optimizer(optimizer: torch.optim.Optimizer, directory: Path, device: torch.device) -> None:
    """The optimizer's saved moments, onto `device`."""
    saved = torch.load(directory / "optimizer.pt", map_location=device, weights_only=True)
    optimizer.load_state_dict(saved["optimizer"])
