"""The in-process transport behaves as the network does for what the proxy relies on: the head before the body, a
stream as it is sent, the read timeout, an answer cut short, a crashed app, and a caller who leaves."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send

from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.h1client import HTTPError, ReadTimeout
from rl_backend.gateway.transport import IN_PROCESS_URL, InProcessTransport

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}


def _post(transport: InProcessTransport, body: dict[str, Any], *, path: str = "/v1/chat/completions",
          timeout: float = 5.0) -> Any:
    return transport.post(IN_PROCESS_URL + path, {"content-type": "application/json"}, json.dumps(body).encode(),
                          timeout=timeout, connect_timeout=timeout)



async def _until_cancelled(fake: FakeUpstream) -> None:
    """The fake noticed its caller leave (it counts that in `cancelled`), within a second."""
    for _ in range(100):
        if fake.cancelled:
            break
        await asyncio.sleep(0.01)
    assert fake.cancelled == 1

def test_a_whole_answer_and_a_stream_as_it_is_sent() -> None:
    fake = FakeUpstream(api_key="k")

    async def run() -> None:
        transport = InProcessTransport(fake.app)
        response = await transport.post(IN_PROCESS_URL + "/v1/chat/completions",
                                        {"authorization": "Bearer k", "content-type": "application/json"},
                                        json.dumps(CHAT).encode(), timeout=5, connect_timeout=5)
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        assert json.loads(await response.aread())["choices"][0]["message"]["content"] == "You said: hello there"
        response.close()
        assert fake.requests[-1].path == "/v1/chat/completions"
        assert fake.requests[-1].headers["authorization"] == "Bearer k"  # the headers reach the app as sent

        fake.fail("slow_stream", delay_s=0.3)
        loop = asyncio.get_running_loop()
        started = loop.time()
        streamed = await transport.post(IN_PROCESS_URL + "/v1/chat/completions", {"authorization": "Bearer k"},
                                        json.dumps({**CHAT, "stream": True}).encode(), timeout=5, connect_timeout=5)
        chunks = streamed.aiter_bytes()
        first = await anext(chunks)
        assert first.startswith(b"data: ") and loop.time() - started < 0.25  # before the next event was sent
        rest = b"".join([chunk async for chunk in chunks])
        assert rest.endswith(b"data: [DONE]\n\n") and loop.time() - started > 0.5
        await transport.aclose()

    asyncio.run(run())


def test_no_answer_in_time_is_a_read_timeout_and_the_app_sees_its_caller_leave() -> None:
    fake = FakeUpstream()
    fake.fail("hang")

    async def run() -> None:
        transport = InProcessTransport(fake.app)
        with pytest.raises(ReadTimeout, match="no answer from the upstream for 0.2 s"):
            await _post(transport, CHAT, timeout=0.2)
        await _until_cancelled(fake)
        await transport.aclose()

    asyncio.run(run())


def test_closing_a_stream_early_tells_the_app() -> None:
    fake = FakeUpstream()
    fake.fail("slow_stream", delay_s=0.2)

    async def run() -> None:
        transport = InProcessTransport(fake.app)
        response = await _post(transport, {**CHAT, "stream": True})
        await anext(response.aiter_bytes())
        response.close()  # the proxy's agent hung up
        await _until_cancelled(fake)
        await transport.aclose()

    asyncio.run(run())


async def _cut_short(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})


async def _crash(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("boom")


async def _silent(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()


def test_a_cut_answer_and_a_crashed_app_read_as_a_server_would_answer() -> None:
    async def run() -> None:
        cut = await _post(InProcessTransport(_cut_short), CHAT)
        assert cut.status_code == 200
        with pytest.raises(HTTPError, match="mid-answer"):
            await cut.aread()
        for app in (_crash, _silent):  # an exception, or no answer at all: 500, as uvicorn answers
            response = await _post(InProcessTransport(app), CHAT)
            assert (response.status_code, await response.aread()) == (500, b"Internal Server Error")

    asyncio.run(run())
