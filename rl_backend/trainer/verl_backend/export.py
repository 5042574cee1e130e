"""The trained model out of a verl checkpoint: a Hugging Face folder any server loads, and for LoRA a PEFT adapter.

verl's FSDP checkpoint (`<step>/actor/`) holds the sharded training state and, with `hf_model` in its save contents,
`huggingface/`: the model's config, tokenizer and weights. For full fine-tuning that folder is the trained model.
For LoRA it holds the peft-wrapped weights under peft's names (`base_model.model.<name>.base_layer.weight`,
`...lora_A.default.weight`) beside `lora_train_meta.json` (rank and alpha): agl writes the merged model (what the
embedded server and vLLM load) and the adapter in PEFT's own format (`adapter_config.json`,
`adapter_model.safetensors`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

_PEFT_PREFIX = "base_model.model."
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                    "generation_config.json", "vocab.json", "merges.txt", "tokenizer.model")


class ExportError(RuntimeError):
    """The checkpoint lacks what the export needs; the message names the file."""


def export_trained(actor_dir: Path, model_dir: Path, adapter_dir: Path | None = None) -> dict[str, str]:
    """Write the servable model from verl checkpoint folder `actor_dir` into `model_dir` (and, for LoRA, the PEFT
    adapter into `adapter_dir`); returns what was written, by kind."""
    hf = actor_dir / "huggingface"
    if not (hf / "config.json").is_file():
        raise ExportError(f"{hf} has no config.json: the checkpoint was saved without `hf_model` in save_contents")
    meta_path = actor_dir / "lora_train_meta.json"
    shutil.rmtree(model_dir, ignore_errors=True)
    if not meta_path.is_file():
        shutil.copytree(hf, model_dir)
        return {"model": str(model_dir)}
    from safetensors.torch import load_file, save_file

    weights: dict[str, Any] = {}
    for shard in sorted(hf.glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    if not weights:
        raise ExportError(f"{hf} holds no *.safetensors weights")
    meta = json.loads(meta_path.read_text())
    rank, alpha = int(meta["r"]), float(meta.get("lora_alpha") or meta["r"])
    base, adapter = _split_peft(weights)
    if not adapter:
        raise ExportError(f"{hf} has no LoRA weights although {meta_path.name} says the run trained rank {rank}")
    merged = dict(base)
    modules: set[str] = set()
    for layer in sorted({k.rsplit(".lora_", 1)[0] for k in adapter}):
        a, b = adapter.get(f"{layer}.lora_A.weight"), adapter.get(f"{layer}.lora_B.weight")
        if a is None or b is None or f"{layer}.weight" not in merged:
            raise ExportError(f"LoRA layer {layer!r} lacks lora_A, lora_B or its base weight in {hf}")
        target = merged[f"{layer}.weight"]
        merged[f"{layer}.weight"] = (target.float() + (b.float() @ a.float()) * (alpha / rank)).to(target.dtype)
        modules.add(layer.rsplit(".", 1)[-1])
    model_dir.mkdir(parents=True)
    for name in ("config.json", *_TOKENIZER_FILES):
        if (hf / name).is_file():
            shutil.copy2(hf / name, model_dir / name)
    save_file({k: v.contiguous() for k, v in merged.items()}, str(model_dir / "model.safetensors"),
              metadata={"format": "pt"})
    written = {"model": str(model_dir)}
    if adapter_dir is not None:
        shutil.rmtree(adapter_dir, ignore_errors=True)
        adapter_dir.mkdir(parents=True)
        save_file({f"{_PEFT_PREFIX}{k}": v.contiguous() for k, v in adapter.items()},
                  str(adapter_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
        config = json.loads((hf / "config.json").read_text())
        (adapter_dir / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "task_type": meta.get("task_type") or "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
            "lora_dropout": 0.0, "bias": "none", "target_modules": sorted(modules), "fan_in_fan_out": False,
            "base_model_name_or_path": config.get("_name_or_path") or "", "inference_mode": True,
        }, indent=2))
        written["adapter"] = str(adapter_dir)
    return written


def _split_peft(weights: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """peft-named weights -> (base weights under the model's own names, adapter weights as `<layer>.lora_X.weight`)."""
    base: dict[str, Any] = {}
    adapter: dict[str, Any] = {}
    for key, value in weights.items():
        name = key.removeprefix(_PEFT_PREFIX)
        if ".lora_A." in name or ".lora_B." in name:
            layer, part = name.split(".lora_", 1)
            adapter[f"{layer}.lora_{part[0]}.weight"] = value
        elif ".lora_" in name:
            continue  # dropout and embedding adapters carry no weight to export
        else:
            base[name.replace(".base_layer.", ".")] = value
    return base, adapter
