"""Anthropic Messages served by an OpenAI-compatible upstream: the request translated to chat, the answer back.

Streams are translated chunk by chunk into Anthropic's event grammar (message_start, content_block_start/delta/stop
per text or tool_use block, message_delta, message_stop), so the `anthropic` SDK runs on the embedded model or
vLLM. Token ids and logprobs are asked for and recorded as for chat; the agent never sees them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from rl_backend.gateway import training_fields
from rl_backend.gateway.anthropic_messages import AnthropicExchange, MessageAccumulator
from rl_backend.gateway.anthropic_translate import (
    anthropic_usage,
    chat_to_message,
    message_id,
    messages_to_chat,
    stop_reason,
)
from rl_backend.gateway.errors import error_body, upstream_error_message
from rl_backend.gateway.exchange import int_list
from rl_backend.gateway.knobs import apply_knobs
from rl_backend.gateway.openai_chat import ChatAccumulator, ask_upstream, chat_logprobs, read_answer, read_chunk
from rl_backend.gateway.routing import Route
from rl_backend.gateway.sse import SSEEvent, encode_json_event, is_done
from rl_backend.store.records import Api


class MessagesViaChatExchange(AnthropicExchange):
    path = "/chat/completions"
    passes_through = False  # the agent gets a translation: an answer is read whole to be translated

    def __init__(self, body: dict[str, Any], route: Route, *, token_ids: bool, knobs: Mapping[str, Any]) -> None:
        super().__init__(body, route, token_ids=token_ids, knobs=knobs)
        self.chat = messages_to_chat(self.request_record)
        if "reasoning_effort" in knobs:  # an OpenAI upstream has a place for it, unlike the Messages API
            effort = {"reasoning_effort": knobs["reasoning_effort"]}
            self.knobs_applied.update(apply_knobs(Api.openai_chat, self.chat, effort))
        if knobs.get(training_fields.KNOB):  # the Messages fields were restricted; vLLM's own defaults are not
            training_fields.neutral_chat(self.chat)
        self.stops = [s for s in self.request_record.get("stop_sequences") or [] if isinstance(s, str)]
        self.chat_acc = ChatAccumulator(keep_logprobs=False)
        self.msg_acc = MessageAccumulator()
        self.started = False
        self.block = -1
        self.open: tuple[str, int] | None = None  # ("text", 0) or ("tool", openai tool-call index)
        self.tool_blocks: dict[int, int] = {}
        self.finish: Any = None
        self.matched: Any = None
        self.done = False

    def upstream_body(self) -> dict[str, Any]:
        return ask_upstream(dict(self.chat), stream=self.stream, token_ids=self.token_ids)

    def error_from_upstream(self, status: int, body: bytes, content_type: str) -> tuple[bytes, str]:
        payload = error_body(status, upstream_error_message(body), "anthropic")
        return json.dumps(payload).encode(), "application/json"

    # -- whole answers --------------------------------------------------------------------------------------------

    def process_response(self, data: Any) -> Any:
        out = self.outcome
        first = read_answer(data, out, "chat.completion")
        out.prompt_token_ids = int_list(data.get("prompt_token_ids"))
        out.logprobs = chat_logprobs(first)
        out.response = chat_to_message(data, self.route.model, self.stops)
        return out.response

    # -- streams --------------------------------------------------------------------------------------------------

    def is_terminal(self, event: SSEEvent) -> bool:
        return is_done(event.data)

    def stream_complete(self) -> bool:
        return self.done

    def _emit(self, kind: str, payload: dict[str, Any]) -> bytes:
        data = {"type": kind, **payload}
        if self.msg_acc.add(data):
            self.output_started = True
        return encode_json_event(data, kind)

    def _start(self, chunk: Mapping[str, Any]) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message: dict[str, Any] = {
            "id": message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self.route.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},  # known only at the end: sent in message_delta
        }
        return [self._emit("message_start", {"message": message})]

    def _close_block(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [self._emit("content_block_stop", {"index": self.block})]

    def _open_block(self, block: dict[str, Any], key: tuple[str, int]) -> list[bytes]:
        out = self._close_block()
        self.block += 1
        self.open = key
        out.append(self._emit("content_block_start", {"index": self.block, "content_block": block}))
        return out

    def process_event(self, event: SSEEvent) -> list[bytes]:
        if is_done(event.data):
            self.done = True
            return self._finish()
        chunk, error = read_chunk(event.data)
        if error is not None:
            self.outcome.error = error
            return [self.error_event(error)]
        self.chat_acc.add(chunk)
        out = self._start(chunk)
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or (choice.get("index") or 0) != 0:
                continue  # Messages has one answer; n > 1 is not a Messages concept
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.open != ("text", 0):
                    out += self._open_block({"type": "text", "text": ""}, ("text", 0))
                out.append(
                    self._emit("content_block_delta", {"index": self.block, "delta": {"type": "text_delta", "text": text}})
                )
            for call in delta.get("tool_calls") or []:
                out += self._tool_delta(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
                self.matched = choice.get("stop_reason")
        return out

    def _tool_delta(self, call: Mapping[str, Any]) -> list[bytes]:
        index = int(call.get("index") or 0)
        fn = call.get("function") or {}
        out: list[bytes] = []
        if index not in self.tool_blocks:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                "name": fn.get("name") or "",
                "input": {},
            }
            out += self._open_block(block, ("tool", index))
            self.tool_blocks[index] = self.block
        arguments = fn.get("arguments")
        # Anthropic blocks are sequential: arguments for a tool block already closed (interleaved parallel calls)
        # cannot be sent; the record still has them, from the chat side.
        if isinstance(arguments, str) and arguments and self.open == ("tool", index):
            delta = {"type": "input_json_delta", "partial_json": arguments}
            out.append(self._emit("content_block_delta", {"index": self.block, "delta": delta}))
        return out

    def _finish(self) -> list[bytes]:
        out = self._start({}) + self._close_block()
        reason, sequence = stop_reason(self.finish, self.matched, self.stops)
        delta = {"stop_reason": reason or "end_turn", "stop_sequence": sequence}
        out.append(self._emit("message_delta", {"delta": delta, "usage": anthropic_usage(self.chat_acc.usage)}))
        out.append(self._emit("message_stop", {}))
        return out

    def _stop_keeping(self) -> None:
        self.chat_acc.keep = self.msg_acc.keep = False

    def collect(self) -> None:
        self.outcome.response = self.msg_acc.result()
        self.chat_acc.fill(self.outcome)
