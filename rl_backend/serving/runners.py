"""Choosing the runner that computes the engine's forward passes, and the contract every runner keeps.

A runner turns prompts into sequences and sequences into logits: `prefill` starts one sequence per prompt and returns
the logits of each prompt's last position, `decode` feeds every live sequence its next token (all of them, in the
order they joined; the fast runner also a draft of the tokens after it, see engine.py) and returns the next logits,
`release` takes the sequences that are done, `clear` forgets every sequence (after a failure), `refresh` follows new
weights loaded into the model. `counters` holds the prefill tokens computed and the prompt tokens reused from
earlier requests.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

import torch

from . import decode_kernels
from .hf_runner import HFRunner
from .linear import PRECISIONS, Precision
from .llama_runner import LlamaRunner, unsupported_reason

log = logging.getLogger(__name__)


class Runner(Protocol):
    counters: dict[str, int]

    def prefill(self, prompts: list[list[int]]) -> tuple[list[Any], torch.Tensor]: ...

    def decode(self, seqs: list[Any], tokens: list[int], drafts: list[list[int]] | None = None) -> torch.Tensor: ...

    def release(self, seqs: list[Any]) -> None: ...

    def clear(self) -> None: ...

    def refresh(self) -> None: ...


PREFIX_CACHE_ENV = "AGL_PREFIX_CACHE_MB"
# "0" keeps the fast runner's decode steps in Python instead of TorchScript (scripted.py): the same numbers, slower;
# for comparing the two, or for a torch whose TorchScript misbehaves.
SCRIPTED_DECODE_ENV = "AGL_SCRIPTED_DECODE"
_DEFAULT_PREFIX_CACHE_MB = 1024


def prefix_cache_bytes(requested_mb: int | None = None) -> int:
    """The prefix cache's budget: `requested_mb`, else $AGL_PREFIX_CACHE_MB, else 1 GiB (0 turns reuse off)."""
    if requested_mb is None:
        env = os.environ.get(PREFIX_CACHE_ENV, "").strip()
        if env and not env.isdigit():
            raise ValueError(f"${PREFIX_CACHE_ENV} must be a whole number of MiB, got {env!r}")
        requested_mb = int(env) if env else _DEFAULT_PREFIX_CACHE_MB
    if requested_mb < 0:
        raise ValueError(f"the prefix cache size must be at least 0 MiB, got {requested_mb}")
    return requested_mb << 20


def make_runner(model: Any, precision: Precision, *, fast: bool | None, cache_mb: int | None) -> Runner:
    """The fast runner where it can serve `model` (unless `fast` is False), else the Hugging Face forward."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    reason = unsupported_reason(model)
    if fast is False or (fast is None and reason is not None):
        if precision != "float32":
            raise ValueError(f"precision {precision!r} needs the fast runner, which cannot serve this model: {reason}")
        if reason is not None:
            log.info("serving through the Hugging Face forward: %s", reason)
        return HFRunner(model)
    scripted = os.environ.get(SCRIPTED_DECODE_ENV, "1").strip()
    if scripted not in ("0", "1"):
        raise ValueError(f"${SCRIPTED_DECODE_ENV} must be 0 or 1, got {scripted!r}")
    return LlamaRunner(
        model, precision=precision, prefix_cache_bytes=prefix_cache_bytes(cache_mb), scripted=scripted == "1",
        attention_kernel=decode_kernels.enabled(),
    )


