"""Sampling parameters and the per-step choice of next tokens, with their log-probabilities.

Log-probabilities are always those of the model's raw distribution: log_softmax of the logits at temperature 1,
before temperature, top-p or any other shaping. This is what a trainer needs to compare the sampling policy with
the policy being trained (vLLM's default, "raw logprobs", likewise).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    """What to generate. `temperature` 0 means greedy; `max_tokens` None means up to the end of the context."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0  # alternatives to report per token (0: only the chosen token's logprob)
    ignore_eos: bool = False  # keep going past stop tokens (benchmarks); stop strings still apply

    def validate(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be between 0 and 2, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be between 0 and 20, got {self.top_logprobs}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Choice:
    """The token chosen for one row at one step."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    """A per-request generator: seeded requests reproduce, unseeded ones still never share a stream."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1))
    return gen


def choose(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> list[Choice]:
    """Pick the next token for every row of `logits` ([rows, vocab]) under that row's parameters."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    greedy_ids = logits.argmax(dim=-1)
    chosen: list[int] = greedy_ids.tolist()
    for i, p in enumerate(params):
        if not p.greedy:
            chosen[i] = _sample(logits[i], p, generators[i])
    index = torch.tensor(chosen, device=logits.device).unsqueeze(1)
    picked = logprobs.gather(1, index).squeeze(1).tolist()
    want_top = max((p.top_logprobs for p in params), default=0)
    tops: list[list[tuple[int, float]]] = [[] for _ in params]
    if want_top:
        values, ids = logprobs.topk(want_top, dim=-1)
        vals_l, ids_l = values.tolist(), ids.tolist()
        for i, p in enumerate(params):
            tops[i] = list(zip(ids_l[i][: p.top_logprobs], vals_l[i][: p.top_logprobs], strict=True))
    return [Choice(chosen[i], picked[i], tops[i]) for i in range(len(params))]


def _sample(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
    scaled = logits / p.temperature
    if p.top_p < 1.0:
        sorted_logits, order = scaled.sort(descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token once the mass before it already reaches top_p; the most likely token always stays.
        drop = (probs.cumsum(dim=-1) - probs) >= p.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        pick = torch.multinomial(torch.softmax(sorted_logits, dim=-1), 1, generator=gen)
        return int(order[pick].item())
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen).item())
