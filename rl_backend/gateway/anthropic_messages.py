"""Anthropic Messages through the gateway to an Anthropic upstream: knobs in, events passed on, the message recorded.

`MessageAccumulator` rebuilds the message a Messages stream amounts to; the OpenAI translator uses it too, on the
events it emits, so both record exactly what the agent received.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rl_backend.gateway.errors import Dialect, error_body
from rl_backend.gateway.exchange import (
    Exchange,
    ImpossibleUsage,
    bad_request,
    check_common,
    check_fields,
    check_messages,
    usage_from_anthropic,
)
from rl_backend.gateway.jsonfast import loads
from rl_backend.gateway.routing import Route
from rl_backend.gateway.sse import SSEEvent, encode_json_event
from rl_backend.store.records import Api


def validate_messages(body: dict[str, Any]) -> None:
    check_common(body)
    check_messages(body)
    for i, m in enumerate(body["messages"]):
        if m["role"] not in ("user", "assistant"):
            raise bad_request(
                f"`messages[{i}].role` must be 'user' or 'assistant' (the system prompt goes in `system`)",
                f"messages[{i}].role",
            )
        if not isinstance(m.get("content"), str | list):
            raise bad_request(f"`messages[{i}].content` must be a string or an array of blocks", f"messages[{i}]")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad_request("`max_tokens` is required: a positive integer", "max_tokens")
    if body.get("system") is not None and not isinstance(body["system"], str | list):
        raise bad_request("`system` must be a string or an array of text blocks", "system")
    check_fields(body, array=("tools", "stop_sequences"), object=("tool_choice", "thinking", "metadata"), int=("top_k",))


class MessageAccumulator:
    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.usage: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json_parts: dict[int, list[str]] = {}
        self.done = False
        self.error: str | None = None
        self.keep = True  # False once the stream outgrew what the record keeps: the blocks' text no longer grows

    def add(self, data: Mapping[str, Any]) -> bool:
        """Fold one event in; True when it carried generated content."""
        kind = data.get("type")
        if kind == "message_start" and isinstance(data.get("message"), dict):
            message = dict(data["message"])
            usage = message.get("usage") or {}
            usage_from_anthropic(usage)  # usage that cannot be true fails the stream here, before it is kept
            self.message, self.usage = message, dict(usage)
        elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            self.blocks[int(data.get("index") or 0)] = dict(data["content_block"])
        elif kind == "content_block_delta":
            if not self.keep:
                return True
            index = int(data.get("index") or 0)
            block = self.blocks.setdefault(index, {"type": "text", "text": ""})
            delta = data.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif dtype == "input_json_delta":
                self.json_parts.setdefault(index, []).append(str(delta.get("partial_json", "")))
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif dtype == "signature_delta":
                block["signature"] = delta.get("signature")
            return True
        elif kind == "content_block_stop":
            self._close(int(data.get("index") or 0))
        elif kind == "message_delta":
            for key, value in (data.get("delta") or {}).items():
                self.message[key] = value
            update = data.get("usage") or {}
            if not isinstance(update, dict):
                raise ImpossibleUsage(f"usage is {type(update).__name__}, not an object")
            usage = {**self.usage, **{k: v for k, v in update.items() if v is not None}}
            usage_from_anthropic(usage)
            self.usage = usage
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            err = data.get("error")
            self.error = str(err.get("message") if isinstance(err, dict) else err)
        return False

    def _close(self, index: int) -> None:
        parts = self.json_parts.pop(index, None)
        if parts is None or index not in self.blocks:
            return
        text = "".join(parts)
        try:
            self.blocks[index]["input"] = json.loads(text) if text else {}
        except ValueError:
            self.blocks[index]["input"] = text

    def result(self) -> dict[str, Any]:
        for index in list(self.json_parts):
            self._close(index)
        content = [self.blocks[i] for i in sorted(self.blocks)]
        return {**self.message, "content": content, "usage": self.usage}


class AnthropicExchange(Exchange):
    """What both ways of serving Messages share: the Anthropic error shape, also inside streams."""

    dialect: Dialect = "anthropic"
    api = Api.anthropic_messages
    validate = staticmethod(validate_messages)

    def error_event(self, message: str) -> bytes:
        return encode_json_event(error_body(502, message, "anthropic"), "error")


class MessagesExchange(AnthropicExchange):
    path = "/v1/messages"
    asks_token_ids = False

    def __init__(self, body: dict[str, Any], route: Route, *, token_ids: bool, knobs: Mapping[str, Any]) -> None:
        super().__init__(body, route, token_ids=token_ids, knobs=knobs)
        self.acc = MessageAccumulator()

    def upstream_body(self) -> dict[str, Any]:
        return dict(self.request_record)

    def process_response(self, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("type") != "message":
            raise ValueError("the upstream's answer is not a message object")
        self.outcome.response = data
        self.outcome.usage = usage_from_anthropic(data.get("usage"))
        self.outcome.upstream_model = data.get("model") if isinstance(data.get("model"), str) else None
        return data

    def is_terminal(self, event: SSEEvent) -> bool:
        if event.event:
            return event.event == "message_stop"
        try:
            data = loads(event.data)
        except ValueError:
            return False
        return isinstance(data, dict) and data.get("type") == "message_stop"

    def process_event(self, event: SSEEvent) -> list[bytes]:
        data = loads(event.data)
        if not isinstance(data, dict):
            raise ValueError(f"stream event is {type(data).__name__}, not an object")
        if self.acc.add(data):
            self.output_started = True
        return [event.encode()]

    def stream_complete(self) -> bool:
        return self.acc.done

    def _stop_keeping(self) -> None:
        self.acc.keep = False

    def collect(self) -> None:
        self.outcome.response = self.acc.result()
        self.outcome.usage = usage_from_anthropic(self.acc.usage)
        model = self.acc.message.get("model")
        self.outcome.upstream_model = model if isinstance(model, str) else None
        self.outcome.error = self.acc.error
