"""OpenAI Chat Completions through the gateway: knobs in, token ids and usage asked for, the agent's shape kept.

When the upstream is vLLM-like and recording token ids is on, the upstream is asked for `return_token_ids` and
`logprobs`; when streaming, always for the usage chunk. Whatever of that the agent did not ask for is removed from
what it receives, so it sees the response shape it would have got without the gateway.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from rl_backend.gateway.errors import error_body
from rl_backend.gateway.exchange import (
    Exchange,
    Outcome,
    bad_request,
    check_common,
    check_fields,
    check_messages,
    int_list,
    usage_from_openai,
)
from rl_backend.gateway.jsonfast import loads
from rl_backend.gateway.routing import Route
from rl_backend.gateway.sse import SSEEvent, encode_event, encode_json_event, is_done
from rl_backend.store.records import Api


def validate_chat(body: dict[str, Any]) -> None:
    check_common(body)
    check_messages(body)
    check_fields(body, int=("max_tokens", "max_completion_tokens", "n", "top_logprobs", "seed"),
                 bool=("logprobs", "return_token_ids", "parallel_tool_calls"),
                 object=("stream_options", "response_format"), array=("tools",))


def ask_upstream(body: dict[str, Any], *, stream: bool, token_ids: bool, logprobs: Any = True) -> dict[str, Any]:
    """What the gateway asks an OpenAI upstream for on its own behalf: a stream's usage chunk, and from a vLLM-style
    upstream token ids with `logprobs` (None: leave what the agent asked for)."""
    if stream:
        options = body.get("stream_options")
        body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    if token_ids:
        body["return_token_ids"] = True
        if logprobs is not None:
            body["logprobs"] = logprobs
    return body


def read_answer(data: Any, outcome: Outcome, kind: str) -> dict[str, Any]:
    """Usage, model, version and completion ids of a whole chat or completions answer, into `outcome`; returns its
    first choice. Raises ValueError for an answer of another shape."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise ValueError(f"the upstream's answer is not a {kind} object")
    outcome.usage = usage_from_openai(data.get("usage"))
    outcome.upstream_model = data.get("model") if isinstance(data.get("model"), str) else None
    outcome.model_version = data.get("model_version") if isinstance(data.get("model_version"), str) else None
    first: dict[str, Any] = data["choices"][0] if data["choices"] and isinstance(data["choices"][0], dict) else {}
    outcome.completion_token_ids = int_list(first.get("token_ids"))
    return first


def read_chunk(data: str) -> tuple[dict[str, Any], str | None]:
    """A chat or completions stream chunk, and the error it carries instead of choices (None for none)."""
    chunk = loads(data)
    if not isinstance(chunk, dict):
        raise ValueError(f"stream chunk is {type(chunk).__name__}, not an object")
    if chunk.get("error") is not None and not chunk.get("choices"):
        err = chunk["error"]
        return chunk, str(err.get("message") if isinstance(err, dict) else err)
    return chunk, None


def chat_logprobs(choice: Mapping[str, Any]) -> list[float] | None:
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(content, list):
        return None
    values = [e.get("logprob") for e in content if isinstance(e, dict)]
    return [float(v) for v in values if isinstance(v, int | float)]


class ChatAccumulator:
    """Rebuilds the chat.completion a stream amounts to, from its chunks."""

    def __init__(self, *, keep_logprobs: bool) -> None:
        self.keep_logprobs = keep_logprobs
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.prompt_token_ids: list[int] | None = None
        self.model_version: str | None = None
        self.keep = True  # False once the stream outgrew what the record keeps: text, ids, logprobs no longer grow

    def add(self, chunk: Mapping[str, Any]) -> bool:
        """Fold one chunk in; True when it carried generated output. (Called for every stream event: kept lean.)"""
        head = self.head
        if len(head) < 4:
            for key in ("id", "created", "model", "system_fingerprint"):
                if key not in head and chunk.get(key) is not None:
                    head[key] = chunk[key]
        usage = chunk.get("usage")
        if usage is not None:
            usage_from_openai(usage)  # usage that cannot be true fails the stream here, before it is kept
            self.usage = usage
        if self.prompt_token_ids is None and "prompt_token_ids" in chunk:
            self.prompt_token_ids = int_list(chunk["prompt_token_ids"])
        version = chunk.get("model_version")
        if isinstance(version, str):
            self.model_version = version
        produced = False
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = int(choice.get("index") or 0)
            state = self.choices.get(index)
            if state is None:
                state = self.choices[index] = {
                    "role": None, "content": [], "reasoning": [], "tools": {}, "finish": None, "lp": [], "ids": [],
                }
            delta = choice.get("delta") or {}
            if delta.get("role"):
                state["role"] = delta["role"]
            if choice.get("finish_reason"):
                state["finish"] = choice["finish_reason"]
            if not self.keep:
                continue
            content = delta.get("content")
            if content and isinstance(content, str):
                state["content"].append(content)
                produced = True
            for key in ("reasoning_content", "reasoning"):
                if key in delta and isinstance(delta[key], str) and delta[key]:
                    state["reasoning"].append(delta[key])
                    produced = True
            for call in delta.get("tool_calls") or ():
                produced = True
                slot = state["tools"].setdefault(
                    int(call.get("index") or 0), {"id": None, "type": "function", "name": "", "arguments": []}
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    slot["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["arguments"].append(fn["arguments"])
            lp = choice.get("logprobs")
            if isinstance(lp, dict) and isinstance(lp.get("content"), list):
                state["lp"].extend(lp["content"])
            ids = int_list(choice["token_ids"]) if "token_ids" in choice else None
            if ids:
                state["ids"].extend(ids)
                produced = True
        return produced

    def result(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self.choices):
            state = self.choices[index]
            message: dict[str, Any] = {"role": state["role"] or "assistant", "content": "".join(state["content"])}
            if state["reasoning"]:
                message["reasoning_content"] = "".join(state["reasoning"])
            if state["tools"]:
                if not state["content"]:
                    message["content"] = None
                message["tool_calls"] = [
                    {"id": t["id"], "type": t["type"], "function": {"name": t["name"], "arguments": "".join(t["arguments"])}}
                    for _, t in sorted(state["tools"].items())
                ]
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "finish_reason": state["finish"],
                    "logprobs": {"content": state["lp"]} if self.keep_logprobs and state["lp"] else None,
                }
            )
        return {**self.head, "object": "chat.completion", "choices": choices, "usage": self.usage}

    def completion_token_ids(self) -> list[int] | None:
        state = self.choices.get(0)
        return list(state["ids"]) if state and state["ids"] else None

    def logprobs(self) -> list[float] | None:
        state = self.choices.get(0)
        if not state or not state["lp"]:
            return None
        return chat_logprobs({"logprobs": {"content": state["lp"]}})

    def fill(self, out: Outcome) -> None:
        """What the record keeps of the stream, but the response: usage, model, version, token ids, logprobs."""
        out.usage = usage_from_openai(self.usage)
        out.upstream_model = self.head.get("model")
        out.model_version = self.model_version
        out.prompt_token_ids = self.prompt_token_ids
        out.completion_token_ids = self.completion_token_ids()
        out.logprobs = self.logprobs()


class OpenAIExchange(Exchange):
    """What chat and completions share: the asked-for shape, in-stream errors, [DONE]."""

    dialect = "openai"

    def __init__(self, body: dict[str, Any], route: Route, *, token_ids: bool, knobs: Mapping[str, Any]) -> None:
        super().__init__(body, route, token_ids=token_ids, knobs=knobs)
        options = body.get("stream_options")
        self.want_usage_chunk = isinstance(options, dict) and options.get("include_usage") is True
        self.want_token_ids = body.get("return_token_ids") is True
        self.want_logprobs = self.asks_logprobs(body)
        # The gateway asks for logprobs the agent did not: they are stripped again from what it gets.
        self.forced_logprobs = self.token_ids and not self.want_logprobs
        self.done = False

    @staticmethod
    @abstractmethod
    def asks_logprobs(body: dict[str, Any]) -> bool:
        """Whether the agent's own request asks for logprobs."""

    def error_event(self, message: str) -> bytes:
        return encode_json_event(error_body(502, message, "openai"))

    def is_terminal(self, event: SSEEvent) -> bool:
        return is_done(event.data)

    def stream_complete(self) -> bool:
        return self.done

    def _strip_token_ids(self, obj: dict[str, Any]) -> bool:
        if self.want_token_ids:
            return False
        modified = obj.pop("prompt_token_ids", None) is not None
        for choice in obj.get("choices") or []:
            if isinstance(choice, dict):
                modified |= choice.pop("token_ids", None) is not None
                modified |= choice.pop("prompt_token_ids", None) is not None
        return modified

    def _strip(self, obj: dict[str, Any]) -> bool:
        """Remove what the gateway asked for on its own behalf (token ids, logprobs) from what the agent sees."""
        modified = self._strip_token_ids(obj)
        if self.forced_logprobs:
            for choice in obj.get("choices") or []:
                if isinstance(choice, dict) and choice.get("logprobs") is not None:
                    choice["logprobs"] = None
                    modified = True
        return modified

    def _finish_response(self, data: dict[str, Any]) -> dict[str, Any]:
        self._strip(data)
        self.outcome.response = data
        return data

    def _strip_usage(self, chunk: dict[str, Any]) -> tuple[bool, bool]:
        """(drop the chunk, modified) for a usage the agent did not ask to be streamed."""
        if self.want_usage_chunk or "usage" not in chunk:
            return False, False
        if chunk.get("usage") is not None and not chunk.get("choices"):
            return True, False
        chunk.pop("usage")
        return False, True

    def process_event(self, event: SSEEvent) -> list[bytes]:
        if is_done(event.data):
            self.done = True
            return [encode_event(event.data, event.event)]
        chunk, error = read_chunk(event.data)
        if error is not None:
            self.outcome.error = error  # remembered for the record
        self._fold(chunk)
        drop, modified = self._strip_usage(chunk)
        if drop:
            return []
        modified |= self._strip(chunk)
        return [encode_json_event(chunk, event.event) if modified else event.encode()]

    @abstractmethod
    def _fold(self, chunk: dict[str, Any]) -> None:
        """Fold one stream chunk into what the record will hold; set `output_started` at the first output."""


class ChatExchange(OpenAIExchange):
    api = Api.openai_chat
    path = "/chat/completions"
    validate = staticmethod(validate_chat)

    def __init__(self, body: dict[str, Any], route: Route, *, token_ids: bool, knobs: Mapping[str, Any]) -> None:
        super().__init__(body, route, token_ids=token_ids, knobs=knobs)
        self.acc = ChatAccumulator(keep_logprobs=self.want_logprobs)

    @staticmethod
    def asks_logprobs(body: dict[str, Any]) -> bool:
        return body.get("logprobs") is True

    def upstream_body(self) -> dict[str, Any]:
        return ask_upstream(dict(self.request_record), stream=self.stream, token_ids=self.token_ids)

    def process_response(self, data: Any) -> Any:
        first = read_answer(data, self.outcome, "chat.completion")
        self.outcome.prompt_token_ids = int_list(data.get("prompt_token_ids"))
        self.outcome.logprobs = chat_logprobs(first)
        return self._finish_response(data)

    def _fold(self, chunk: dict[str, Any]) -> None:
        if self.acc.add(chunk):
            self.output_started = True

    def _stop_keeping(self) -> None:
        self.acc.keep = False

    def collect(self) -> None:
        self.outcome.response = self.acc.result()
        self.acc.fill(self.outcome)


def bad_route(api: str, route: Route) -> Exception:
    return bad_request(
        f"{api} calls need an OpenAI-compatible upstream, but model {route.model!r} routes to upstream "
        f"{route.upstream.name!r}, which speaks the Anthropic API; use the Anthropic Messages endpoint for it",
        "model",
    )
