"""A fast fake OpenAI upstream for load tests and benchmarks: raw asyncio + httptools, chat and completions only.

Same deterministic replies and shapes as `FakeUpstream` (replies.py, openai_shapes.py), but no framework, no fault
scripting and no request log, and a streamed answer goes out in one write: it answers in tens of microseconds, so
what a benchmark measures is the gateway, not the fake. Run it on its own:

    python -m rl_backend.gateway.fake.fast [--port 0]     # prints {"url": "http://127.0.0.1:P/v1"}, serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
from typing import Any

import httptools

from rl_backend.gateway.fake import openai_shapes
from rl_backend.gateway.fake.replies import chat_reply, make_reply
from rl_backend.gateway.jsonfast import dumps, loads

_counter = itertools.count(1)


def _answer(path: str, body: dict[str, Any]) -> tuple[bytes, bool]:
    """(payload, streamed): the JSON body, or the SSE stream's bytes."""
    n = next(_counter)
    if path.endswith("/completions") and not path.endswith("/chat/completions"):
        texts, last = openai_shapes.completion_reply_inputs(body)
        reply = make_reply(texts, last, tools=None, max_tokens=body.get("max_tokens"))
        if body.get("stream"):
            chunks = openai_shapes.completion_chunks(body, reply, n=n, cached=0, version=None)
            return b"".join(b"data: " + dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n", True
        return dumps(openai_shapes.completion(body, reply, n=n, cached=0, version=None)), False
    reply = chat_reply(body)
    if body.get("stream"):
        chunks = openai_shapes.chat_chunks(body, reply, n=n, cached=0, version=None)
        return b"".join(b"data: " + dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n", True
    return dumps(openai_shapes.chat_completion(body, reply, n=n, cached=0, version=None)), False


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        path = self.url.split(b"?", 1)[0].decode()
        try:
            body = loads(b"".join(self.body))
            if not isinstance(body, dict) or not path.endswith("completions"):
                raise ValueError("POST a JSON object to /v1/chat/completions or /v1/completions")
            payload, streamed = _answer(path, body)
        except ValueError as exc:
            error = dumps({"error": {"message": str(exc), "type": "invalid_request_error"}})
            head = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            self.transport.write(head % len(error) + error)
            return
        if streamed:
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            self.transport.write(head + b"%x\r\n" % len(payload) + payload + b"\r\n0\r\n\r\n")
        else:
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            self.transport.write(head % len(payload) + payload)
        if not self.parser.should_keep_alive():
            self.transport.close()


async def serve(host: str = "127.0.0.1", port: int = 0, *, ready: Any = None) -> None:
    server = await asyncio.get_running_loop().create_server(_Conn, host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready(f"http://{host}:{bound}/v1")
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A fast fake OpenAI upstream (chat and completions).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    def ready(url: str) -> None:
        print(json.dumps({"url": url}), flush=True)

    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(serve(args.host, args.port, ready=ready))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
