"""Upstream definitions: where model names are served. Shared by `agl.yaml` (agl_cli.spec.schema) and the gateway."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

UpstreamKind = Literal["embedded", "openai", "anthropic", "openai-compatible", "replay"]
# The key the servers of a trained policy require when set (the trainer gives it to them; the gateway sends it).
POLICY_KEY_ENV = "AGL_POLICY_API_KEY"


class UpstreamSpec(BaseModel):
    """One entry of `upstreams:` in agl.yaml."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: UpstreamKind = Field(
        description="embedded (a local model agl serves), openai, anthropic, openai-compatible (vLLM, a proxy, a "
        "self-hosted server), or replay (answers from a recording)"
    )
    model: str | None = Field(default=None, description="embedded: the model to load (a known name or a local HF dir)")
    base_url: str | None = Field(default=None, description="the API's base URL, e.g. http://host:8000/v1")
    base_urls: list[str] | None = Field(
        default=None, description="several replicas of one model; each rollout sticks to one (prefix-cache reuse)"
    )
    api_key_env: str | None = Field(
        default=None,
        description="the environment variable holding its API key (default OPENAI_API_KEY / ANTHROPIC_API_KEY); "
        "agents never see it",
    )
    timeout_s: float = Field(
        default=600.0, gt=0,
        description="seconds one call may take in all, retries and a streamed answer included: an answer that has "
        "not ended by then fails (504, or an error event in a stream already started)",
    )
    idle_timeout_s: float | None = Field(
        default=None, gt=0,
        description="seconds the upstream may stay silent, before its first byte or between two parts of an answer, "
        "before the call fails; default: `timeout_s`",
    )
    path: str | None = Field(default=None, description="replay: the JSONL recording to answer from")
    api: Literal["openai", "anthropic"] | None = Field(default=None, description="replay: the API the recording speaks")
    record_to: str | None = Field(default=None, description="append every response of this upstream to a JSONL file")
    free: bool | None = Field(
        default=None,
        description="whether its calls cost nothing; default: embedded and loopback upstreams are free unless "
        "`prices:` names them or their model, others are priced from `prices:` and agl's shipped table (set false "
        "for a local proxy in front of a paid API)",
    )
    weights: str | None = Field(
        default=None,
        description="openai-compatible: where the served model's open weights come from (a Hugging Face id or a "
        "local folder); unset, nothing says whether they are open, and `agl advise` calls them unknown",
    )
    tool_call_parser: str | None = Field(
        default=None,
        description="embedded, trained by `agl train --backend verl` on vLLM: vLLM's tool-call parser (hermes, "
        "llama3_json, mistral, ...; `none`: no tool calls); default: the one of the model's family",
    )

    max_prompt_length: int | None = Field(
        default=None, ge=1,
        description="embedded, trained by `agl train --backend verl`: the longest prompt in tokens (a multi-turn "
        "agent's whole conversation so far) the policy servers (vLLM) take; default 4096",
    )
    max_response_length: int | None = Field(
        default=None, ge=1,
        description="embedded, trained by `agl train --backend verl`: the most tokens one answer may have; default "
        "2048. vLLM's context is the two together, which must fit the model's own limit",
    )

    @model_validator(mode="after")
    def _check(self) -> UpstreamSpec:
        if self.kind == "embedded" and not self.model:
            raise ValueError("an embedded upstream needs `model` (for example smollm2-135m-instruct)")
        if self.kind == "openai-compatible" and not (self.base_url or self.base_urls):
            raise ValueError("an openai-compatible upstream needs `base_url` or `base_urls`")
        if self.base_url and self.base_urls:
            raise ValueError("give either `base_url` or `base_urls`, not both")
        if self.kind == "replay":
            if not self.path:
                raise ValueError("a replay upstream needs `path`, the JSONL recording to answer from")
            if self.base_url or self.base_urls or self.record_to:
                raise ValueError("a replay upstream takes `path` and `api`, not `base_url(s)` or `record_to`")
        elif self.path or self.api:
            raise ValueError("`path` and `api` are for `kind: replay` (did you mean `record_to`?)")
        if self.weights is not None and self.kind != "openai-compatible":
            raise ValueError("`weights` is for `kind: openai-compatible` (an embedded upstream's `model` already names "
                             "its weights; openai and anthropic serve closed models)")
        return self

    def urls(self) -> list[str]:
        if self.base_urls:
            return list(self.base_urls)
        if self.base_url:
            return [self.base_url]
        if self.kind == "openai":
            return ["https://api.openai.com/v1"]
        if self.kind == "anthropic":
            return ["https://api.anthropic.com"]
        return []


# No model costs anywhere near this per 1M tokens (the dearest list prices are a few hundred USD): a price above it
# is a typo or a unit mix-up (per token, per 1K), and would make every cost and budget check meaningless.
MAX_PRICE_PER_M = 10_000.0


def check_price(value: Any) -> float:
    """A price in USD per 1M tokens: a finite number from 0 to MAX_PRICE_PER_M (a numeric string is read as its
    number). ValueError saying what is wrong: `true` is not a price of 1, `.inf` is not "unpriced", 1e308 is no
    price."""
    if isinstance(value, str):  # YAML 1.1 reads `1e-6` (no dot) as a string: a number all the same
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a price must be a number of USD per 1M tokens, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or number > MAX_PRICE_PER_M:
        raise ValueError(
            f"a price must be a finite number of USD per 1M tokens from 0 to {MAX_PRICE_PER_M:,.0f}, got {value!r}"
        )
    return number


class PriceSpec(BaseModel):
    """One entry of `prices:` in agl.yaml: what a model costs, in USD per 1M tokens."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0, description="USD per 1M input tokens (not read from the prompt cache)")
    output: float = Field(ge=0, description="USD per 1M output tokens, reasoning tokens included")
    cached_input: float | None = Field(
        default=None, ge=0, description="USD per 1M input tokens read from the provider's prompt cache; default: `input`"
    )
    cache_write: float | None = Field(
        default=None, ge=0, description="USD per 1M input tokens written to the prompt cache (Anthropic); default: `input`"
    )

    @field_validator("input", "output", "cached_input", "cache_write", mode="before")
    @classmethod
    def _finite_price(cls, value: Any) -> Any:
        return value if value is None else check_price(value)

    def table_entry(self) -> dict[str, float]:
        return self.model_dump(exclude_none=True)


class ResolvedUpstream(BaseModel):
    """An upstream the gateway can call now: embedded ones resolved to the URL of their running server."""

    name: str
    api: Literal["openai", "anthropic"]
    base_urls: list[str]
    api_key: str | None = Field(default=None, repr=False)
    default_model: str | None = None
    timeout_s: float = 600.0  # the whole call, retries and a streamed answer included
    idle_timeout_s: float | None = None  # the longest silence (default: timeout_s)
    # vLLM-style servers (vLLM itself, the embedded server) return token ids and logprobs when asked.
    returns_token_ids: bool = False
    # Whether calls cost nothing per token (a model we serve ourselves). None: decided by the gateway, which counts
    # upstreams that return token ids or live on a loopback address as free, and prices the rest from its table.
    free: bool | None = None
    # The policy a verl trainer trains: its servers are verl's rollout replicas, which exist only once the trainer has
    # started them; they are registered then (Gateway.set_endpoints) and calls get 503 until they are.
    registered_later: bool = False
    # The model name every call to this upstream carries (the name the registered servers answer to).
    serve_as: str | None = None
    # How the gateway reaches it, when not over the network: a transport.Transport, such as an in-process app.
    transport: Any = Field(default=None, exclude=True, repr=False)
