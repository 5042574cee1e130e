"""The knob table: every setting the gateway can write into a rollout's requests, defined once.

A `Knob` says which values it takes (`check`, which also puts a value in the form the gateway applies) and, for each
API, where the value goes (`apply`: an edit of the request body, already a private copy, returning what it applied,
which is recorded on the call). A knob an API has no place for is left out of that record rather than faked.
agl.yaml's `via: gateway` knobs (agl_cli/spec/schema.py), the gateway's admission of a rollout (`validate_knobs`), the
request adapters (`apply_knobs`) and the reference docs all read this table.

A knob set to None is not applied: the request keeps whatever the agent sent (or left out), so an option `null`
measures the agent as it is. A knob may also be limited to some models (`scoped`): `{"value": V, "models":
[patterns]}` applies V only to the calls served by a model that matches (`knobs_for_call`, once the call is routed),
so a parameter some models refuse reaches only the models that take it.
"""

from __future__ import annotations

import copy
import fnmatch
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_backend.gateway import training_fields
from rl_backend.store.records import Api

# An edit of a request body for one knob value; returns what it applied (knob name -> value), {} for nothing.
Applier = Callable[[dict[str, Any], Any], dict[str, Any]]

_EFFORTS = ("minimal", "low", "medium", "high")
# Anthropic expresses reasoning effort as an extended-thinking token budget; these are the budgets each effort maps
# to (1,024 is the API's minimum). "minimal" and "none" turn thinking off.
ANTHROPIC_THINKING_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384}


@dataclass(frozen=True)
class Placement:
    """Where one knob goes in one API's request: `where` for people, `apply` for the gateway."""

    where: str
    apply: Applier


@dataclass(frozen=True)
class Knob:
    name: str
    takes: str  # its values, for people
    check: Callable[[Any], Any]  # the value as the gateway applies it; ValueError with the fix
    placements: Mapping[Api, Placement] = field(default_factory=dict)
    from_files: bool = False  # agl.yaml gives its options as files, whose text is the value


# -- checks ---------------------------------------------------------------------------------------------------------


def _model(value: Any) -> str:
    if not isinstance(value, str) or "/" not in value:
        raise ValueError(f"knob 'model' must be an 'upstream/model' string, got {value!r}")
    return value


def _number(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"knob {name!r} must be a finite number, got {value!r}")
        return float(value) if isinstance(value, float) else value

    return check


def _max_tokens(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"knob 'max_tokens' must be a positive integer, got {value!r}")
    return value


def _effort(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"knob 'reasoning_effort' must be a string such as {_EFFORTS}, got {value!r}")
    return value


def _system_prompt(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        value = {"text": value, "mode": "replace"}
    if (
        not isinstance(value, Mapping)
        or not isinstance(value.get("text"), str)
        or value.get("mode", "replace") not in ("replace", "prepend")
        or set(value) - {"text", "mode"}
    ):
        raise ValueError("knob 'system_prompt' must be {'text': str, 'mode': 'replace' | 'prepend'}, got " + repr(value))
    return {"text": value["text"], "mode": value.get("mode", "replace")}


# -- placements -----------------------------------------------------------------------------------------------------


def _routed(body: dict[str, Any], value: Any) -> dict[str, Any]:
    return {"model": value}  # the router already sent the call to that upstream and model


def _field(knob: str, name: str) -> Placement:
    def apply(body: dict[str, Any], value: Any) -> dict[str, Any]:
        body[name] = value
        return {knob: value}

    return Placement(f"`{name}`", apply)


def _chat_max_tokens(body: dict[str, Any], value: Any) -> dict[str, Any]:
    # Newer OpenAI models take only max_completion_tokens; keep whichever field the agent used.
    body["max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"] = value
    return {"max_tokens": value}


def _responses_effort(body: dict[str, Any], value: Any) -> dict[str, Any]:
    reasoning = dict(body["reasoning"]) if isinstance(body.get("reasoning"), dict) else {}
    reasoning["effort"] = value
    body["reasoning"] = reasoning
    return {"reasoning_effort": value}


def _thinking(body: dict[str, Any], effort: Any) -> dict[str, Any]:
    """reasoning_effort on Messages: an extended-thinking budget. The budget counts inside max_tokens, so the answer
    keeps the room the agent asked for on top of it; thinking runs at temperature 1 only, so a lower one is lifted."""
    if effort in ("minimal", "none"):
        body["thinking"] = {"type": "disabled"}
        return {"reasoning_effort": effort, "thinking": {"type": "disabled"}}
    budget = ANTHROPIC_THINKING_BUDGETS.get(effort)
    if budget is None:
        return {}  # an effort name Anthropic has no budget for: left out of the record rather than guessed
    applied: dict[str, Any] = {}
    requested = body.get("max_tokens")
    answer_room = requested if isinstance(requested, int) else 1024
    body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    body["max_tokens"] = budget + answer_room
    if "temperature" in body and body["temperature"] != 1:
        body["temperature"] = 1
        applied["temperature"] = 1
    body.pop("top_k", None)
    return {**applied, "reasoning_effort": effort, "thinking": {"type": "enabled", "budget_tokens": budget}}


def _join(first: str, second: str) -> str:
    return f"{first}\n\n{second}" if second else first


def _is_system(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") in ("system", "developer")


def _chat_system(body: dict[str, Any], value: Any) -> dict[str, Any]:
    if not isinstance(body.get("messages"), list):
        return {}
    text, mode = value["text"], value["mode"]
    messages = list(body["messages"])
    if mode == "replace":
        messages = [m for m in messages if not _is_system(m)]
        messages.insert(0, {"role": "system", "content": text})
    elif messages and _is_system(messages[0]):
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
    return {"system_prompt": value}


def _responses_system(body: dict[str, Any], value: Any) -> dict[str, Any]:
    text, mode = value["text"], value["mode"]
    if mode == "replace":
        body["instructions"] = text
        if isinstance(body.get("input"), list):
            body["input"] = [m for m in body["input"] if not _is_system(m)]
    else:
        current = body.get("instructions")
        body["instructions"] = _join(text, current if isinstance(current, str) else "")
    return {"system_prompt": value}


def _messages_system(body: dict[str, Any], value: Any) -> dict[str, Any]:
    text, mode = value["text"], value["mode"]
    current = body.get("system")
    if mode == "replace" or not current:
        body["system"] = text
    elif isinstance(current, list):
        body["system"] = [{"type": "text", "text": text}, *current]
    else:
        body["system"] = _join(text, str(current))
    return {"system_prompt": value}


def _everywhere(placement: Placement) -> dict[Api, Placement]:
    return dict.fromkeys(Api, placement)


# -- the table ------------------------------------------------------------------------------------------------------

_CHAT, _COMPLETIONS, _RESPONSES = Api.openai_chat, Api.openai_completions, Api.openai_responses
_MESSAGES = Api.anthropic_messages
_TABLE = (
    Knob("model", "upstream/model", _model, _everywhere(Placement("routes the call to that upstream and model", _routed))),
    Knob("temperature", "a number", _number("temperature"), _everywhere(_field("temperature", "temperature"))),
    Knob("top_p", "a number", _number("top_p"), _everywhere(_field("top_p", "top_p"))),
    Knob("max_tokens", "a positive integer", _max_tokens, {
        _CHAT: Placement("`max_completion_tokens` when the agent used it, else `max_tokens`", _chat_max_tokens),
        _COMPLETIONS: _field("max_tokens", "max_tokens"),
        _RESPONSES: _field("max_tokens", "max_output_tokens"),
        _MESSAGES: _field("max_tokens", "max_tokens"),
    }),
    # Applied after max_tokens: the thinking budget is added to the answer's room.
    Knob("reasoning_effort", "minimal, low, medium or high", _effort, {
        _CHAT: _field("reasoning_effort", "reasoning_effort"),
        _RESPONSES: Placement("`reasoning.effort`", _responses_effort),
        _MESSAGES: Placement(
            "a `thinking` budget on top of `max_tokens` (low 1024, medium 4096, high 16384 tokens; minimal turns "
            "thinking off; temperature becomes 1); an OpenAI-compatible upstream gets `reasoning_effort`", _thinking),
    }),
    Knob("system_prompt", "prompt files, `mode: replace` or `prepend`", _system_prompt, {
        _CHAT: Placement("a system message first (replace drops the agent's system and developer messages; prepend "
                         "joins the first one)", _chat_system),
        _RESPONSES: Placement("`instructions` (replace also drops system and developer input items)", _responses_system),
        _MESSAGES: Placement("`system`", _messages_system),
    }, from_files=True),
)
KNOBS: dict[str, Knob] = {knob.name: knob for knob in _TABLE}


def scoped(value: Any, models: Iterable[str]) -> dict[str, Any]:
    """A knob setting that applies only to calls served by a model matching one of `models`."""
    return {"value": value, "models": list(models)}


def is_scoped(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == {"value", "models"}


def model_matches(patterns: Iterable[str], upstream: str, model: str) -> bool:
    """Whether a call served by `upstream`/`model` is one a scoped knob applies to. A pattern with a slash matches
    `upstream/model`, one without matches the model name on any upstream; `*` and `?` are wildcards."""
    full = f"{upstream}/{model}"
    return any(fnmatch.fnmatchcase(full if "/" in p else model, p) for p in patterns)


def check_models(name: str, models: Any) -> list[str]:
    """The model patterns of a scoped knob, checked; ValueError with the fix."""
    if name == "model":
        raise ValueError("knob 'model' chooses the model of every call; it cannot be limited to some models")
    if (not isinstance(models, list | tuple) or not models
            or not all(isinstance(m, str) and m.strip() for m in models)):
        raise ValueError(f"knob {name!r}: `models` must be a non-empty list of model names or patterns, such as "
                         f"['openai/gpt-5*'], got {models!r}")
    return list(models)


def validate_knobs(knobs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The knobs the gateway will apply, checked; None values mean 'not set'. A scoped setting stays scoped (its
    value checked). Raises ValueError with the fix."""
    result: dict[str, Any] = {}
    for name, value in (knobs or {}).items():
        if name == training_fields.KNOB:  # set by `agl train` on its own rollouts, not a knob of agl.yaml
            if not isinstance(value, bool):
                raise ValueError(f"knob {name!r} must be true or false, got {value!r}")
            if value:
                result[name] = True
            continue
        models = None
        if is_scoped(value):
            models, value = check_models(name, value["models"]), value["value"]
        if value is None:
            continue
        knob = KNOBS.get(name)
        if knob is None:
            raise ValueError(f"unknown gateway knob {name!r}; the gateway applies {', '.join(KNOBS)}")
        checked = knob.check(value)
        result[name] = checked if models is None else scoped(checked, models)
    return result


def knobs_for_call(knobs: Mapping[str, Any], upstream: str, model: str) -> dict[str, Any]:
    """A rollout's checked knobs as they apply to one routed call: scoped settings kept only when the call's model
    matches, and unwrapped."""
    result: dict[str, Any] = {}
    for name, value in knobs.items():
        if is_scoped(value):
            if model_matches(value["models"], upstream, model):
                result[name] = value["value"]
        else:
            result[name] = value
    return result


def apply_knobs(api: Api, body: dict[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    """Write checked knobs (as `knobs_for_call` gives them) into a request body of `api`, in table order; returns
    what was applied."""
    applied: dict[str, Any] = {}
    # A training call: the fields that could change sampling go first, so that the knobs (the training
    # temperature) write theirs into what is left.
    dropped = training_fields.restrict(api, body) if knobs.get(training_fields.KNOB) else None
    if knobs:
        for knob in _TABLE:
            placement = knob.placements.get(api) if knob.name in knobs else None
            if placement is not None:
                applied.update(placement.apply(body, knobs[knob.name]))
    if dropped is not None and (changed := training_fields.overridden(dropped, body)):
        applied[training_fields.RECORD_KEY] = changed
    return applied
