"""What the engine hands back (Deltas as tokens come, a Completion when done, EngineError when it fails), and
its bookkeeping for each request in flight."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .detok import TextTracker
from .sampling import Choice, SamplingParams


@dataclass
class Delta:
    """The next piece of one request's output: new token ids, their logprobs, and the text now safe to show."""

    token_ids: list[int]
    logprobs: list[Choice]
    text: str
    finish_reason: str | None  # "stop" or "length" on the last delta, else None
    model_version: str


@dataclass
class Completion:
    """A whole generation, as `Engine.generate` returns it."""

    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Choice] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    model_version: str = ""

    def extend(self, d: Delta) -> None:
        self.token_ids += d.token_ids
        self.logprobs += d.logprobs
        self.text += d.text
        self.finish_reason = d.finish_reason or self.finish_reason
        self.model_version = d.model_version


class EngineError(RuntimeError):
    """Generation failed inside the engine (not the caller's fault)."""


def merge_deltas(deltas: list[Delta]) -> Delta:
    """Several consecutive Deltas of one request as one."""
    if len(deltas) == 1:
        return deltas[0]
    return Delta(
        token_ids=[t for d in deltas for t in d.token_ids],
        logprobs=[c for d in deltas for c in d.logprobs],
        text="".join(d.text for d in deltas),
        finish_reason=deltas[-1].finish_reason,
        model_version=deltas[-1].model_version,
    )


Sink = Callable[[Delta | BaseException], None]


@dataclass(eq=False)
class RequestState:
    """The engine's bookkeeping for one request in flight."""

    prompt: list[int]
    params: SamplingParams
    max_new: int
    sink: Sink
    generator: torch.Generator
    tracker: TextTracker
    version: str = ""
    last: int = -1
    generated: int = 0
    cancelled: bool = False
    seq: Any = None  # the runner's handle on this request's sequence (its cache)
