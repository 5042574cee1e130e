"""The contract between the proxy loop and one API's adapter, plus the request checks and usage parsing they share.

An adapter (one per API: chat, completions, responses, messages, messages-over-chat) turns the agent's request into
the upstream's, and the upstream's answer — one JSON body or a stream of events — back into exactly what the agent
asked for, collecting on the way what the call record needs (`Outcome`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rl_backend.gateway.errors import Dialect, GatewayError
from rl_backend.gateway.knobs import apply_knobs
from rl_backend.gateway.pricing import Usage
from rl_backend.gateway.routing import Route
from rl_backend.gateway.sse import SSEEvent
from rl_backend.store.records import Api


@dataclass
class Outcome:
    response: dict[str, Any] | None = None
    usage: Usage = field(default_factory=Usage)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    model_version: str | None = None
    upstream_model: str | None = None  # the model name the upstream reported (may be a dated snapshot)
    error: str | None = None  # an error the upstream reported inside a 200 (a stream's error event)


class Exchange(ABC):
    """One call through one API. Subclasses set the class attributes and implement the abstract hooks."""

    api: Api
    dialect: Dialect
    path: str  # upstream path, appended to the replica's base URL
    asks_token_ids: ClassVar[bool] = True  # whether a vLLM-style upstream returns token ids for this API
    # Whether the agent gets the upstream's own bytes (so an answer too big to hold can pass through unread), not a
    # translation of them.
    passes_through: ClassVar[bool] = True

    def __init__(self, body: dict[str, Any], route: Route, *, token_ids: bool, knobs: Mapping[str, Any]) -> None:
        """Check the agent's request (GatewayError 400), then make the request as recorded: a copy naming the
        routed model, with the rollout's knobs applied."""
        self.validate(body)
        self.route = route
        self.stream = body.get("stream") is True
        # Ask the upstream for token ids and logprobs (vLLM-style) and record them.
        self.token_ids = token_ids and self.asks_token_ids
        self.outcome = Outcome()
        self.output_started = False  # set by process_event at the first generated content (for ttft)
        self.keep_limit: int | None = None  # set when the answer outgrew what the record keeps (oversize.py)
        request = dict(body)
        request["model"] = route.model
        self.knobs_applied = apply_knobs(self.api, request, knobs)
        self.request_record = request

    @staticmethod
    @abstractmethod
    def validate(body: dict[str, Any]) -> None:
        """Raise GatewayError (400) for a request this API would refuse."""

    @abstractmethod
    def upstream_body(self) -> dict[str, Any]:
        """The request the upstream gets."""

    def upstream_headers(self, agent_headers: dict[str, str]) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "text/event-stream" if self.stream else "application/json"}
        key = self.route.upstream.api_key
        if self.route.upstream.api == "anthropic":
            headers["anthropic-version"] = agent_headers.get("anthropic-version", "2023-06-01")
            if "anthropic-beta" in agent_headers:
                headers["anthropic-beta"] = agent_headers["anthropic-beta"]
            if key:
                headers["x-api-key"] = key
        elif key:
            headers["authorization"] = f"Bearer {key}"
        return headers

    @abstractmethod
    def process_response(self, data: Any) -> Any:
        """A complete (non-streamed) 2xx body: fill the outcome, return what the agent gets."""

    @abstractmethod
    def process_event(self, event: SSEEvent) -> list[bytes]:
        """One upstream stream event: fill the outcome, return the bytes to forward (maybe none). Raises ValueError
        for an event that cannot be understood."""

    @abstractmethod
    def is_terminal(self, event: SSEEvent) -> bool:
        """The event that ends the stream: the record is committed before it is forwarded."""

    def collect(self) -> None:  # noqa: B027 - an optional hook: most adapters fill the outcome event by event
        """Fill the outcome from what a stream delivered (also a stream cut short)."""

    def stop_keeping(self, limit: int) -> None:
        """The answer passed `limit` bytes: from now on keep only what is small (usage, model, finish reasons)."""
        self.keep_limit = limit
        self._stop_keeping()

    def _stop_keeping(self) -> None:  # noqa: B027 - adapters that collect a stream's text override it
        """Stop collecting the stream's text, token ids and logprobs."""

    def usage_of(self, usage: Any) -> Usage:
        """Usage as the upstream's API words it (ImpossibleUsage when it cannot be true)."""
        return usage_from_anthropic(usage) if self.route.upstream.api == "anthropic" else usage_from_openai(usage)

    def error_from_upstream(self, status: int, body: bytes, content_type: str) -> tuple[bytes, str]:
        """The body and content type the agent gets for an upstream error status; translators reshape it."""
        return body, content_type

    def finish_stream(self) -> list[bytes]:
        """The upstream stream ended: bytes the agent still needs (translators close their framing)."""
        return []

    @abstractmethod
    def stream_complete(self) -> bool:
        """Whether the stream reached its natural end (a terminal event), rather than being cut off."""

    @abstractmethod
    def error_event(self, message: str) -> bytes:
        """An in-stream error the agent's SDK raises, for failures after the first byte."""


# -- request checks -----------------------------------------------------------------------------------------------


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def check_optional(body: dict[str, Any], name: str, kind: str) -> None:
    """400 unless body[name] is absent, null, or of `kind`: bool, int, number, string, object, array."""
    if name not in body or body[name] is None:
        return
    value = body[name]
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value),
        "string": isinstance(value, str),
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
    }[kind]
    if not ok:
        raise bad_request(f"`{name}` must be {'an' if kind[0] in 'aio' else 'a'} {kind}, got {_type_name(value)}", name)


def check_messages(body: dict[str, Any], *, roles_key: str = "role") -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"`messages` must be a non-empty array of message objects, got {_type_name(messages)}", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get(roles_key), str):
            raise bad_request(f"`messages[{i}]` must be an object with a string `{roles_key}`", f"messages[{i}]")
    return messages


def check_fields(body: dict[str, Any], **names_by_kind: tuple[str, ...]) -> None:
    """check_optional for many fields: `int=("n", "seed"), bool=(...)`, by the kinds check_optional knows."""
    for kind, names in names_by_kind.items():
        for name in names:
            check_optional(body, name, kind)


def check_common(body: dict[str, Any]) -> None:
    check_optional(body, "model", "string")
    check_optional(body, "stream", "bool")
    for name in ("temperature", "top_p"):
        check_optional(body, name, "number")


# -- usage --------------------------------------------------------------------------------------------------------

# More tokens than any model reads or writes in one call (the longest context windows hold about 10M): a count above
# this is no usage but a broken or hostile upstream.
ABSURD_TOKENS = 100_000_000


class ImpossibleUsage(ValueError):
    """Token counts that cannot be true (negative, fractional, not numbers, absurdly large, parts above their whole):
    an upstream error on that call. Counted as money they would make a cost negative, and a budget no ceiling."""


def _count(usage: dict[str, Any], key: str, where: str = "usage") -> int | None:
    value = usage.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ImpossibleUsage(f"{where}.{key} is {value!r}, not a count of tokens")
    if isinstance(value, float):
        if not value.is_integer():
            raise ImpossibleUsage(f"{where}.{key} is {value!r}, not a whole number of tokens")
        value = int(value)
    if value < 0:
        raise ImpossibleUsage(f"{where}.{key} is {value}, a negative number of tokens")
    if value > ABSURD_TOKENS:
        raise ImpossibleUsage(f"{where}.{key} is {value}, more tokens than any model handles in one call")
    return value


def _details(usage: dict[str, Any], *keys: str) -> tuple[dict[str, Any], str]:
    for key in keys:
        value = usage.get(key)
        if isinstance(value, dict):
            return value, f"usage.{key}"
        if value is not None:
            raise ImpossibleUsage(f"usage.{key} is {value!r}, not an object")
    return {}, "usage"


def _part(part: int | None, whole: int | None, what: str) -> None:
    if part is not None and whole is not None and part > whole:
        raise ImpossibleUsage(f"{what}: {part} of {whole}, a part larger than its whole")


def usage_from_openai(usage: Any) -> Usage:
    """Chat/completions (prompt_tokens…) and responses (input_tokens…) usage alike. No usage is unknown usage (all
    None); usage that cannot be true raises ImpossibleUsage."""
    if usage is None:
        return Usage()
    if not isinstance(usage, dict):
        raise ImpossibleUsage(f"usage is {type(usage).__name__}, not an object")
    inp = _count(usage, "prompt_tokens" if "prompt_tokens" in usage else "input_tokens")
    out = _count(usage, "completion_tokens" if "completion_tokens" in usage else "output_tokens")
    in_details, in_where = _details(usage, "prompt_tokens_details", "input_tokens_details")
    out_details, out_where = _details(usage, "completion_tokens_details", "output_tokens_details")
    cached = _count(in_details, "cached_tokens", in_where)
    reasoning = _count(out_details, "reasoning_tokens", out_where)
    _part(cached, inp, "cached input tokens")
    _part(reasoning, out, "reasoning tokens among the output tokens")
    return Usage(input_tokens=inp, output_tokens=out, cached_tokens=cached, reasoning_tokens=reasoning)


def usage_from_anthropic(usage: Any) -> Usage:
    """Anthropic counts cache reads and writes apart from input_tokens; we fold them in (OpenAI's convention)."""
    if usage is None:
        return Usage()
    if not isinstance(usage, dict):
        raise ImpossibleUsage(f"usage is {type(usage).__name__}, not an object")
    base = _count(usage, "input_tokens")
    read = _count(usage, "cache_read_input_tokens") or 0
    written = _count(usage, "cache_creation_input_tokens") or 0
    return Usage(
        input_tokens=None if base is None else base + read + written,
        output_tokens=_count(usage, "output_tokens"),
        cached_tokens=read,
        cache_write_tokens=written,
    )


def int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None
