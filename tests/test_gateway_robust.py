"""Gateway robustness: retries, timeouts, broken and abandoned streams, bad input, and a load test."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from rl_backend.gateway.config import ResolvedUpstream
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness
from rl_backend.gateway.upstream import RetryPolicy

MSGS = [{"role": "user", "content": "hello there"}]



@pytest.fixture(scope="module")
def fake(fake_server: FakeUpstream) -> FakeUpstream:
    """Here the upstream's HTTP is under test (retries, resets, hang-ups, timeouts, failover): a loopback server."""
    return fake_server

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(predicate: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_retries_5xx_and_429_before_the_first_byte(h: Harness) -> None:
    client = h.openai("r1")
    h.fake.fail("status", times=2, status=503)
    assert client.chat.completions.create(model="x", messages=MSGS).choices[0].message.content == "You said: hello there"
    h.fake.fail("status", status=429, retry_after="0")
    h.fake.fail("status", status=408)
    chunks = list(client.chat.completions.create(model="x", messages=MSGS, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "You said: hello there"
    assert len(h.fake.requests) == 6
    assert [(r.status_code, r.error) for r in h.calls()] == [(200, None), (200, None)]


def test_errors_after_the_last_retry_reach_the_agent_and_are_recorded(h: Harness) -> None:
    client = h.openai("r1")
    h.fake.fail("status", times=3, status=500)
    with pytest.raises(openai.InternalServerError, match="fake upstream failure 500"):
        client.chat.completions.create(model="x", messages=MSGS)
    # A Retry-After longer than the gateway waits out goes back to the agent, header included.
    h.fake.fail("status", status=429, retry_after="120")
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model="x", messages=MSGS)
    assert err.value.response.headers["retry-after"] == "120"
    h.fake.fail("status", status=400)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="x", messages=MSGS, stream=True)
    assert len(h.fake.requests) == 5
    recs = h.calls()
    assert [r.status_code for r in recs] == [500, 429, 400]
    assert [(r.error or "").split(":")[0] for r in recs] == ["upstream_http_500", "upstream_http_429", "upstream_http_400"]
    assert recs[0].response == {"error": {"message": "fake upstream failure 500", "type": "server_error"}}
    assert all(r.cost_usd == 0.0 and r.input_tokens is None for r in recs)


def test_unreachable_upstream_and_replica_failover(fake: FakeUpstream) -> None:
    fake.reset()
    dead = f"http://127.0.0.1:{_free_port()}/v1"
    upstreams = {
        "down": ResolvedUpstream(name="down", api="openai", base_urls=[dead]),
        "half": ResolvedUpstream(name="half", api="openai", base_urls=[dead, fake.base_url], api_key=UPSTREAM_KEY),
    }
    with Harness(fake, upstreams=upstreams, default_model="down/m") as h:
        with pytest.raises(openai.APIStatusError) as err:
            h.openai("r1").chat.completions.create(model="x", messages=MSGS)
        assert err.value.status_code == 502 and "could not be reached" in err.value.message
        for i in range(6):  # whichever replica a rollout sticks to, a dead one is skipped
            h.openai(f"h{i}").chat.completions.create(model="half/m", messages=MSGS)
        recs = h.calls()
        assert recs[0].status_code == 502 and (recs[0].error or "").startswith("upstream_unavailable")
        assert [r.status_code for r in recs[1:]] == [200] * 6


def test_upstream_timeout(fake: FakeUpstream) -> None:
    fake.reset()
    upstreams = {
        "slow": ResolvedUpstream(name="slow", api="openai", base_urls=[fake.base_url], api_key=UPSTREAM_KEY, timeout_s=0.3)
    }
    with Harness(fake, upstreams=upstreams, default_model="slow/m") as h:
        fake.fail("slow", delay_s=1.0)
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as err:
            h.openai("r1").chat.completions.create(model="x", messages=MSGS)
        assert err.value.status_code == 504 and time.monotonic() - t0 < 0.9
        rec = h.calls()[0]
        assert rec.status_code == 504 and (rec.error or "").startswith("upstream_unavailable")


def test_reset_mid_stream_is_an_error_for_the_agent_and_in_the_record(h: Harness) -> None:
    client = h.openai("r1")
    h.fake.fail("reset", after_events=3)
    seen = []
    with pytest.raises(openai.APIError, match="upstream failed mid-stream"):
        for chunk in client.chat.completions.create(model="x", messages=MSGS, stream=True):
            seen.append(chunk.choices[0].delta.content)
    assert seen == ["", "You ", "said: "]
    rec = h.calls()[0]
    assert (rec.error or "").startswith("upstream_stream_broken") and rec.status_code == 502
    assert rec.response is not None and rec.response["choices"][0]["message"]["content"] == "You said: "
    assert rec.completion_token_ids is not None and len(rec.completion_token_ids) == 2


def test_malformed_upstream_answers(h: Harness) -> None:
    client = h.openai("r1")
    h.fake.fail("malformed")
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="x", messages=MSGS)
    assert err.value.status_code == 502 and "malformed" in err.value.message
    h.fake.fail("malformed")
    with pytest.raises(openai.APIError, match="mid-stream"):
        list(client.chat.completions.create(model="x", messages=MSGS, stream=True))
    assert [(r.error or "").split(":")[0] for r in h.calls()] == ["upstream_malformed", "upstream_malformed"]


def test_client_disconnect_mid_stream_is_recorded_and_cancels_upstream(h: Harness) -> None:
    token = h.rollout("r1")
    h.fake.fail("slow_stream", delay_s=0.2)
    body = {"model": "x", "messages": MSGS, "stream": True}
    with (
        httpx.Client() as client,
        client.stream(
            "POST", h.openai_url("r1") + "/chat/completions", json=body, headers={"authorization": f"Bearer {token}"}
        ) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert '"role":"assistant"' in first
    # The agent hung up: the record says so, and the upstream stream was cancelled.
    _wait_for(lambda: h.gateway.flush() and len(h.store.calls()) == 1 and h.fake.cancelled == 1)
    rec = h.calls()[0]
    assert rec.status_code == 499 and (rec.error or "").startswith("client_disconnected")
    assert h.gateway.in_flight == 0


def test_client_disconnect_before_the_answer(h: Harness) -> None:
    token = h.rollout("r1")
    h.fake.fail("hang")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            h.openai_url("r1") + "/chat/completions",
            json={"model": "x", "messages": MSGS},
            headers={"authorization": f"Bearer {token}"},
            timeout=0.3,
        )
    _wait_for(lambda: h.gateway.flush() and len(h.store.calls()) == 1 and h.fake.cancelled == 1)
    rec = h.calls()[0]
    assert rec.status_code == 499 and "before any answer" in (rec.error or "")


@pytest.mark.parametrize(
    ("content", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b"", 400, "no body"),
        (b'{"model": "x"}', 400, "`messages` must be a non-empty array"),
        (b'{"model": "x", "messages": "hi"}', 400, "`messages` must be"),
        (b'{"model": "x", "messages": [{"content": "hi"}]}', 400, "string `role`"),
        (b'{"model": 3, "messages": [{"role": "user", "content": "hi"}]}', 400, "`model` must be a string"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', 400, "`temperature` must be a number"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', 400, "`stream` must be a bool"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1.5}', 400, "`max_tokens` must be an int"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stream_options": []}', 400, "`stream_options` must be"),
        (b"\xff\xfe", 400, "not valid JSON"),
    ],
)
def test_bad_input_gets_a_helpful_4xx(h: Harness, content: bytes, status: int, needle: str) -> None:
    token = h.rollout("r1")
    r = httpx.post(
        h.openai_url("r1") + "/chat/completions",
        content=content,
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"
    assert h.fake.requests == [] and h.calls() == []


def test_oversized_body_and_unknown_paths(fake: FakeUpstream) -> None:
    fake.reset()
    with Harness(fake, max_body_bytes=1000) as h:
        token = h.rollout("r1")
        auth = {"authorization": f"Bearer {token}"}
        big = {"model": "x", "messages": [{"role": "user", "content": "x" * 2000}]}
        r = httpx.post(h.openai_url("r1") + "/chat/completions", json=big, headers=auth)
        assert r.status_code == 413 and "limit of 1000 bytes" in r.json()["error"]["message"]

        def chunks() -> Iterator[bytes]:  # no content-length: the limit holds while reading
            yield b'{"model": "x", "messages": [{"role": "user", "content": "'
            yield b"y" * 2000
            yield b'"}]}'

        r = httpx.post(h.openai_url("r1") + "/chat/completions", content=chunks(), headers=auth)
        assert r.status_code == 413
        r = httpx.post(h.openai_url("r1") + "/embeddings", json={}, headers=auth)
        assert r.status_code == 404 and "chat/completions" in r.json()["error"]["message"]
        r = httpx.get(h.openai_url("r1") + "/chat/completions", headers=auth)
        assert r.status_code == 405 and r.json()["error"]["message"]
        assert fake.requests == []


def test_load_500_calls_concurrency_32(h: Harness) -> None:
    async def main() -> list[str]:
        clients = [h.async_openai(f"load-{i}") for i in range(8)]
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> str:
            client = clients[i % len(clients)]
            msgs = [{"role": "user", "content": f"call {i}"}]
            async with sem:
                if i % 2:
                    stream = await client.chat.completions.create(model="x", messages=msgs, stream=True)
                    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                r = await client.chat.completions.create(model="x", messages=msgs)
                return r.choices[0].message.content or ""

        try:
            return await asyncio.gather(*(one(i) for i in range(500)))
        finally:
            for c in clients:
                await c.close()

    texts = asyncio.run(main())
    assert texts == [f"You said: call {i}" for i in range(500)]
    recs = h.calls()
    assert len(recs) == 500 == len({r.call_id for r in recs})
    assert all(r.status_code == 200 and r.error is None for r in recs)
    assert sum(r.stream for r in recs) == 250
    assert sorted(r.response["choices"][0]["message"]["content"] for r in recs if r.response) == sorted(texts)


def test_retry_policy_backoff_is_capped_and_jittered() -> None:
    policy = RetryPolicy(backoff_base_s=1.0, backoff_cap_s=4.0)
    delays = [policy.backoff(a) for a in (1, 2, 3, 4, 5, 6) for _ in range(20)]
    assert all(0.5 <= d <= 4.0 for d in delays)
    assert len(set(delays)) > 50
