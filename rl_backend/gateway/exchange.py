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


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_from_openai(usage: Any) -> Usage:
    """Chat/completions (prompt_tokens…) and responses (input_tokens…) usage alike."""
    if not isinstance(usage, dict):
        return Usage()
    inp = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    out = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    in_details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    out_details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    cached = _int(in_details.get("cached_tokens")) if isinstance(in_details, dict) else None
    reasoning = _int(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else None
    return Usage(input_tokens=inp, output_tokens=out, cached_tokens=cached, reasoning_tokens=reasoning)


def usage_from_anthropic(usage: Any) -> Usage:
    """Anthropic counts cache reads and writes apart from input_tokens; we fold them in (OpenAI's convention)."""
    if not isinstance(usage, dict):
        return Usage()
    base = _int(usage.get("input_tokens"))
    read = _int(usage.get("cache_read_input_tokens")) or 0
    written = _int(usage.get("cache_creation_input_tokens")) or 0
    return Usage(
        input_tokens=None if base is None else base + read + written,
        output_tokens=_int(usage.get("output_tokens")),
        cached_tokens=read,
        cache_write_tokens=written,
    )


def int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None
