"""Training calls reach the policy server with sampling the loss can model, whatever the agent's SDK sends.

Real openai and anthropic SDKs -> the gateway on loopback -> a vLLM-style fake policy server that keeps every
request body: on a rollout with the `training_call` knob (what `agl train` registers) each field that shapes the
sampling distribution is dropped or written neutral, the agent's values are recorded on the call, and `agl train`
warns once per run; an evaluation rollout's calls keep every field as the agent sent it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agl_cli.training.sync_job import TrainingRun, overridden_message
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness
from rl_backend.gateway.knobs import validate_knobs
from rl_backend.gateway.training_fields import KNOB, NEUTRAL, RECORD_KEY
from rl_backend.store.db import RunStore

TRAINING = {"temperature": 1.0, "top_p": 1.0, KNOB: True}  # what `agl train` registers (sampling_overrides)
MSGS: Any = [{"role": "user", "content": "hello there"}]
TOOLS: Any = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {}}}}]
# Everything vLLM 0.32's chat and completions requests take that reshapes the distribution tokens are drawn from,
# plus a field no server knows yet (an allowlist drops it too).
VLLM_SHAPING: dict[str, Any] = {
    "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.3, "min_tokens": 4, "bad_words": ["x"],
    "allowed_token_ids": [1, 2, 3], "structured_outputs": {"choice": ["a", "b"]}, "ignore_eos": True,
    "thinking_token_budget": 8, "use_beam_search": True, "logits_processors": ["m.P"], "vllm_xargs": {"k": 1},
    "a_future_sampling_field": 0.5,
}


@pytest.fixture(scope="module")
def fake() -> FakeUpstream:
    return FakeUpstream(api_key=UPSTREAM_KEY)


def _chat_kwargs() -> dict[str, Any]:
    return {"temperature": 0.3, "top_p": 0.5, "presence_penalty": 0.5, "frequency_penalty": 0.4,
            "logit_bias": {"42": 10}, "seed": 7, "max_tokens": 20, "stop": ["\n\n"], "user": "me",
            "response_format": {"type": "json_object"}, "extra_body": dict(VLLM_SHAPING)}


def test_a_training_chat_call_reaches_the_policy_server_without_the_agents_sampling(h: Harness) -> None:
    client = h.openai("train-1", TRAINING)
    client.chat.completions.create(model="local/tiny", messages=MSGS, **_chat_kwargs())
    seen = h.fake.requests[-1].body
    # Only what asks for the answer and frames it; the training temperature, top_p 1, and every vLLM shaping off
    # (vLLM would otherwise fill them from the model's generation_config.json).
    assert seen == {"model": "tiny", "messages": MSGS, "seed": 7, "max_tokens": 20, "stop": ["\n\n"], "user": "me",
                    "temperature": 1.0, "top_p": 1.0, **NEUTRAL, "return_token_ids": True, "logprobs": True}
    [call] = h.calls("train-1")
    assert call.knobs_applied[RECORD_KEY] == {
        "temperature": 0.3, "top_p": 0.5, "presence_penalty": 0.5, "frequency_penalty": 0.4,
        "logit_bias": {"42": 10}, "response_format": {"type": "json_object"}, **VLLM_SHAPING}
    assert call.completion_token_ids and call.logprobs  # still a trainable call


def test_a_forced_tool_call_is_decoded_freely_on_training_calls_and_auto_is_kept(h: Harness) -> None:
    client = h.openai("train-2", TRAINING)
    forced = {"type": "function", "function": {"name": "run"}}
    client.chat.completions.create(model="local/tiny", messages=MSGS, tools=TOOLS, tool_choice=forced)
    assert "tool_choice" not in h.fake.requests[-1].body and h.fake.requests[-1].body["tools"] == TOOLS
    client.chat.completions.create(model="local/tiny", messages=MSGS, tools=TOOLS, tool_choice="required")
    client.chat.completions.create(model="local/tiny", messages=MSGS, tools=TOOLS, tool_choice="auto",
                                   response_format={"type": "text"}, temperature=1.0, top_p=1.0)
    last = h.fake.requests[-1].body
    assert last["tool_choice"] == "auto" and last["response_format"] == {"type": "text"}
    first, second, third = h.calls("train-2")
    assert first.knobs_applied[RECORD_KEY] == {"tool_choice": forced}
    assert second.knobs_applied[RECORD_KEY] == {"tool_choice": "required"}
    assert RECORD_KEY not in third.knobs_applied  # nothing the agent asked for was changed
    assert h.store.sampling_overridden() == {"tool_choice": 2}


def test_a_training_completions_call_is_restricted_like_chat(h: Harness) -> None:
    client = h.openai("train-3", TRAINING)
    client.completions.create(model="local/tiny", prompt="Say hi", max_tokens=5, temperature=0.2,
                              presence_penalty=1.0, logit_bias={"7": -100}, best_of=1, suffix="!",
                              extra_body={"top_k": 3, "min_p": 0.2})
    seen = h.fake.requests[-1].body
    assert seen == {"model": "tiny", "prompt": "Say hi", "max_tokens": 5, "temperature": 1.0, "top_p": 1.0,
                    **NEUTRAL, "return_token_ids": True, "logprobs": 1}
    [call] = h.calls("train-3")
    assert call.knobs_applied[RECORD_KEY] == {"temperature": 0.2, "presence_penalty": 1.0, "logit_bias": {"7": -100},
                                              "best_of": 1, "suffix": "!", "top_k": 3, "min_p": 0.2}


@pytest.mark.parametrize("stream", [False, True])
def test_a_training_messages_call_from_the_anthropic_sdk_reaches_vllm_without_top_k(h: Harness, stream: bool) -> None:
    client = h.anthropic("train-4", TRAINING)
    tools: Any = [{"name": "run", "input_schema": {"type": "object", "properties": {}}}]
    # anthropic 2.x takes the sampling fields only as extra_body (older SDKs as arguments): the same JSON arrives.
    kwargs: dict[str, Any] = {"model": "local/tiny", "max_tokens": 30, "messages": MSGS, "system": "Be brief.",
                              "tools": tools, "tool_choice": {"type": "any"},
                              "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
                              "extra_body": {"temperature": 0.4, "top_p": 0.9, "top_k": 5,
                                             "a_future_sampling_field": 1}}
    if stream:
        with client.messages.stream(**kwargs) as s:
            s.get_final_message()
    else:
        client.messages.create(**kwargs)
    seen = h.fake.requests[-1].body
    assert {k: seen[k] for k in ("temperature", "top_p", *NEUTRAL)} == {"temperature": 1.0, "top_p": 1.0, **NEUTRAL}
    assert "tool_choice" not in seen and seen["tools"][0]["function"]["name"] == "run"
    assert seen["messages"][0] == {"role": "system", "content": "Be brief."} and seen["max_tokens"] == 30
    [call] = h.calls("train-4")
    assert call.knobs_applied[RECORD_KEY] == {
        "temperature": 0.4, "top_p": 0.9, "top_k": 5, "tool_choice": {"type": "any"}, "a_future_sampling_field": 1,
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}


def test_an_evaluation_call_keeps_every_field_the_agent_sent(h: Harness) -> None:
    client = h.openai("eval-1")
    client.chat.completions.create(model="local/tiny", messages=MSGS, **_chat_kwargs())
    seen = h.fake.requests[-1].body
    assert seen["temperature"] == 0.3 and seen["top_p"] == 0.5 and seen["presence_penalty"] == 0.5
    assert all(seen[k] == v for k, v in VLLM_SHAPING.items())
    assert RECORD_KEY not in h.calls("eval-1")[0].knobs_applied
    assert h.store.sampling_overridden() == {}


def test_the_training_knob_takes_true_or_false_only() -> None:
    assert validate_knobs({KNOB: True}) == {KNOB: True}
    assert validate_knobs({KNOB: False}) == {}
    with pytest.raises(ValueError, match="must be true or false"):
        validate_knobs({KNOB: "yes"})


def test_train_warns_once_per_run_naming_each_overridden_field(h: Harness, tmp_path: Path) -> None:
    client = h.openai("train-5", TRAINING)
    run = object.__new__(TrainingRun)  # only the log and the store matter to the warning
    logged: list[str] = []
    run.log = logged.append
    steps: list[int] = []
    step = run._warn_overridden(h.store, steps.append)
    client.chat.completions.create(model="local/tiny", messages=MSGS)
    h.calls()
    step(1)
    assert steps == [1] and logged == []  # nothing overridden yet: nothing said
    for _ in range(2):
        client.chat.completions.create(model="local/tiny", messages=MSGS, extra_body={"top_k": 5, "min_p": 0.1})
    h.calls()
    step(2)
    client.chat.completions.create(model="local/tiny", messages=MSGS, presence_penalty=0.3)
    h.calls()
    step(3)
    assert steps == [1, 2, 3]
    [warning] = logged
    assert warning == overridden_message({"min_p": 2, "top_k": 2})
    assert "min_p (2 calls), top_k (2 calls)" in warning and "--temperature" in warning
    # The run's record holds every field, with the calls it was overridden on.
    assert RunStore(h.store_path).sampling_overridden() == {"min_p": 2, "presence_penalty": 1, "top_k": 2}
