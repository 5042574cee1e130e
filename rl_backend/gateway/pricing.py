"""What a call cost: token usage times the price table shipped in `prices.json`, overridable per model."""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from urllib.parse import urlsplit

from rl_backend.gateway.config import ResolvedUpstream


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
    def parse(cls, name: str, raw: Mapping[str, float]) -> Price:
        unknown = set(raw) - {"input", "output", "cached_input", "cache_write"}
        if unknown or "input" not in raw or "output" not in raw:
            raise ValueError(
                f"price for {name!r} needs `input` and `output` (USD per 1M tokens), optionally `cached_input` and "
                f"`cache_write`; got keys {sorted(raw)}"
            )
        return cls(
            input=float(raw["input"]),
            output=float(raw["output"]),
            cached_input=None if raw.get("cached_input") is None else float(raw["cached_input"]),
            cache_write=None if raw.get("cache_write") is None else float(raw["cache_write"]),
        )


def _load_shipped() -> dict[str, Price]:
    text = resources.files("rl_backend.gateway").joinpath("prices.json").read_text(encoding="utf-8")
    return {name: Price.parse(name, raw) for name, raw in json.loads(text)["models"].items()}


@functools.lru_cache(maxsize=256)
def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def upstream_is_free(upstream: ResolvedUpstream) -> bool:
    if upstream.free is not None:
        return upstream.free
    return upstream.returns_token_ids or (bool(upstream.base_urls) and all(is_loopback_url(u) for u in upstream.base_urls))


class PriceTable:
    def __init__(self, overrides: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self._prices = _load_shipped()
        for name, raw in (overrides or {}).items():
            self._prices[name] = Price.parse(name, raw)

    def lookup(self, model: str | None) -> Price | None:
        """Exact name, else the longest known name that prefixes it at a '-' (dated snapshots)."""
        if not model:
            return None
        if model in self._prices:
            return self._prices[model]
        best: str | None = None
        for name in self._prices:
            if model.startswith(name + "-") and (best is None or len(name) > len(best)):
                best = name
        return None if best is None else self._prices[best]

    def cost(self, models: list[str | None], usage: Usage, *, free: bool) -> float | None:
        """USD for this usage; 0 for a free upstream; None when the model has no price or usage is unknown."""
        if free:
            return 0.0
        price = next((p for p in (self.lookup(m) for m in models) if p is not None), None)
        if price is None or usage.input_tokens is None or usage.output_tokens is None:
            return None
        cached = usage.cached_tokens or 0
        written = usage.cache_write_tokens or 0
        plain = max(usage.input_tokens - cached - written, 0)
        total = plain * price.input + usage.output_tokens * price.output
        total += cached * (price.cached_input if price.cached_input is not None else price.input)
        total += written * (price.cache_write if price.cache_write is not None else price.input)
        return total / 1e6
