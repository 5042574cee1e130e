"""What a call cost: token usage times a price per 1M tokens, declared in agl.yaml (`prices:`) or shipped in
`prices.json`. A call with no price has an unknown cost (None), never 0."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from rl_backend.gateway.config import PriceSpec, ResolvedUpstream, check_price
from rl_backend.netaddr import is_loopback_url

# A declared price as agl.yaml's `prices:` gives it, or as a mapping with the same keys.
DeclaredPrice = PriceSpec | Mapping[str, float]


@dataclass
class Usage:
    """Token counts of one call. input_tokens counts every prompt token, cached ones included (OpenAI's convention;
    Anthropic's separate cache counts are added in by its adapter)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    cache_write_tokens: int | None = None


@dataclass(frozen=True)
class Price:
    """USD per 1M tokens."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None

    @classmethod
    def parse(cls, name: str, raw: DeclaredPrice) -> Price:
        if isinstance(raw, PriceSpec):
            raw = raw.table_entry()
        unknown = set(raw) - {"input", "output", "cached_input", "cache_write"}
        if unknown or "input" not in raw or "output" not in raw:
            raise ValueError(
                f"price for {name!r} needs `input` and `output` (USD per 1M tokens), optionally `cached_input` and "
                f"`cache_write`; got keys {sorted(raw)}"
            )
        values: dict[str, float | None] = {}
        for key in ("input", "output", "cached_input", "cache_write"):
            try:
                values[key] = None if raw.get(key) is None else check_price(raw[key])
            except ValueError as exc:
                raise ValueError(f"price for {name!r}, `{key}`: {exc}") from None
        return cls(**values)  # type: ignore[arg-type]


def _load_shipped() -> dict[str, Price]:
    text = resources.files("rl_backend.gateway").joinpath("prices.json").read_text(encoding="utf-8")
    return {name: Price.parse(name, raw) for name, raw in json.loads(text)["models"].items()}


def upstream_is_free(upstream: ResolvedUpstream) -> bool:
    if upstream.free is not None:
        return upstream.free
    return upstream.returns_token_ids or (bool(upstream.base_urls) and all(is_loopback_url(u) for u in upstream.base_urls))


class PriceTable:
    """The shipped prices (`prices.json`, by model name) under the declared ones (agl.yaml's `prices:`, keyed by
    `upstream/model` or by a model name for every upstream). A declared price wins over the shipped one, and over
    the rule that counts loopback and token-id upstreams as free (an upstream with any price declared for it is a
    paid one); only `free: true` on the upstream beats it."""

    def __init__(self, declared: Mapping[str, DeclaredPrice | Price] | None = None) -> None:
        self._shipped = _load_shipped()
        self._declared = {
            name: raw if isinstance(raw, Price) else Price.parse(name, raw) for name, raw in (declared or {}).items()
        }

    def find(self, model: str | None, upstream: str | None = None) -> tuple[Price | None, bool]:
        """The price of `model` on `upstream`, and whether it was declared (not shipped). An exact name wins (the
        upstream's own entry first, then the declared, then the shipped one); else the longest name that prefixes
        `model` at a '-' (a dated snapshot such as gpt-4o-2024-08-06), a declared one on a tie."""
        if not model:
            return None, False
        scoped = f"{upstream}/" if upstream else None
        for table, key, declared in ((self._declared, f"{scoped}{model}" if scoped else None, True),
                                     (self._declared, model, True), (self._shipped, model, False)):
            if key is not None and key in table:
                return table[key], declared
        best: tuple[int, int, Price, bool] | None = None  # (length of the matched name, priority, price, declared)
        candidates = [(name.removeprefix(scoped) if scoped and name.startswith(scoped) else name, 2 if scoped and
                       name.startswith(scoped) else 1, price, True) for name, price in self._declared.items()]
        candidates += [(name, 0, price, False) for name, price in self._shipped.items()]
        for name, priority, price, declared in candidates:
            if model.startswith(name + "-") and (best is None or (len(name), priority) > best[:2]):
                best = (len(name), priority, price, declared)
        return (best[2], best[3]) if best is not None else (None, False)

    def lookup(self, model: str | None, upstream: str | None = None) -> Price | None:
        return self.find(model, upstream)[0]

    def _priced(self, upstream: ResolvedUpstream, models: list[str | None]) -> tuple[Price | None, bool]:
        for model in models:
            price, declared = self.find(model, upstream.name)
            if price is not None:
                return price, declared
        return None, False

    def is_free(self, upstream: ResolvedUpstream, models: list[str | None]) -> bool:
        """`free:` when the upstream says; else a loopback or token-id upstream is free, unless prices are declared
        for it (any `upstream/...` entry: then its other models are paid too, and unknown until priced) or for the
        model."""
        if upstream.free is not None:
            return upstream.free
        if not upstream_is_free(upstream):
            return False
        scoped = f"{upstream.name}/"
        return not any(name.startswith(scoped) for name in self._declared) and not self._priced(upstream, models)[1]

    def knows(self, upstream: ResolvedUpstream, model: str | None) -> bool:
        """Whether a call of `model` on `upstream` will have a cost (free, or priced), before making it."""
        return self.is_free(upstream, [model]) or self._priced(upstream, [model])[0] is not None

    def most(self, upstream: ResolvedUpstream, model: str | None, input_tokens: int, output_tokens: int) -> float | None:
        """USD a call of `model` costs at most with these many tokens: every input token at the dearest input rate
        (plain, cached or cache write), every output token at the output rate; 0 when free, None when unpriced."""
        if self.is_free(upstream, [model]):
            return 0.0
        price, _ = self._priced(upstream, [model])
        if price is None:
            return None
        rates = [r for r in (price.input, price.cached_input, price.cache_write) if r is not None]
        return (input_tokens * max(rates) + output_tokens * price.output) / 1e6

    def cost(self, upstream: ResolvedUpstream, models: list[str | None], usage: Usage) -> float | None:
        """USD for this usage; 0 for a free upstream; None when no model has a price or the usage is unknown."""
        if self.is_free(upstream, models):
            return 0.0
        price, _ = self._priced(upstream, models)
        if price is None or usage.input_tokens is None or usage.output_tokens is None:
            return None
        cached = usage.cached_tokens or 0
        written = usage.cache_write_tokens or 0
        plain = max(usage.input_tokens - cached - written, 0)
        total = plain * price.input + usage.output_tokens * price.output
        total += cached * (price.cached_input if price.cached_input is not None else price.input)
        total += written * (price.cache_write if price.cache_write is not None else price.input)
        return total / 1e6
