"""The general runner: any Hugging Face causal LM through its own forward, for what the fast runner cannot serve
(other architectures, GPUs).

Each admitted prompt is prefilled on its own, unpadded, so its first token is computed exactly as when it runs
alone; then the batch decodes together with a left-padded KV cache (`kv.py`), a padding-aware attention mask and
per-row position ids. Batching changes only the order of floating-point sums inside the kernels: a row's logprobs
agree with an unbatched run to about 1e-5.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .kv import BatchCache, new_cache


class _Row:
    """A sequence in the batch (its place in the batch is its index in HFRunner._rows)."""


class HFRunner:
    """Prefill and decode through the model's own forward; sequences are opaque handles."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._device = next(model.parameters()).device
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._batch = BatchCache(model)
        self._rows: list[_Row] = []
        self.counters = {"prefill_tokens": 0, "reused_tokens": 0}

    def refresh(self) -> None:
        """New weights were loaded in place: nothing is cached across requests, so nothing to redo."""

    def _forward(self, input_ids: torch.Tensor, cache: Any, **kw: Any) -> torch.Tensor:
        out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}, **kw)
        return out.logits[:, -1, :]

    def prefill(self, prompts: list[list[int]]) -> tuple[list[_Row], torch.Tensor]:
        caches, logits = [], []
        for prompt in prompts:
            cache = new_cache(self.model)
            ids = torch.tensor([prompt], dtype=torch.long, device=self._device)
            logits.append(self._forward(ids, cache))
            caches.append(cache)
            self.counters["prefill_tokens"] += len(prompt)
        rows = [_Row() for _ in prompts]
        self._batch.add(caches)
        self._rows += rows
        return rows, torch.cat(logits)

    def decode(self, seqs: list[_Row], tokens: list[int], drafts: list[list[int]] | None = None) -> torch.Tensor:
        if drafts is not None:  # its padded batch computes a row with the others: a draft's rows would not be exact
            raise ValueError("the Hugging Face runner decodes one token per row; it checks no drafts")
        if seqs != self._rows:
            raise RuntimeError("decode must feed every live row, in the order they joined")
        mask, positions = self._batch.step_inputs()
        ids = torch.tensor([[t] for t in tokens], dtype=torch.long, device=self._device)
        return self._forward(ids, self._batch.cache, attention_mask=mask, position_ids=positions)

    def release(self, seqs: list[_Row]) -> None:
        gone = {id(s) for s in seqs}
        keep = [i for i, r in enumerate(self._rows) if id(r) not in gone]
        self._rows = [self._rows[i] for i in keep]
        self._batch.keep(keep)

    def clear(self) -> None:
        self._rows = []
        self._batch.clear()
