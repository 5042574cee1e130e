"""Gateway, the other APIs: completions, responses, Anthropic Messages (direct and over an OpenAI upstream), admin."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from rl_backend.gateway import Gateway, start_gateway
from rl_backend.gateway.config import ResolvedUpstream
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness
from rl_backend.gateway.fake.replies import token_id
from rl_backend.store.db import RunStore
from rl_backend.store.records import Api

REPLY = "You said: hello there"
REPLY_IDS = [token_id(t) for t in ("You ", "said: ", "hello ", "there")]
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def fakes() -> tuple[FakeUpstream, FakeUpstream]:
    """An OpenAI-style and an Anthropic-style upstream, both served to the gateway in-process."""
    return FakeUpstream(api_key=UPSTREAM_KEY), FakeUpstream(api_key=UPSTREAM_KEY)


@pytest.fixture()
def h(fakes: tuple[FakeUpstream, FakeUpstream]) -> Iterator[Harness]:
    for f in fakes:
        f.reset()
    with Harness(fakes[0], fake_anthropic=fakes[1], admin_token="admin-secret") as harness:
        yield harness


# -- completions ----------------------------------------------------------------------------------------------------


def test_completions_stream_and_not(h: Harness) -> None:
    client = h.openai("r1")
    whole = client.completions.create(model="x", prompt="hello there", max_tokens=20)
    assert whole.choices[0].text == REPLY and whole.choices[0].logprobs is None
    assert "token_ids" not in (whole.choices[0].model_extra or {})
    sent = h.fake.requests[-1].body
    assert (sent["return_token_ids"], sent["logprobs"], sent["model"]) == (True, 1, "tiny")
    chunks = list(client.completions.create(model="x", prompt="hello there", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == REPLY
    assert all(c.choices and c.choices[0].logprobs is None and c.usage is None for c in chunks)
    kept = client.completions.create(model="x", prompt="hello there", logprobs=2)
    assert kept.choices[0].logprobs is not None and len(kept.choices[0].logprobs.token_logprobs or []) == 4

    plain, streamed, _ = h.calls("r1")
    for rec in (plain, streamed):
        assert rec.api == Api.openai_completions and rec.error is None
        assert rec.prompt_token_ids == [token_id("hello"), token_id("there")]
        assert rec.completion_token_ids == REPLY_IDS
        assert rec.logprobs == [-0.01, -0.02, -0.03, -0.04]
        assert (rec.input_tokens, rec.output_tokens) == (2, 4)
    assert streamed.response is not None and streamed.response["choices"][0]["text"] == REPLY
    assert streamed.ttft_s is not None


# -- responses ------------------------------------------------------------------------------------------------------


def test_responses_stream_and_not(h: Harness) -> None:
    client = h.openai("r1", {"system_prompt": {"text": "Be kind.", "mode": "replace"}, "max_tokens": 64})
    whole = client.responses.create(model="x", input="hello there", instructions="Be mean.")
    assert whole.output_text == REPLY
    sent = h.fake.requests[-1].body
    assert (sent["instructions"], sent["max_output_tokens"]) == ("Be kind.", 64)
    events = list(client.responses.create(model="x", input="hello there", stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == REPLY
    assert events[-1].type == "response.completed"
    plain, streamed = h.calls("r1")
    for rec in (plain, streamed):
        assert rec.api == Api.openai_responses and rec.status_code == 200 and rec.error is None
        assert (rec.input_tokens, rec.output_tokens) == (4, 4)  # "Be kind." + "hello there"
        assert rec.response is not None and rec.response["output"][0]["content"][0]["text"] == REPLY
        assert rec.knobs_applied == {"system_prompt": {"text": "Be kind.", "mode": "replace"}, "max_tokens": 64}
    assert streamed.stream and streamed.ttft_s is not None
    h.fake.fail("reset", after_events=4)
    with pytest.raises(openai.APIError, match="mid-stream"):
        list(client.responses.create(model="x", input="hello there", stream=True))
    broken = h.calls("r1")[-1]
    assert (broken.error or "").startswith("upstream_stream_broken")
    assert broken.response == {"object": "response", "status": "incomplete", "output_text": "You "}


# -- Anthropic Messages to an Anthropic upstream -------------------------------------------------------------------


def test_anthropic_passthrough(h: Harness) -> None:
    assert h.fake_anthropic is not None
    h.fake_anthropic.cached_tokens = 1
    try:
        client = h.anthropic("r1")
        msgs: Any = [{"role": "user", "content": "hello there"}]
        whole = client.messages.create(model="claude/claude-sonnet-4-5", max_tokens=50, messages=msgs, system="Hi.")
        assert whole.content[0].type == "text" and whole.content[0].text == REPLY
        seen = h.fake_anthropic.requests[-1]
        assert seen.headers["x-api-key"] == UPSTREAM_KEY and "authorization" not in seen.headers
        assert seen.headers["anthropic-version"] and seen.body["model"] == "claude-sonnet-4-5"
        with client.messages.stream(model="claude/claude-sonnet-4-5", max_tokens=50, messages=msgs, system="Hi.") as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert text == REPLY and final.usage.output_tokens == 4 and final.stop_reason == "end_turn"
        plain, streamed = h.calls("r1")
        n_in = 5  # "system: Hi." + "user: hello there"
        for rec in (plain, streamed):
            assert rec.api == Api.anthropic_messages and (rec.upstream, rec.model) == ("claude", "claude-sonnet-4-5")
            assert (rec.input_tokens, rec.cached_tokens, rec.output_tokens) == (n_in, 1, 4)
            assert rec.cost_usd == pytest.approx(((n_in - 1) * 3.0 + 1 * 0.3 + 4 * 15.0) / 1e6)
            assert rec.response is not None and rec.response["content"] == [{"type": "text", "text": REPLY}]
            assert rec.prompt_token_ids is None
        assert streamed.stream and streamed.ttft_s is not None
    finally:
        h.fake_anthropic.cached_tokens = 0


def test_anthropic_auth_and_errors_in_anthropic_shape(h: Harness) -> None:
    assert h.fake_anthropic is not None
    token = h.rollout("r1")
    h.rollout("r2")
    bearer = anthropic.Anthropic(base_url=h.anthropic_url("r1"), auth_token=token, max_retries=0)
    msgs: Any = [{"role": "user", "content": "hi"}]
    assert bearer.messages.create(model="claude/c", max_tokens=5, messages=msgs).content
    other = anthropic.Anthropic(base_url=h.anthropic_url("r2"), api_key=token, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        other.messages.create(model="claude/c", max_tokens=5, messages=msgs)
    assert err.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": err.value.body["error"]["message"]},  # type: ignore[index]
    }
    url = h.anthropic_url("r1") + "/v1/messages"
    r = httpx.post(url, json={"model": "claude/c", "messages": msgs}, headers={"x-api-key": token})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "`max_tokens` is required" in r.json()["error"]["message"]
    r = httpx.post(
        url,
        json={"model": "claude/c", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
        headers={"x-api-key": token},
    )
    assert r.status_code == 400 and "system prompt goes in `system`" in r.json()["error"]["message"]
    h.fake_anthropic.fail("status", status=529)  # overloaded: retried
    assert bearer.messages.create(model="claude/c", max_tokens=5, messages=msgs).content
    with pytest.raises(openai.BadRequestError, match="speaks the Anthropic API"):
        h.openai("r3").chat.completions.create(model="claude/c", messages=msgs)


# -- Anthropic Messages over an OpenAI-compatible upstream -------------------------------------------------------


def test_anthropic_sdk_on_an_openai_upstream(h: Harness) -> None:
    client = h.anthropic("r1")
    msgs: Any = [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
    whole = client.messages.create(model="local/tiny", max_tokens=50, messages=msgs, system="Be brief.")
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text == REPLY  # type: ignore[union-attr]
    assert whole.stop_reason == "end_turn" and whole.usage.output_tokens == 4
    sent = h.fake.requests[-1].body
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    assert (sent["max_tokens"], sent["return_token_ids"]) == (50, True)
    with client.messages.stream(model="local/tiny", max_tokens=50, messages=msgs, system="Be brief.") as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == REPLY and final.usage.input_tokens == whole.usage.input_tokens
    assert final.stop_reason == "end_turn"
    plain, streamed = h.calls("r1")
    for rec in (plain, streamed):
        assert (rec.api, rec.upstream, rec.model, rec.error) == (Api.anthropic_messages, "local", "tiny", None)
        assert rec.completion_token_ids == REPLY_IDS and rec.logprobs == [-0.01, -0.02, -0.03, -0.04]
        assert rec.response is not None and rec.response["content"] == [{"type": "text", "text": REPLY}]
        assert rec.request["system"] == "Be brief."


def test_anthropic_tools_over_openai_upstream(h: Harness) -> None:
    client = h.anthropic("r1")
    ask: Any = [{"role": "user", "content": "[[tool]] weather in Paris?"}]
    whole = client.messages.create(model="local/tiny", max_tokens=50, messages=ask, tools=[WEATHER])  # type: ignore[list-item]
    assert whole.stop_reason == "tool_use"
    [call] = whole.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.input["city"] == "Paris"  # type: ignore[index]
    sent = h.fake.requests[-1].body
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": WEATHER["input_schema"], "description": "Weather in a city"},
        }
    ]
    with client.messages.stream(model="local/tiny", max_tokens=50, messages=ask, tools=[WEATHER]) as s:  # type: ignore[list-item]
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use"
    assert final.content[0].input == call.input and final.content[0].id == call.id  # type: ignore[union-attr]
    # The agent answers the tool call; the result reaches the upstream as a `tool` message.
    follow: Any = [
        *ask,
        {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]},
    ]
    answer = client.messages.create(
        model="local/tiny",
        max_tokens=50,
        messages=follow,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "auto"},
    )
    assert answer.content[0].text == "You said: sunny"  # type: ignore[union-attr]
    sent = h.fake.requests[-1].body
    assert sent["messages"][1]["tool_calls"][0]["id"] == call.id
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": call.id, "content": "sunny"}
    assert sent["tool_choice"] == "auto"
    recs = h.calls("r1")
    assert [r.response["stop_reason"] for r in recs if r.response] == ["tool_use", "tool_use", "end_turn"]
    server_tool: Any = [{"type": "web_search_20250305", "name": "web_search"}]
    with pytest.raises(anthropic.BadRequestError, match="server tools"):
        client.messages.create(model="local/tiny", max_tokens=5, messages=ask, tools=server_tool)


def test_translated_upstream_errors_are_anthropic_shaped(h: Harness) -> None:
    client = h.anthropic("r1")
    msgs: Any = [{"role": "user", "content": "hi"}]
    h.fake.fail("status", status=400)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="local/tiny", max_tokens=5, messages=msgs)
    assert err.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "fake upstream failure 400"},
    }
    h.fake.fail("reset", after_events=2)
    with (
        pytest.raises(anthropic.APIStatusError, match="mid-stream"),
        client.messages.stream(model="local/tiny", max_tokens=5, messages=msgs) as s,
    ):
        s.get_final_message()
    assert (h.calls("r1")[-1].error or "").startswith("upstream_stream_broken")


# -- admin ------------------------------------------------------------------------------------------------------------


def test_pause_drains_in_flight_and_refuses_new_calls(h: Harness) -> None:
    admin = {"authorization": "Bearer admin-secret"}
    client = h.openai("r1")
    msgs: Any = [{"role": "user", "content": "hello there"}]
    results: list[str] = []
    h.fake.fail("slow", delay_s=0.6)
    worker = threading.Thread(
        target=lambda: results.append(client.chat.completions.create(model="x", messages=msgs).choices[0].message.content)
    )
    worker.start()
    deadline = time.monotonic() + 5
    while h.gateway.in_flight == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    r = httpx.post(f"{h.base_url}/admin/pause", headers=admin)
    assert r.status_code == 200 and r.json()["paused"] and r.json()["in_flight"] == 1
    with pytest.raises(openai.RateLimitError, match="paused") as err:
        client.chat.completions.create(model="x", messages=msgs)
    assert err.value.response.headers["retry-after"] == "2"
    r = httpx.post(f"{h.base_url}/admin/pause", json={"drain_timeout_s": 5}, headers=admin)
    assert r.json()["drained"] is True and r.json()["in_flight"] == 0
    worker.join(5)
    assert results == [REPLY]  # the call in flight finished normally
    r = httpx.post(f"{h.base_url}/admin/resume", json={"model_version": "step-3"}, headers=admin)
    assert r.status_code == 200 and r.json() == {**r.json(), "paused": False, "model_version": "step-3"}
    client.chat.completions.create(model="x", messages=msgs)
    state = httpx.get(f"{h.base_url}/admin/state", headers=admin).json()
    assert (state["in_flight"], state["model_version"], state["paused"]) == (0, "step-3", False)
    recs = h.calls("r1")
    assert [r.model_version for r in recs] == [None, "step-3"]  # the upstream reports none: the gateway's
    assert httpx.get(f"{h.base_url}/admin/state").status_code == 401
    assert httpx.get(f"{h.base_url}/admin/state", headers={"authorization": "Bearer r1"}).status_code == 401


def test_admin_is_off_without_a_token_and_wide_binding_needs_one(tmp_path: Any) -> None:
    store = RunStore(tmp_path / "s.sqlite")
    upstreams = {"u": ResolvedUpstream(name="u", api="openai", base_urls=["http://127.0.0.1:9/v1"])}
    gateway = Gateway(upstreams, store, default_model="u/m")
    with pytest.raises(ValueError, match="needs an admin token"):
        start_gateway(gateway, host="0.0.0.0")
    server = start_gateway(gateway)
    try:
        r = httpx.get(f"{server.base_url}/admin/state", headers={"authorization": "Bearer x"})
        assert r.status_code == 403 and "without an admin token" in r.json()["error"]["message"]
        assert gateway.base_url == server.base_url
    finally:
        server.stop()
        store.close()
