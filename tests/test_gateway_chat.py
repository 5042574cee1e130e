"""Gateway, OpenAI chat completions: real openai SDK -> gateway on loopback -> scripted fake upstream (in-process, or
on loopback where the test is about replicas)."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from rl_backend.gateway.config import ResolvedUpstream
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness
from rl_backend.gateway.fake.replies import token_id
from rl_backend.store.records import Api

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
REPLY = "You said: hello there"
REPLY_IDS = [token_id(t) for t in ("You ", "said: ", "hello ", "there")]
PROMPT_IDS = [token_id(w) for w in ["system:", "Be", "brief.", "user:", "hello", "there"]]


@pytest.fixture(scope="module")
def fake() -> FakeUpstream:
    return FakeUpstream(api_key=UPSTREAM_KEY, model_version="v7")


def test_non_streaming_call_is_recorded_exactly(h: Harness) -> None:
    client = h.openai("r1", {"temperature": 0.5})
    result = client.chat.completions.create(model="gpt-4o", messages=MSGS)
    assert result.choices[0].message.content == REPLY
    # The agent sees the shape it asked for: no token ids, no logprobs it did not request.
    assert result.choices[0].logprobs is None
    assert "prompt_token_ids" not in (result.model_extra or {})
    assert "token_ids" not in (result.choices[0].model_extra or {})
    # What reached the upstream: routed model, knob, our instrumentation, the upstream's own key.
    seen = h.fake.requests[-1]
    assert seen.body == {"model": "tiny", "messages": MSGS, "temperature": 0.5, "return_token_ids": True, "logprobs": True}
    assert seen.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"

    [rec] = h.calls("r1")
    assert rec.call_id.startswith("call-")
    assert rec.rollout_id == "r1"
    assert rec.api == Api.openai_chat
    assert (rec.upstream, rec.request_model, rec.model) == ("local", "gpt-4o", "tiny")
    assert rec.request == {"model": "tiny", "messages": MSGS, "temperature": 0.5}
    assert rec.response is not None and rec.response["choices"][0]["message"]["content"] == REPLY
    assert "prompt_token_ids" not in rec.response
    assert (rec.stream, rec.status_code, rec.error) == (False, 200, None)
    assert (rec.input_tokens, rec.output_tokens, rec.cached_tokens, rec.reasoning_tokens) == (len(PROMPT_IDS), 4, 0, 0)
    assert rec.cost_usd == 0.0  # a loopback, token-id-returning upstream is ours: free
    assert rec.prompt_token_ids == PROMPT_IDS
    assert rec.completion_token_ids == REPLY_IDS
    assert rec.logprobs == [-0.01, -0.02, -0.03, -0.04]
    assert rec.model_version == "v7"
    assert rec.knobs_applied == {"temperature": 0.5}
    assert rec.latency_s is not None and 0 < rec.latency_s < 5
    assert rec.ttft_s is None
    assert rec.started_at <= (rec.ended_at or 0)


def test_streamed_equals_non_streamed(h: Harness) -> None:
    client = h.openai("r1")
    whole = client.chat.completions.create(model="gpt-4o", messages=MSGS)
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=MSGS, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content == REPLY
    # No usage chunk, no usage keys, no token ids, no logprobs: the agent did not ask for them.
    assert all(c.choices for c in chunks)
    assert all(c.usage is None and "usage" not in (c.model_extra or {}) for c in chunks)
    assert all("token_ids" not in (c.choices[0].model_extra or {}) and c.choices[0].logprobs is None for c in chunks)
    assert h.fake.requests[-1].body["stream_options"] == {"include_usage": True}

    plain, streamed = h.calls("r1")
    assert streamed.stream and not plain.stream
    assert streamed.response is not None and plain.response is not None
    assert streamed.response["choices"][0]["message"]["content"] == plain.response["choices"][0]["message"]["content"]
    for field in ("input_tokens", "output_tokens", "prompt_token_ids", "completion_token_ids", "logprobs", "model_version"):
        assert getattr(streamed, field) == getattr(plain, field), field
    assert streamed.ttft_s is not None and streamed.latency_s is not None and 0 < streamed.ttft_s <= streamed.latency_s
    assert (streamed.status_code, streamed.error) == (200, None)


def test_stream_usage_chunk_kept_when_asked(h: Harness) -> None:
    client = h.openai("r1")
    chunks = list(
        client.chat.completions.create(model="gpt-4o", messages=MSGS, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


def test_what_the_agent_asked_for_is_kept(h: Harness) -> None:
    client = h.openai("r1")
    result = client.chat.completions.create(model="gpt-4o", messages=MSGS, logprobs=True, extra_body={"return_token_ids": True})
    assert result.choices[0].logprobs is not None and len(result.choices[0].logprobs.content or []) == 4
    assert (result.model_extra or {})["prompt_token_ids"] == PROMPT_IDS
    chunks = list(
        client.chat.completions.create(
            model="gpt-4o", messages=MSGS, logprobs=True, stream=True, extra_body={"return_token_ids": True}
        )
    )
    ids = [i for c in chunks if c.choices for i in (c.choices[0].model_extra or {}).get("token_ids") or []]
    assert ids == REPLY_IDS
    assert [r.completion_token_ids for r in h.calls("r1")] == [REPLY_IDS, REPLY_IDS]


def test_async_client_concurrent_calls(h: Harness) -> None:
    async def main() -> list[str]:
        client = h.async_openai("r-async")

        async def one(i: int, stream: bool) -> str:
            msgs = [{"role": "user", "content": f"number {i}"}]
            if not stream:
                r = await client.chat.completions.create(model="x", messages=msgs)
                return r.choices[0].message.content or ""
            s = await client.chat.completions.create(model="x", messages=msgs, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in s if c.choices])

        try:
            return await asyncio.gather(*(one(i, i % 2 == 1) for i in range(10)))
        finally:
            await client.close()

    texts = asyncio.run(main())
    assert texts == [f"You said: number {i}" for i in range(10)]
    assert len(h.calls("r-async")) == 10


def test_tokens_are_per_rollout(h: Harness) -> None:
    token_a = h.rollout("A")
    h.rollout("B")
    wrong = openai.OpenAI(base_url=h.openai_url("B"), api_key=token_a, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        wrong.chat.completions.create(model="x", messages=MSGS)
    assert "not valid for rollout 'B'" in str(err.value)
    # Another rollout's token says nothing about whether an id is registered.
    unknown = openai.OpenAI(base_url=h.openai_url("nope"), api_key=token_a, max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="not valid for rollout 'nope'"):
        unknown.chat.completions.create(model="x", messages=MSGS)
    r = httpx.post(h.openai_url("A") + "/chat/completions", json={"model": "x", "messages": MSGS})
    assert r.status_code == 401 and "no API key" in r.json()["error"]["message"]
    # x-api-key works too, and the token stops working once the rollout is unregistered.
    r = httpx.post(
        h.openai_url("A") + "/chat/completions", json={"model": "x", "messages": MSGS}, headers={"x-api-key": token_a}
    )
    assert r.status_code == 200
    h.gateway.unregister_rollout("A")
    r = httpx.post(
        h.openai_url("A") + "/chat/completions", json={"model": "x", "messages": MSGS}, headers={"x-api-key": token_a}
    )
    assert r.status_code == 401 and "valid while the rollout runs" in r.json()["error"]["message"]
    assert len(h.fake.requests) == 1 and len(h.calls()) == 1


def test_secrets_never_reach_the_store(h: Harness) -> None:
    token = h.rollout("r1")
    client = openai.OpenAI(base_url=h.openai_url("r1"), api_key=token, max_retries=0)
    client.chat.completions.create(model="x", messages=MSGS)
    # Even a key the agent echoes into its own request body is redacted.
    client.chat.completions.create(model="x", messages=[{"role": "user", "content": f"my key is {token}"}])
    list(client.chat.completions.create(model="x", messages=MSGS, stream=True))
    h.gateway.flush()
    h.store.close()
    raw = b"".join(p.read_bytes() for p in h.store_path.parent.iterdir() if p.is_file())
    assert b"You said" in raw
    assert UPSTREAM_KEY.encode() not in raw and token.encode() not in raw
    assert h.fake.requests[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_model_routing(fake: FakeUpstream) -> None:
    fake.reset()
    other = FakeUpstream()
    upstreams = {
        "local": fake.upstream("local", api_key=UPSTREAM_KEY),
        "other": other.upstream("other", default_model="dflt"),
    }
    with Harness(fake, upstreams=upstreams, default_model="local/tiny") as h:
        client = h.openai("r1")
        client.chat.completions.create(model="other/m-1", messages=MSGS)  # upstream/model
        client.chat.completions.create(model="gpt-4o", messages=MSGS)  # unknown name -> default
        client.chat.completions.create(model="local/a/b", messages=MSGS)  # model names may hold slashes
        knobbed = h.openai("r2", {"model": "other/k"})
        knobbed.chat.completions.create(model="local/tiny", messages=MSGS)  # the knob wins
        got = [(r.upstream, r.request_model, r.model) for r in h.calls()]
        assert got == [
            ("other", "other/m-1", "m-1"),
            ("local", "gpt-4o", "tiny"),
            ("local", "local/a/b", "a/b"),
            ("other", "local/tiny", "k"),
        ]
        assert h.calls("r2")[0].knobs_applied == {"model": "other/k"}
        assert [r.body["model"] for r in other.requests] == ["m-1", "k"]
        with pytest.raises(ValueError, match="names no upstream"):
            h.rollout("r3", {"model": "nowhere/x"})
    with (
        Harness(fake, upstreams=upstreams, default_model=None) as h,
        pytest.raises(openai.BadRequestError, match="names no upstream"),
    ):
        h.openai("r1").chat.completions.create(model="gpt-4o", messages=MSGS)
    with Harness(fake, upstreams=upstreams, default_model="other") as h:
        h.openai("r1").chat.completions.create(model="gpt-4o", messages=MSGS)  # bare upstream: its default model
        assert h.calls()[0].model == "dflt"


def test_knobs_rewrite_the_request(h: Harness) -> None:
    knobs = {
        "system_prompt": {"text": "You are terse.", "mode": "replace"},
        "max_tokens": 2,
        "top_p": 0.9,
        "reasoning_effort": "low",
    }
    client = h.openai("r1", knobs)
    result = client.chat.completions.create(model="x", messages=MSGS, max_tokens=50)
    assert result.choices[0].finish_reason == "length" and result.choices[0].message.content == "You said: "
    body = h.fake.requests[-1].body
    assert body["messages"] == [{"role": "system", "content": "You are terse."}, MSGS[1]]
    assert (body["max_tokens"], body["top_p"], body["reasoning_effort"]) == (2, 0.9, "low")
    rec = h.calls("r1")[0]
    assert rec.knobs_applied == knobs
    assert rec.request["messages"][0]["content"] == "You are terse."

    client = h.openai("r2", {"system_prompt": {"text": "Rules first.", "mode": "prepend"}})
    client.chat.completions.create(model="x", messages=MSGS, max_completion_tokens=10)
    assert h.fake.requests[-1].body["messages"][0] == {"role": "system", "content": "Rules first.\n\nBe brief."}
    client.chat.completions.create(model="x", messages=MSGS[1:])
    assert h.fake.requests[-1].body["messages"][0] == {"role": "system", "content": "Rules first."}
    with pytest.raises(ValueError, match="unknown gateway knob"):
        h.rollout("r3", {"temprature": 0.1})
    with pytest.raises(ValueError, match="finite number"):
        h.rollout("r3", {"temperature": "hot"})


def test_cost_from_the_price_table(fake: FakeUpstream) -> None:
    fake.reset()
    fake.cached_tokens = 2
    try:
        upstreams = {"openai": fake.upstream("openai", api_key=UPSTREAM_KEY, free=False)}
        with Harness(
            fake, upstreams=upstreams, default_model="openai/gpt-4o-mini", prices={"my-model": {"input": 1.0, "output": 2.0}}
        ) as h:
            client = h.openai("r1")
            client.chat.completions.create(model="gpt-4o-mini-2024-07-18", messages=MSGS)
            client.chat.completions.create(model="openai/my-model", messages=MSGS)
            client.chat.completions.create(model="openai/unpriced", messages=MSGS)
            mini, mine, unknown = h.calls()
            n_in, cached, out = len(PROMPT_IDS), 2, 4
            assert mini.cost_usd == pytest.approx(((n_in - cached) * 0.15 + cached * 0.075 + out * 0.6) / 1e6)
            assert mine.cost_usd == pytest.approx((n_in * 1.0 + out * 2.0) / 1e6)
            assert unknown.cost_usd is None  # a hosted model without a price: unknown, not 0
            assert mini.cached_tokens == 2
            assert mini.prompt_token_ids is None  # not a token-id upstream: nothing asked, nothing recorded
            assert "return_token_ids" not in fake.requests[-1].body
    finally:
        fake.cached_tokens = 0


def test_record_token_ids_off(fake: FakeUpstream) -> None:
    fake.reset()
    with Harness(fake, record_token_ids=False) as h:
        h.openai("r1").chat.completions.create(model="x", messages=MSGS)
        assert "return_token_ids" not in fake.requests[-1].body and "logprobs" not in fake.requests[-1].body
        rec = h.calls()[0]
        assert rec.prompt_token_ids is None and rec.completion_token_ids is None and rec.logprobs is None


def test_reward_endpoint(h: Harness) -> None:
    token = h.rollout("r1")
    url = f"{h.base_url}/rollouts/r1/reward"
    r = httpx.post(url, json={"reward": 0.75, "detail": {"tests": 3}}, headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    assert h.store.reported_reward("r1") == (0.75, {"tests": 3})
    for bad in ({"reward": "high"}, {"reward": True}, {}, {"reward": 1, "detail": [1]}):
        r = httpx.post(url, json=bad, headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 400 and r.json()["error"]["message"], bad
    assert httpx.post(url, json={"reward": 1}, headers={"authorization": "Bearer nope"}).status_code == 401


def test_replicas_stick_per_rollout() -> None:
    fake, second = FakeUpstream(api_key=UPSTREAM_KEY).start(), FakeUpstream().start()  # two replicas: two addresses
    try:
        upstreams = {
            "vllm": ResolvedUpstream(
                name="vllm", api="openai", base_urls=[fake.base_url, second.base_url], api_key=UPSTREAM_KEY
            )
        }
        with Harness(fake, upstreams=upstreams, default_model="vllm/m") as h:
            placements = {}
            for i in range(12):
                client = h.openai(f"roll-{i}")
                before = (len(fake.requests), len(second.requests))
                for _ in range(3):
                    client.chat.completions.create(model="m", messages=MSGS)
                delta = (len(fake.requests) - before[0], len(second.requests) - before[1])
                assert delta in ((3, 0), (0, 3))  # all three calls of a rollout went to one replica
                placements[i] = delta[0] == 3
            assert 0 < sum(placements.values()) < 12  # and rollouts spread over both
    finally:
        fake.stop()
        second.stop()


def test_models_endpoint(h: Harness) -> None:
    models = h.openai("r1").models.list()
    assert [m.id for m in models.data] == ["local/tiny"]


def test_streams_pass_through_as_they_arrive(h: Harness) -> None:
    h.fake.fail("slow_stream", delay_s=0.15)  # 7 events, 0.15 s apart
    client = h.openai("r1")
    t0 = time.monotonic()
    arrivals = [time.monotonic() - t0 for c in client.chat.completions.create(model="x", messages=MSGS, stream=True)]
    assert len(arrivals) == 6 and arrivals[-1] >= 0.7
    assert arrivals[1] < 0.5  # the first words arrive long before the stream ends: nothing is buffered whole
    rec = h.calls("r1")[0]
    assert rec.ttft_s is not None and rec.ttft_s < 0.5 and rec.latency_s is not None and rec.latency_s >= 0.7
