"""Reading OpenAI-style request bodies into prompts and sampling parameters, with errors that say what to fix.

Every client mistake becomes a `RequestError` (HTTP 400, or 404 for an unknown model) in OpenAI's error shape;
nothing here lets a bad request reach the engine.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .sampling import SamplingParams

_ROLES = {"system", "user", "assistant", "tool", "developer"}
_MAX_STOPS = 16


class RequestError(Exception):
    """A client mistake, answered as `{"error": {message, type, param, code}}` with `status`."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status
        self.type = type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Parsed:
    """A validated request: what to generate and how to answer."""

    model: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    logprobs: bool
    return_token_ids: bool


class _Body:
    """Typed accessors over the request's JSON object, each raising RequestError naming the field."""

    def __init__(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        self.d: dict[str, Any] = body

    def get(self, key: str) -> Any:
        return self.d.get(key)

    def boolean(self, key: str, default: bool = False) -> bool:
        v = self.d.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise RequestError(f"`{key}` must be true or false, got {v!r}", param=key)
        return v

    def integer(self, key: str, lo: int | None = None, hi: int | None = None) -> int | None:
        v = self.d.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise RequestError(f"`{key}` must be an integer, got {v!r}", param=key)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            bounds = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
            raise RequestError(f"`{key}` must be {bounds}, got {v}", param=key)
        return v

    def number(self, key: str, lo: float, hi: float, *, open_lo: bool = False) -> float | None:
        v = self.d.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise RequestError(f"`{key}` must be a number, got {v!r}", param=key)
        if v > hi or v < lo or (open_lo and v == lo):
            left = "(" if open_lo else "["
            raise RequestError(f"`{key}` must be in {left}{lo}, {hi}], got {v}", param=key)
        return float(v)


def check_model(b: _Body, served: str, aliases: Collection[str] = ()) -> str:
    model = b.get("model")
    if model is None:
        raise RequestError(f"`model` is required; this server serves {served!r}", param="model")
    if not isinstance(model, str):
        raise RequestError(f"`model` must be a string, got {model!r}", param="model")
    if model != served and model not in aliases:
        raise RequestError(
            f"the model {model!r} does not exist here; this server serves {served!r}",
            param="model",
            code="model_not_found",
            status=404,
        )
    return model


def _unsupported(b: _Body) -> None:
    n = b.integer("n", lo=1)
    if n is not None and n > 1:
        raise RequestError("`n` greater than 1 is not supported; send n separate requests instead", param="n")
    for key in ("frequency_penalty", "presence_penalty"):
        v = b.number(key, -2.0, 2.0)
        if v:
            raise RequestError(f"`{key}` is not supported by this server; leave it out or set it to 0", param=key)
    if b.get("logit_bias"):
        raise RequestError("`logit_bias` is not supported by this server; leave it out", param="logit_bias")
    best_of = b.integer("best_of", lo=1)
    if best_of is not None and best_of > 1:
        raise RequestError("`best_of` greater than 1 is not supported", param="best_of")


def _sampling(b: _Body, top_logprobs: int) -> SamplingParams:
    max_tokens = b.integer("max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = b.integer("max_tokens", lo=1)
    temperature = b.number("temperature", 0.0, 2.0)
    top_p = b.number("top_p", 0.0, 1.0, open_lo=True)
    seed = b.integer("seed")
    stop_raw = b.get("stop")
    if stop_raw is None:
        stop: tuple[str, ...] = ()
    elif isinstance(stop_raw, str):
        stop = (stop_raw,) if stop_raw else ()
    elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
        stop = tuple(s for s in stop_raw if s)
    else:
        raise RequestError("`stop` must be a string or a list of strings", param="stop")
    if len(stop) > _MAX_STOPS:
        raise RequestError(f"`stop` may hold at most {_MAX_STOPS} strings", param="stop")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        seed=seed,
        stop=stop,
        top_logprobs=top_logprobs,
        ignore_eos=b.boolean("ignore_eos"),
    )


def _stream_flags(b: _Body) -> tuple[bool, bool]:
    stream = b.boolean("stream")
    opts = b.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise RequestError("`stream_options` must be an object", param="stream_options")
        if not stream:
            raise RequestError("`stream_options` is only allowed with `stream: true`", param="stream_options")
        v = opts.get("include_usage")
        if v is not None and not isinstance(v, bool):
            raise RequestError("`stream_options.include_usage` must be true or false", param="stream_options")
        include_usage = bool(v)
    return stream, include_usage


def _message_text(content: Any, i: int, role: str) -> str:
    if content is None:
        if role == "assistant":
            return ""
        raise RequestError(f"`messages[{i}].content` is required for role {role!r}", param=f"messages[{i}].content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(
                    f'`messages[{i}].content[{j}]` must be a text part {{"type": "text", "text": ...}}; '
                    "this model reads text only",
                    param=f"messages[{i}].content",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"`messages[{i}].content` must be a string or a list of text parts", param=f"messages[{i}].content")


def chat_messages(raw: Any) -> list[dict[str, str]]:
    """The `messages` array checked and flattened to {role, content} strings for the chat template."""
    if not isinstance(raw, list) or not raw:
        raise RequestError("`messages` is required: a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise RequestError(f"`messages[{i}]` must be an object with `role` and `content`", param="messages")
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise RequestError(
                f"`messages[{i}].role` must be one of {sorted(_ROLES)}, got {role!r}", param=f"messages[{i}].role"
            )
        if m.get("tool_calls") or m.get("function_call"):
            raise RequestError(
                f"`messages[{i}]` has tool calls, which agl's embedded engine does not take (it has no tool "
                "support); put the call in the message text instead, or serve the model with vLLM",
                param=f"messages[{i}].tool_calls",
            )
        # OpenAI's newer "developer" role is the system prompt under another name.
        out.append({"role": "system" if role == "developer" else role, "content": _message_text(m.get("content"), i, role)})
    return out


def parse_chat(body: Any, served: str, encode_chat: Any, aliases: Collection[str] = ()) -> Parsed:
    """Validate a /v1/chat/completions body; `encode_chat(messages) -> ids` applies the chat template."""
    b = _Body(body)
    model = check_model(b, served, aliases)
    messages = chat_messages(b.get("messages"))
    if b.get("tools") or b.get("functions"):
        raise RequestError(
            "agl's embedded engine takes no `tools` (it parses no tool calls out of the reply): describe the tools "
            "in the system prompt and parse a text protocol from the reply, or serve the model with vLLM, which "
            "returns `tool_calls` (`agl train --backend verl --policy-server vllm`, or an openai-compatible upstream)",
            param="tools",
        )
    tool_choice = b.get("tool_choice")
    if tool_choice not in (None, "none"):
        raise RequestError("`tool_choice` needs `tools`, which this model does not support", param="tool_choice")
    fmt = b.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError('`response_format` other than {"type": "text"} is not supported', param="response_format")
    _unsupported(b)
    logprobs = b.boolean("logprobs")
    top = b.integer("top_logprobs", lo=0, hi=20) or 0
    if top and not logprobs:
        raise RequestError("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
    params = _sampling(b, top)
    stream, include_usage = _stream_flags(b)
    try:
        prompt_ids = encode_chat(messages)
    except Exception as exc:  # the template rejected the conversation (e.g. roles out of order)
        raise RequestError(f"the chat template could not render these messages: {exc}", param="messages") from exc
    return Parsed(model, prompt_ids, params, stream, include_usage, logprobs, b.boolean("return_token_ids"))


def parse_completion(body: Any, served: str, encode_text: Any, aliases: Collection[str] = ()) -> Parsed:
    """Validate a /v1/completions body: `prompt` is a string or a list of token ids (or a list of one of either)."""
    b = _Body(body)
    model = check_model(b, served, aliases)
    prompt = b.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("`prompt` must not be empty", param="prompt")
        prompt_ids = list(encode_text(prompt))
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt_ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise RequestError("only one prompt per request is supported; send several requests", param="prompt")
    else:
        raise RequestError("`prompt` is required: a string or a non-empty list of token ids", param="prompt")
    if b.boolean("echo"):
        raise RequestError("`echo` is not supported by this server", param="echo")
    if b.get("suffix"):
        raise RequestError("`suffix` is not supported by this server", param="suffix")
    _unsupported(b)
    top = b.integer("logprobs", lo=0, hi=20)
    params = _sampling(b, top or 0)
    stream, include_usage = _stream_flags(b)
    return Parsed(model, prompt_ids, params, stream, include_usage, top is not None, b.boolean("return_token_ids"))
