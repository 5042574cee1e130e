"""Request-side knobs: a rollout's settings that the gateway writes into every request the agent makes.

Each `apply_*` edits a request body (already a private copy) for one API and returns what it applied, which is
recorded on the call; a knob an API has no place for is left out of that record rather than faked.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

KNOBS = ("model", "temperature", "top_p", "max_tokens", "reasoning_effort", "system_prompt")
_EFFORTS = ("minimal", "low", "medium", "high")
# Anthropic expresses reasoning effort as an extended-thinking token budget; these are the budgets each effort maps
# to (1,024 is the API's minimum). "minimal" and "none" turn thinking off.
ANTHROPIC_THINKING_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384}


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"knob {name!r} must be a finite number, got {value!r}")
    return float(value) if isinstance(value, float) else value


def validate_knobs(knobs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The knobs the gateway will apply, checked; None values mean 'not set'. Raises ValueError with the fix."""
    result: dict[str, Any] = {}
    for name, value in (knobs or {}).items():
        if value is None:
            continue
        if name not in KNOBS:
            raise ValueError(f"unknown gateway knob {name!r}; the gateway applies {', '.join(KNOBS)}")
        if name == "model":
            if not isinstance(value, str) or "/" not in value:
                raise ValueError(f"knob 'model' must be an 'upstream/model' string, got {value!r}")
        elif name in ("temperature", "top_p"):
            value = _number(name, value)
        elif name == "max_tokens":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"knob 'max_tokens' must be a positive integer, got {value!r}")
        elif name == "reasoning_effort":
            if not isinstance(value, str) or not value:
                raise ValueError(f"knob 'reasoning_effort' must be a string such as {_EFFORTS}, got {value!r}")
        elif name == "system_prompt":
            if isinstance(value, str):
                value = {"text": value, "mode": "replace"}
            if (
                not isinstance(value, Mapping)
                or not isinstance(value.get("text"), str)
                or value.get("mode", "replace") not in ("replace", "prepend")
                or set(value) - {"text", "mode"}
            ):
                raise ValueError(
                    "knob 'system_prompt' must be {'text': str, 'mode': 'replace' | 'prepend'}, got " + repr(value)
                )
            value = {"text": value["text"], "mode": value.get("mode", "replace")}
        result[name] = value
    return result


def _sampling(body: dict[str, Any], knobs: Mapping[str, Any], applied: dict[str, Any]) -> None:
    for name in ("temperature", "top_p"):
        if name in knobs:
            body[name] = knobs[name]
            applied[name] = knobs[name]


def _join(first: str, second: str) -> str:
    return f"{first}\n\n{second}" if second else first


def apply_openai_chat(body: dict[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    applied: dict[str, Any] = {}
    _sampling(body, knobs, applied)
    if "max_tokens" in knobs:
        # Newer OpenAI models take only max_completion_tokens; keep whichever field the agent used.
        field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        body[field] = knobs["max_tokens"]
        applied["max_tokens"] = knobs["max_tokens"]
    if "reasoning_effort" in knobs:
        body["reasoning_effort"] = knobs["reasoning_effort"]
        applied["reasoning_effort"] = knobs["reasoning_effort"]
    if "system_prompt" in knobs and isinstance(body.get("messages"), list):
        text, mode = knobs["system_prompt"]["text"], knobs["system_prompt"]["mode"]
        messages = list(body["messages"])
        if mode == "replace":
            messages = [m for m in messages if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))]
            messages.insert(0, {"role": "system", "content": text})
        elif messages and isinstance(messages[0], dict) and messages[0].get("role") in ("system", "developer"):
            first = copy.deepcopy(messages[0])
            content = first.get("content")
            if isinstance(content, list):
                first["content"] = [{"type": "text", "text": text}, *content]
            else:
                first["content"] = _join(text, content or "")
            messages[0] = first
        else:
            messages.insert(0, {"role": "system", "content": text})
        body["messages"] = messages
        applied["system_prompt"] = knobs["system_prompt"]
    return applied


def apply_openai_completions(body: dict[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    applied: dict[str, Any] = {}
    _sampling(body, knobs, applied)
    if "max_tokens" in knobs:
        body["max_tokens"] = knobs["max_tokens"]
        applied["max_tokens"] = knobs["max_tokens"]
    # A raw prompt has no system part and no reasoning setting: those knobs do not apply here.
    return applied


def apply_openai_responses(body: dict[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    applied: dict[str, Any] = {}
    _sampling(body, knobs, applied)
    if "max_tokens" in knobs:
        body["max_output_tokens"] = knobs["max_tokens"]
        applied["max_tokens"] = knobs["max_tokens"]
    if "reasoning_effort" in knobs:
        reasoning = dict(body["reasoning"]) if isinstance(body.get("reasoning"), dict) else {}
        reasoning["effort"] = knobs["reasoning_effort"]
        body["reasoning"] = reasoning
        applied["reasoning_effort"] = knobs["reasoning_effort"]
    if "system_prompt" in knobs:
        text, mode = knobs["system_prompt"]["text"], knobs["system_prompt"]["mode"]
        if mode == "replace":
            body["instructions"] = text
            if isinstance(body.get("input"), list):
                body["input"] = [
                    m for m in body["input"] if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))
                ]
        else:
            current = body.get("instructions")
            body["instructions"] = _join(text, current if isinstance(current, str) else "")
        applied["system_prompt"] = knobs["system_prompt"]
    return applied


def apply_anthropic_messages(body: dict[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    applied: dict[str, Any] = {}
    _sampling(body, knobs, applied)
    if "max_tokens" in knobs:
        body["max_tokens"] = knobs["max_tokens"]
        applied["max_tokens"] = knobs["max_tokens"]
    if "reasoning_effort" in knobs:
        _apply_thinking(body, str(knobs["reasoning_effort"]), applied)
    if "system_prompt" in knobs:
        text, mode = knobs["system_prompt"]["text"], knobs["system_prompt"]["mode"]
        current = body.get("system")
        if mode == "replace" or not current:
            body["system"] = text
        elif isinstance(current, list):
            body["system"] = [{"type": "text", "text": text}, *current]
        else:
            body["system"] = _join(text, str(current))
        applied["system_prompt"] = knobs["system_prompt"]
    return applied


def _apply_thinking(body: dict[str, Any], effort: str, applied: dict[str, Any]) -> None:
    """reasoning_effort on Messages: an extended-thinking budget. The budget counts inside max_tokens, so the answer
    keeps the room the agent asked for on top of it; thinking runs at temperature 1 only, so a lower one is lifted."""
    if effort in ("minimal", "none"):
        body["thinking"] = {"type": "disabled"}
        applied["reasoning_effort"] = effort
        applied["thinking"] = {"type": "disabled"}
        return
    budget = ANTHROPIC_THINKING_BUDGETS.get(effort)
    if budget is None:
        return  # an effort name Anthropic has no budget for: left out of the record rather than guessed
    requested = body.get("max_tokens")
    answer_room = requested if isinstance(requested, int) else 1024
    body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    body["max_tokens"] = budget + answer_room
    if "temperature" in body and body["temperature"] != 1:
        body["temperature"] = 1
        applied["temperature"] = 1
    body.pop("top_k", None)
    applied["reasoning_effort"] = effort
    applied["thinking"] = {"type": "enabled", "budget_tokens": budget}
