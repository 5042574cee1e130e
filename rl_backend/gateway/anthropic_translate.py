"""Anthropic Messages <-> OpenAI Chat Completions: requests one way, whole responses the other.

Used when an agent on the Anthropic SDK is routed to an OpenAI-compatible upstream (vLLM, the embedded server).
Text, images, tools (definitions, tool_use, tool_result, tool_choice), stop sequences and usage carry over;
thinking blocks and server tools do not (the latter is refused with a 400, the former dropped).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from rl_backend.gateway.exchange import bad_request

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _image(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = str(source.get("url", ""))
    else:
        raise bad_request(f"image source type {source.get('type')!r} cannot be sent to an OpenAI-compatible upstream")
    return {"type": "image_url", "image_url": {"url": url}}


def _user_messages(content: list[Any], index: int) -> list[dict[str, Any]]:
    """One Anthropic user turn: tool results become `tool` messages (first: they answer the previous turn)."""
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image(block))
        elif kind == "tool_result":
            text = _text(block.get("content"))
            tools.append(
                {
                    "role": "tool",
                    "tool_call_id": str(block.get("tool_use_id", "")),
                    "content": f"Error: {text}" if block.get("is_error") else text,
                }
            )
        else:
            raise bad_request(
                f"content block type {kind!r} in messages[{index}] cannot be sent to an OpenAI-compatible upstream",
                f"messages[{index}].content",
            )
    out = list(tools)
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        # Plain strings for text-only turns: the most widely understood form (small local servers included).
        out.append({"role": "user", "content": "\n".join(p["text"] for p in parts) if only_text else parts})
    return out


def _assistant_message(content: list[Any]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {"name": str(block.get("name", "")), "arguments": json.dumps(block.get("input", {}))},
                }
            )
        # thinking and redacted_thinking blocks have no OpenAI counterpart: dropped.
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or "input_schema" not in tool or tool.get("type") not in (None, "custom"):
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise bad_request(
                f"tools[{i}] (type {kind!r}) is not a custom tool with an input_schema; server tools cannot run on "
                "an OpenAI-compatible upstream",
                f"tools[{i}]",
            )
        fn: dict[str, Any] = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description"):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: dict[str, Any]) -> tuple[Any, bool | None]:
    kind = choice.get("type")
    parallel = None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    raise bad_request(f"tool_choice type {kind!r} is not one of auto, any, tool, none", "tool_choice")


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request (validated) as a Chat Completions request."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system)})
    for i, m in enumerate(body["messages"]):
        content = m["content"]
        if isinstance(content, str):
            messages.append({"role": m["role"], "content": content})
        elif m["role"] == "user":
            messages.extend(_user_messages(content, i))
        else:
            messages.append(_assistant_message(content))
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if isinstance(body.get("tool_choice"), dict):
        chat["tool_choice"], parallel = _tool_choice(body["tool_choice"])
        if parallel is not None and body.get("tools"):
            chat["parallel_tool_calls"] = parallel
    if body.get("stream"):
        chat["stream"] = True
    return chat


def tool_input(arguments: Any) -> Any:
    """A tool call's JSON arguments as tool_use input; text that is not a JSON object is kept as it came."""
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value


def stop_reason(finish: Any, matched: Any, stops: list[str]) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence); vLLM names the stop string that matched in the choice's `stop_reason`."""
    if finish == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return (STOP_REASONS.get(finish, "end_turn") if finish else None), None


def anthropic_usage(usage: Any) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    prompt = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    return {
        "input_tokens": prompt - cached,
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def message_id(chat_id: Any) -> str:
    return f"msg_{chat_id}" if isinstance(chat_id, str) and chat_id else f"msg_{uuid.uuid4().hex}"


def chat_to_message(data: dict[str, Any], model: str, stops: list[str]) -> dict[str, Any]:
    """A chat.completion as the Anthropic message the agent expects."""
    choices = data.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if isinstance(msg.get("content"), str) and msg["content"]:
        content.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                "name": fn.get("name", ""),
                "input": tool_input(fn.get("arguments")),
            }
        )
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), stops)
    return {
        "id": message_id(data.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason or "end_turn",
        "stop_sequence": sequence,
        "usage": anthropic_usage(data.get("usage")),
    }
