"""Training calls sample from the policy's whole distribution, whatever the agent's request asks.

A trainer's loss compares the policy server's recorded logprobs with its own recompute, both of the model's raw
distribution (at the training temperature). A token drawn under top_k, min_p, a penalty, a logit bias, a grammar
(response_format, a forced tool choice) or any other shaping comes from a distribution neither describes: the
gradient is biased and nothing says so. So on a training call (the rollout's `training_call` knob, set by `agl
train`) only the fields in an allowlist reach the policy server, per API; every other field the agent sent is dropped,
and the ones whose value the call did not keep are recorded on the call (`sampling_overridden`), which `agl train`
reports once per run. An allowlist, not a list of known offenders: a field a new SDK or server version adds is
dropped until someone decides it leaves sampling alone. The agent itself is unchanged.

Dropping is not enough for vLLM: it fills fields a request leaves out from the model's generation_config.json (a
Qwen model brings top_k 20, repetition_penalty 1.05). `NEUTRAL` writes the values that turn each shaping off; the
embedded engine takes them too (penalties of 0 are accepted, the rest it ignores).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl_backend.store.records import Api

KNOB = "training_call"  # the rollout knob that marks its calls as training calls
RECORD_KEY = "sampling_overridden"  # in a call's knobs_applied: {field: the agent's value}

# Fields that decide what is asked and how the answer is framed or cut off, never which token is drawn with what
# probability. (stop and max_tokens end a completion: the tokens drawn before are still the policy's.)
_OPENAI_COMMON = frozenset({
    "model", "stream", "stream_options", "user", "metadata", "store", "seed", "n", "logprobs", "top_logprobs",
    "return_token_ids", "max_tokens", "stop", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
    "spaces_between_special_tokens", "prompt_cache_key", "safety_identifier", "service_tier", "request_id",
})
_ALLOWED: dict[Api, frozenset[str]] = {
    Api.openai_chat: _OPENAI_COMMON | {
        "messages", "max_completion_tokens", "tools", "parallel_tool_calls", "reasoning_effort", "include_reasoning",
        "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "modalities",
    },
    Api.openai_completions: _OPENAI_COMMON | {"prompt", "echo"},
    Api.openai_responses: frozenset({
        "model", "input", "instructions", "stream", "stream_options", "max_output_tokens", "tools",
        "parallel_tool_calls", "previous_response_id", "conversation", "store", "metadata", "user", "include",
        "reasoning", "top_logprobs", "prompt_cache_key", "safety_identifier", "service_tier", "truncation",
        "background",
    }),
    Api.anthropic_messages: frozenset({
        "model", "messages", "max_tokens", "system", "stop_sequences", "stream", "tools", "metadata", "service_tier",
        "cache_control",
    }),
}

# Kept only with a value that leaves sampling alone: a forced tool call or an output format is decoded under a
# grammar, which masks tokens the recorded logprobs still count.
_FREE_TOOL_CHOICES = ("auto", "none")


def _neutral_when(api: Api, name: str, value: Any) -> bool:
    if name == "tool_choice":
        kind = value.get("type") if api is Api.anthropic_messages and isinstance(value, dict) else value
        return kind in _FREE_TOOL_CHOICES
    if name == "response_format":
        return isinstance(value, dict) and value.get("type") == "text"
    if name == "text" and api is Api.openai_responses:
        fmt = value.get("format") if isinstance(value, dict) else None
        return isinstance(value, dict) and (fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"))
    return False


# What turns each vLLM sampling field off, written on every chat or completions training call (see the docstring).
NEUTRAL: dict[str, Any] = {
    "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
}
_NEUTRAL_APIS = (Api.openai_chat, Api.openai_completions)


def restrict(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    """Drop from `body` (a private copy) every field a training call does not forward, write the neutral values;
    returns the agent's values of the dropped fields (None values left out: they ask for nothing)."""
    allowed = _ALLOWED[api]
    dropped: dict[str, Any] = {}
    for name in list(body):
        value = body[name]
        if name in allowed or _neutral_when(api, name, value):
            continue
        del body[name]
        if value is not None:
            dropped[name] = value
    if api in _NEUTRAL_APIS:
        body.update(NEUTRAL)
    return dropped


def neutral_chat(chat: dict[str, Any]) -> None:
    """The neutral values on a chat request made from another API's (Anthropic Messages served by vLLM)."""
    chat.update(NEUTRAL)


def overridden(dropped: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's values that the request as sent does not carry (a dropped temperature that the training
    temperature knob wrote back with the same value was not overridden)."""
    return {name: value for name, value in dropped.items() if name not in body or body[name] != value}
