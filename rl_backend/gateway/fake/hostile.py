"""Answers of a misbehaving upstream, for the fake's faults that test the gateway under pressure: usage that cannot
be true (`with_usage`), a chat stream that never ends (`Endless`), a chat answer of any size, sent in pieces so the
fake itself never holds it (`Huge`), and a stream whose one event never ends (`HugeEvent`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

_PIECE = 1 << 16


def with_usage(value: Any, override: dict[str, Any]) -> Any:
    """`value` (an answer or a stream event) with every `usage` object in it updated by `override`."""
    if isinstance(value, dict):
        out = {k: with_usage(v, override) for k, v in value.items()}
        if isinstance(out.get("usage"), dict):
            out["usage"] = {**out["usage"], **override}
        return out
    if isinstance(value, list):
        return [with_usage(v, override) for v in value]
    return value


async def _until_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Endless(Response):
    """A chat stream that sends a token every `delay_s` and never ends, until the caller hangs up (`on_gone`)."""

    def __init__(self, model: Any, delay_s: float, on_gone: Callable[[], None]) -> None:
        self.model, self.delay_s, self.on_gone = model, delay_s, on_gone
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        head = {"id": "chatcmpl-endless", "object": "chat.completion.chunk", "created": 0, "model": self.model}
        async with anyio.create_task_group() as tg:

            async def tokens() -> None:
                while True:
                    chunk = {**head, "choices": [{"index": 0, "delta": {"content": "."}, "finish_reason": None}]}
                    await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                                "more_body": True})
                    await anyio.sleep(self.delay_s)

            tg.start_soon(tokens)
            await _until_gone(receive)
            tg.cancel_scope.cancel()
        self.on_gone()


class Huge(Response):
    """A chat answer whose text is `size` bytes, whole or streamed (64 KiB per event), sent piece by piece."""

    def __init__(self, model: Any, size: int, stream: bool) -> None:
        self.model, self.size, self.stream = model, size, stream
        self.background = None

    def _whole(self) -> tuple[bytes, bytes]:
        head = {"id": "chatcmpl-huge", "object": "chat.completion", "created": 0, "model": self.model}
        usage = {"prompt_tokens": 3, "completion_tokens": self.size // 4, "total_tokens": 3 + self.size // 4}
        prefix = json.dumps(head)[:-1] + ', "choices": [{"index": 0, "message": {"role": "assistant", "content": "'
        suffix = '"}, "finish_reason": "stop"}], "usage": ' + json.dumps(usage) + "}"
        return prefix.encode(), suffix.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctype = b"text/event-stream" if self.stream else b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype)]})
        if self.stream:
            head = {"id": "chatcmpl-huge", "object": "chat.completion.chunk", "created": 0, "model": self.model}
            piece = {**head, "choices": [{"index": 0, "delta": {"content": "a" * _PIECE}, "finish_reason": None}]}
            event = f"data: {json.dumps(piece)}\n\n".encode()
            usage = {"prompt_tokens": 3, "completion_tokens": self.size // 4, "total_tokens": 3 + self.size // 4}
            done = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            tail = [f"data: {json.dumps(done)}\n\n", f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n",
                    "data: [DONE]\n\n"]
            for _ in range(self.size // _PIECE):
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": "".join(tail).encode(), "more_body": False})
            return
        prefix, suffix = self._whole()
        await send({"type": "http.response.body", "body": prefix, "more_body": True})
        filler = b"a" * _PIECE
        for _ in range(self.size // _PIECE):
            await send({"type": "http.response.body", "body": filler, "more_body": True})
        await send({"type": "http.response.body", "body": suffix, "more_body": False})


class HugeEvent(Response):
    """A stream whose first event is `size` bytes of data with no end, then the connection held until the caller
    hangs up."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: ", "more_body": True})
        filler = b"a" * _PIECE
        for _ in range(self.size // _PIECE):
            await send({"type": "http.response.body", "body": filler, "more_body": True})
        await _until_gone(receive)
