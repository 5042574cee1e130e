"""Checking and reading new weights for a served model (what the trainer hands over between steps)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch


def check_state_dict(model: Any, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Raise ValueError unless `state_dict` fits `model`: known keys, same shapes, nothing missing.

    A key may be left out when its tensor is tied to one that is given (for example `lm_head.weight` tied to the
    input embeddings), as checkpoints saved by transformers do.
    """
    own = model.state_dict()
    unknown = sorted(k for k in state_dict if k not in own)
    if unknown:
        raise ValueError(f"the new weights have keys this model does not: {unknown[:5]}{' …' if len(unknown) > 5 else ''}")
    wrong = [
        f"{k}: {tuple(v.shape)} != {tuple(own[k].shape)}"
        for k, v in state_dict.items()
        if tuple(v.shape) != tuple(own[k].shape)
    ]
    if wrong:
        raise ValueError(f"the new weights have the wrong shape for: {wrong[:5]}")
    given_storage = {own[k].data_ptr() for k in state_dict}
    missing = sorted(k for k, t in own.items() if k not in state_dict and t.data_ptr() not in given_storage)
    if missing:
        raise ValueError(f"the new weights lack: {missing[:5]}{' …' if len(missing) > 5 else ''}")


def read_weights_dir(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a Hugging Face checkpoint directory, on the CPU."""
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory")
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        from safetensors.torch import load_file

        out: dict[str, torch.Tensor] = {}
        for shard in shards:
            out.update(load_file(str(shard), device="cpu"))
        return out
    bins = sorted(path.glob("pytorch_model*.bin"))
    if bins:
        merged: dict[str, torch.Tensor] = {}
        for b in bins:
            merged.update(torch.load(b, map_location="cpu", weights_only=True))
        return merged
    raise ValueError(f"{path} holds no *.safetensors or pytorch_model*.bin weights")
