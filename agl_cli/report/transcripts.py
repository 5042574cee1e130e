"""Rollout transcripts for reports: the model calls of one rollout as readable turns, secrets removed.

Each API stores its request and response in its own shape (OpenAI chat, Responses and completions, Anthropic
messages); all become `Turn`s of (role, text). An agent usually resends the whole conversation on every call,
so a call shows only the turns its predecessor had not already shown: the transcript reads as one conversation
instead of growing quadratically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agl_cli.metrics.fmt import count, seconds, usd
from agl_cli.report.redact import scrub, scrub_text
from rl_backend.store.records import CallRecord, Rollout

MAX_TURN_CHARS = 4000  # a report is read, not grepped: long turns are cut, with the cut said
MAX_TAIL_CHARS = 2000


@dataclass(frozen=True)
class Turn:
    role: str
    text: str


@dataclass
class CallView:
    index: int
    api: str
    model: str
    status: str
    tokens: str
    latency: str
    cost: str
    earlier: int  # turns already shown by a previous call and skipped here
    turns: list[Turn] = field(default_factory=list)


@dataclass
class Transcript:
    rollout_id: str
    anchor: str
    title: str
    meta: list[tuple[str, str]]
    calls: list[CallView]
    output: str | None
    error: str | None
    stderr: str | None
    grader: str | None


def clip(text: str, limit: int = MAX_TURN_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… [{len(text) - limit:,} more characters cut]"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=None, default=str)


def _content_text(content: Any) -> str:
    """Text of a message content: a string, or a list of parts (text, images, tool use and results)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return _json(content)
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        kind = part.get("type", "")
        if "text" in part and isinstance(part["text"], str):
            parts.append(part["text"])
        elif kind in ("image_url", "image", "input_image"):
            parts.append("[image]")
        elif kind == "tool_use":
            parts.append(f"[tool call {part.get('name')}] {_json(part.get('input'))}")
        elif kind == "tool_result":
            parts.append(f"[tool result] {_content_text(part.get('content'))}")
        elif kind in ("thinking", "redacted_thinking", "reasoning"):
            parts.append("[reasoning]")
        else:
            parts.append(_json(part))
    return "\n".join(p for p in parts if p)


def _tool_calls(calls: Any) -> str:
    lines = []
    for call in calls or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        lines.append(f"[tool call {function.get('name')}] {function.get('arguments', '')}")
    return "\n".join(lines)


def _chat_message(message: dict[str, Any]) -> Turn:
    text = _content_text(message.get("content"))
    tools = _tool_calls(message.get("tool_calls"))
    text = "\n".join(t for t in (text, tools) if t)
    role = str(message.get("role", "?"))
    if role == "tool":
        role = f"tool ({message.get('name') or message.get('tool_call_id') or 'result'})"
    return Turn(role, text)


def _responses_item(item: Any, default_role: str) -> Turn:
    if isinstance(item, str):
        return Turn(default_role, item)
    if not isinstance(item, dict):
        return Turn(default_role, _json(item))
    kind = item.get("type", "message")
    if kind == "function_call":
        return Turn("assistant", f"[tool call {item.get('name')}] {item.get('arguments', '')}")
    if kind == "function_call_output":
        return Turn("tool", _content_text(item.get("output")))
    if kind == "reasoning":
        return Turn("assistant", "[reasoning]")
    return Turn(str(item.get("role", default_role)), _content_text(item.get("content")))


def request_turns(api: str, request: dict[str, Any]) -> list[Turn]:
    if api == "openai.chat":
        return [_chat_message(m) for m in request.get("messages", []) if isinstance(m, dict)]
    if api == "anthropic.messages":
        turns = [Turn("system", _content_text(request["system"]))] if request.get("system") else []
        return turns + [Turn(str(m.get("role")), _content_text(m.get("content")))
                        for m in request.get("messages", []) if isinstance(m, dict)]
    if api == "openai.responses":
        turns = [Turn("system", str(request["instructions"]))] if request.get("instructions") else []
        items = request.get("input", [])
        return turns + [_responses_item(i, "user") for i in (items if isinstance(items, list) else [items])]
    if api == "openai.completions":
        prompt = request.get("prompt", "")
        return [Turn("prompt", prompt if isinstance(prompt, str) else _json(prompt))]
    return [Turn("request", _json(request))]


def response_turns(api: str, response: dict[str, Any] | None) -> list[Turn]:
    if not response:
        return []
    if "error" in response and not response.get("choices") and not response.get("content"):
        return [Turn("error", _json(response["error"]))]
    if api == "openai.chat":
        return [_chat_message(c.get("message") or c.get("delta") or {}) for c in response.get("choices", [])]
    if api == "anthropic.messages":
        return [Turn(str(response.get("role", "assistant")), _content_text(response.get("content")))]
    if api == "openai.responses":
        return [_responses_item(i, "assistant") for i in response.get("output", [])]
    if api == "openai.completions":
        return [Turn("completion", str(c.get("text", ""))) for c in response.get("choices", [])]
    return [Turn("response", _json(response))]


def reply_text(call: CallRecord) -> str | None:
    """What the model answered in one call, as text (tool calls included), secrets removed; None without an answer."""
    turns = [t for t in response_turns(call.api.value, scrub(call.response)) if t.role != "error"]
    text = "\n".join(t.text for t in turns if t.text)
    return scrub_text(text) if text else None


def last_reply(calls: list[CallRecord]) -> str | None:
    """The model's last answer in a rollout: what the agent had to read its result from."""
    for call in reversed(calls):
        text = reply_text(call)
        if text is not None:
            return text
    return None


def call_views(calls: list[CallRecord]) -> list[CallView]:
    views: list[CallView] = []
    shown: list[Turn] = []  # the conversation so far: the previous call's request plus its answer
    for index, call in enumerate(calls, 1):
        api = call.api.value
        asked = [Turn(t.role, scrub_text(t.text)) for t in request_turns(api, scrub(call.request))]
        answered = [Turn(t.role, scrub_text(t.text)) for t in response_turns(api, scrub(call.response))]
        earlier = len(shown) if shown and asked[: len(shown)] == shown else 0
        fresh = asked[earlier:] + answered
        if call.error:
            fresh.append(Turn("error", scrub_text(call.error)))
        status = "ok" if call.error is None and (call.status_code or 200) < 400 else f"failed ({call.status_code})"
        views.append(CallView(
            index=index, api=api, model=call.model or call.request_model or "?", status=status,
            tokens=f"{count(call.input_tokens or 0)} in / {count(call.output_tokens or 0)} out",
            latency=seconds(call.latency_s), cost=usd(call.cost_usd),
            earlier=earlier, turns=[Turn(t.role, clip(t.text)) for t in fresh],
        ))
        shown = asked + answered
    return views


def transcript(rollout: Rollout, calls: list[CallRecord], anchor: str) -> Transcript:
    reward = "none" if rollout.reward is None else f"{rollout.reward:g}"
    duration = rollout.duration_s
    meta = [
        ("variant", rollout.variant), ("task", rollout.task_id), ("seed", str(rollout.seed)),
        ("attempt", str(rollout.attempt)), ("status", rollout.status.value),
        ("reward", f"{reward} ({rollout.reward_source.value})"),
        ("failure", rollout.failure.value if rollout.failure else "—"),
        ("duration", seconds(duration)), ("model calls", str(len(calls))),
    ]
    grader = _json(scrub(rollout.grader_detail)) if rollout.grader_detail else None
    return Transcript(
        rollout_id=rollout.id, anchor=anchor,
        title=f"{rollout.variant} · task {rollout.task_id} · seed {rollout.seed} · " + (
            f"reward {rollout.reward:g}" if rollout.reward is not None
            else f"no reward ({(rollout.failure.value if rollout.failure else rollout.status.value).replace('_', ' ')})"),
        meta=meta, calls=call_views(calls),
        output=clip(scrub_text(rollout.output)) if rollout.output else None,
        error=clip(scrub_text(rollout.error), MAX_TAIL_CHARS) if rollout.error else None,
        stderr=clip(scrub_text(rollout.stderr_tail)[-MAX_TAIL_CHARS:], MAX_TAIL_CHARS) if rollout.stderr_tail else None,
        grader=clip(grader, MAX_TAIL_CHARS) if grader else None,
    )
