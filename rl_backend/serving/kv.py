"""The batch's key/value cache: left-padded rows that join, leave and shrink between decode steps.

Rows are stored the way Hugging Face models expect a padded batch: every layer holds keys and values of shape
[batch, kv_heads, T, head_dim], row i's real entries are its last `lengths[i]` columns, and `mask` ([batch, T], 1 for
real) hides the padding on the left. Joining a row pads the shorter side on the left; leaving drops the row and the
columns no remaining row uses, so T stays the longest live row rather than the longest row ever seen.

Only this module touches the cache object's internals (transformers 5 keeps them in `cache.layers[i].keys/values`,
4.x in `cache.key_cache[i]`/`cache.value_cache[i]`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _get(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


def _set(cache: Any, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    if hasattr(cache, "layers"):
        for layer, (k, v) in zip(cache.layers, tensors, strict=True):
            layer.keys, layer.values = k, v
    else:
        cache.key_cache[:] = [k for k, _ in tensors]
        cache.value_cache[:] = [v for _, v in tensors]


def new_cache(model: Any) -> Any:
    """An empty cache for `model`; its full-attention layers append in place instead of re-concatenating."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers 4.x takes no config
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    grow = _growing_layer_class()
    if grow is not None and layers and all(type(layer) is grow.__base__ for layer in layers):
        cache.layers = [grow() for _ in layers]
    return cache


_GROWING: list[Any] = []


def _growing_layer_class() -> Any:
    """DynamicLayer with spare capacity (transformers 5), or None where there is no such layer class."""
    if _GROWING:
        return _GROWING[0]
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        _GROWING.append(None)
        return None

    class GrowingLayer(DynamicLayer):
        # DynamicLayer concatenates the whole cache with each new token (O(T) copying per step and layer). This keeps
        # `keys`/`values` as views into buffers with room to spare. When BatchCache replaces `keys`/`values`
        # (rows joining or leaving), the next update notices and re-buffers once.
        _kbuf: torch.Tensor | None = None
        _vbuf: torch.Tensor | None = None

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized or self.keys is None or self.keys.numel() == 0:
                self.lazy_initialization(key_states, value_states)
                self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
                self._kbuf = self._vbuf = None
            assert self.keys is not None and self.values is not None
            used, new = self.keys.shape[-2], key_states.shape[-2]
            kbuf, vbuf = self._kbuf, self._vbuf
            if (
                kbuf is None
                or vbuf is None
                or self.keys.data_ptr() != kbuf.data_ptr()
                or self.keys.shape[:2] != kbuf.shape[:2]
                or used + new > kbuf.shape[-2]
            ):
                cap = used + new + max(64, (used + new) // 4)
                kbuf = _with_capacity(self.keys, cap)
                vbuf = _with_capacity(self.values, cap)
                self._kbuf, self._vbuf = kbuf, vbuf
            kbuf[:, :, used : used + new] = key_states
            vbuf[:, :, used : used + new] = value_states
            self.keys, self.values = kbuf[:, :, : used + new], vbuf[:, :, : used + new]
            return self.keys, self.values

    _GROWING.append(GrowingLayer)
    return GrowingLayer


def _with_capacity(x: torch.Tensor, cap: int) -> torch.Tensor:
    buf = x.new_empty((x.shape[0], x.shape[1], cap, x.shape[3]))
    buf[:, :, : x.shape[2]] = x
    return buf


class BatchCache:
    """A padded batch KV cache plus the bookkeeping to feed the next decode step."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [B, T] long
        self.lengths: list[int] = []  # real tokens cached per row

    @property
    def size(self) -> int:
        return len(self.lengths)

    def add(self, caches: list[Any]) -> None:
        """Append rows, each a single-row cache from a prefill (no padding), in order."""
        parts = [_get(c) for c in caches]
        lens = [p[0][0].shape[-2] for p in parts]
        if self.cache is not None:
            parts.insert(0, _get(self.cache))
            assert self.mask is not None
            masks = [self.mask]
        else:
            masks = []
        masks += [torch.ones((1, n), dtype=torch.long, device=parts[-1][0][0].device) for n in lens]
        width = max(m.shape[1] for m in masks)
        merged: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in range(len(parts[0])):
            ks = [_left_pad(p[layer][0], width) for p in parts]
            vs = [_left_pad(p[layer][1], width) for p in parts]
            merged.append((torch.cat(ks, dim=0), torch.cat(vs, dim=0)))
        self.mask = torch.cat([F.pad(m, (width - m.shape[1], 0)) for m in masks], dim=0)
        if self.cache is None:
            self.cache = caches[0]
        _set(self.cache, merged)
        self.lengths += lens

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (indices into the current batch), in that order; drop padding nobody needs."""
        if not rows:
            self.clear()
            return
        if rows == list(range(self.size)):
            return
        assert self.mask is not None
        lengths = [self.lengths[i] for i in rows]
        start = self.mask.shape[1] - max(lengths)
        index = torch.tensor(rows, device=self.mask.device)
        kept = [
            (k.index_select(0, index)[:, :, start:].contiguous(), v.index_select(0, index)[:, :, start:].contiguous())
            for k, v in _get(self.cache)
        ]
        _set(self.cache, kept)
        self.mask = self.mask.index_select(0, index)[:, start:].contiguous()
        self.lengths = lengths

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention mask and position ids for feeding one new token per row (the cache grows by one column)."""
        assert self.mask is not None
        ones = torch.ones((self.size, 1), dtype=torch.long, device=self.mask.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        positions = torch.tensor(self.lengths, dtype=torch.long, device=self.mask.device).unsqueeze(1)
        self.lengths = [n + 1 for n in self.lengths]
        return self.mask, positions

    def clear(self) -> None:
        self.cache = None
        self.mask = None
        self.lengths = []


def _left_pad(x: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - x.shape[-2]
    return F.pad(x, (0, 0, missing, 0)) if missing else x
