"""A scripted OpenAI- and Anthropic-compatible upstream for tests and benchmarks: served to the gateway in-process
(`upstream()`), or, once `start()`ed, as a real HTTP server on loopback for tests of the HTTP path itself and for
other processes.

Replies are deterministic (see replies.py). Faults are queued with `fail()` and consumed one per request, in order:
`status` (an error status, optionally with Retry-After), `slow` (a delay before the first byte), `malformed`
(invalid JSON, or an invalid stream event), `reset` (the connection dropped after `after_events` stream events),
`hang` (never answers; counts the caller hanging up in `cancelled`), `slow_stream` (a delay between events), and
those of a hostile upstream (hostile.py): `usage` (every usage object updated with `usage=`), `endless` (a chat
stream that never ends, a token every `delay_s`), `huge` (a chat answer of `size` bytes, whole or streamed),
`huge_event` (one stream event of `size` bytes that never ends).
`refused_params` (model name -> parameter names) answers a request that sends one of them to that model with
OpenAI's 400 for an unsupported parameter, as a model without reasoning does for `reasoning_effort`.
Every request is kept in `requests` (path, headers, body) so tests can check what reached the upstream.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rl_backend.gateway.config import ResolvedUpstream
from rl_backend.gateway.fake import anthropic_shapes, hostile, openai_shapes
from rl_backend.gateway.fake.replies import Reply, chat_reply, make_reply
from rl_backend.gateway.transport import IN_PROCESS_URL, InProcessTransport
from rl_backend.httpserver import ServerThread


@dataclass
class Fault:
    kind: str
    status: int = 500
    retry_after: str | None = None
    after_events: int = 2
    delay_s: float = 0.0
    usage: dict[str, Any] | None = None
    size: int = 0


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class _Call:
    n: int
    fault: Fault | None
    body: dict[str, Any] = field(default_factory=dict)


class _Hang(Response):
    """Never answers; notices the caller hanging up (the gateway cancelling its request)."""

    def __init__(self, fake: FakeUpstream) -> None:
        self.fake = fake
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.fake.note_cancelled()


class _Stream(Response):
    """Server-sent events, with the stream faults; notices the caller hanging up mid-stream."""

    def __init__(self, fake: FakeUpstream, events: list[bytes], delay_s: float, reset_at: int | None) -> None:
        self.fake, self.events, self.delay_s, self.reset_at = fake, events, delay_s, reset_at
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        done = False
        gone = False

        async def watch(cancel: anyio.CancelScope) -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            if not done:
                gone = True
                cancel.cancel()

        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            try:
                for i, event in enumerate(self.events):
                    if i == self.reset_at:
                        return  # leaving a started response unfinished makes the server drop the connection
                    if self.delay_s and i:
                        await anyio.sleep(self.delay_s)
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                done = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                tg.cancel_scope.cancel()
        if gone:
            self.fake.note_cancelled()


class FakeUpstream:
    def __init__(self, *, api_key: str | None = None, model_version: str | None = None, cached_tokens: int = 0) -> None:
        self.api_key = api_key
        self.model_version = model_version
        self.cached_tokens = cached_tokens
        self.chunk_delay_s = 0.0
        self.requests: list[Seen] = []
        self.refused_params: dict[str, set[str]] = {}
        self.cancelled = 0
        self._faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self._n = 0
        self.server: ServerThread | None = None

    # -- scripting ------------------------------------------------------------------------------------------------

    def fail(self, kind: str, times: int = 1, **options: Any) -> None:
        with self._lock:
            self._faults.extend(Fault(kind, **options) for _ in range(times))

    def reset(self) -> None:
        with self._lock:
            self._faults.clear()
            self.requests.clear()
            self.refused_params = {}
            self.cancelled = 0
            self.chunk_delay_s = 0.0

    def note_cancelled(self) -> None:
        with self._lock:
            self.cancelled += 1

    def _take(self, request: Request, body: Any) -> _Call:
        with self._lock:
            self._n += 1
            self.requests.append(Seen(request.url.path, dict(request.headers), body))
            return _Call(self._n, self._faults.popleft() if self._faults else None)

    # -- serving --------------------------------------------------------------------------------------------------

    @property
    def app(self) -> Starlette:
        paths = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
                 "messages": "/v1/messages"}
        return Starlette(
            routes=[Route(path, functools.partial(self._answer, api=api), methods=["POST"]) for api, path in paths.items()]
        )

    def start(self) -> FakeUpstream:
        self.server = ServerThread(self.app).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    @property
    def url(self) -> str:
        """Root URL (Anthropic style: the client appends /v1/messages)."""
        assert self.server is not None, "start() the fake first"
        return self.server.base_url

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL, ending in /v1."""
        return self.url + "/v1"

    def upstream(self, name: str = "local", *, api: Literal["openai", "anthropic"] = "openai",
                 **fields: Any) -> ResolvedUpstream:
        """This fake as the gateway's upstream `name`: at its URL once started, else served in-process."""
        started = self.server is not None
        root = self.url if started else IN_PROCESS_URL
        return ResolvedUpstream(name=name, api=api, base_urls=[root + "/v1" if api == "openai" else root],
                                transport=None if started else InProcessTransport(self.app), **fields)

    async def _begin(self, request: Request, anthropic: bool) -> tuple[_Call, Response | None]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        call = self._take(request, body)
        if self.api_key is not None:
            got = request.headers.get("x-api-key") if anthropic else request.headers.get("authorization")
            want = self.api_key if anthropic else f"Bearer {self.api_key}"
            if got != want:
                return call, JSONResponse({"error": {"message": "bad key", "type": "authentication_error"}}, 401)
        if not isinstance(body, dict):
            return call, JSONResponse({"error": {"message": "body is not a JSON object", "type": "invalid"}}, 400)
        call.body = body
        refused = sorted(self.refused_params.get(str(body.get("model")), set()) & set(body))
        if refused:
            message = f"Unsupported parameter: '{refused[0]}' is not supported with this model."
            err = {"message": message, "type": "invalid_request_error", "param": refused[0],
                   "code": "unsupported_parameter"}
            return call, JSONResponse({"type": "error", "error": err} if anthropic else {"error": err}, 400)
        fault = call.fault
        if fault is None:
            return call, None
        if fault.kind == "slow":
            await asyncio.sleep(fault.delay_s)
        elif fault.kind == "status":
            headers = {"retry-after": fault.retry_after} if fault.retry_after is not None else None
            err = {"message": f"fake upstream failure {fault.status}", "type": "server_error"}
            payload = {"type": "error", "error": err} if anthropic else {"error": err}
            return call, JSONResponse(payload, fault.status, headers=headers)
        elif fault.kind == "hang":
            return call, _Hang(self)
        elif fault.kind == "endless":
            return call, hostile.Endless(body.get("model"), fault.delay_s or 0.05, self.note_cancelled)
        elif fault.kind == "huge":
            return call, hostile.Huge(body.get("model"), fault.size, stream=body.get("stream") is True)
        elif fault.kind == "huge_event":
            return call, hostile.HugeEvent(fault.size)
        elif fault.kind == "malformed" and not body.get("stream"):
            return call, Response(b'{"id": "broken", "choices": [', media_type="application/json")
        return call, None

    def _sse(self, call: _Call, events: Sequence[tuple[str | None, Any]]) -> Response:
        fault = call.fault
        kind = fault.kind if fault is not None else None
        delay = fault.delay_s if fault is not None and kind == "slow_stream" else self.chunk_delay_s
        encoded = []
        for i, (name, data) in enumerate(events):
            text = data if isinstance(data, str) else json.dumps(data)
            if kind == "malformed" and i == 1:
                text = "{not json"
            encoded.append(((f"event: {name}\n" if name else "") + f"data: {text}\n\n").encode())
        reset_at = fault.after_events if fault is not None and kind == "reset" else None
        return _Stream(self, encoded, delay, reset_at)

    async def _answer(self, request: Request, api: str) -> Response:
        call, early = await self._begin(request, anthropic=api == "messages")
        if early is not None:
            return early
        reply_of, events_of, whole_of = _SHAPES[api]
        body = call.body
        reply = reply_of(body)
        shape = {"n": call.n, "cached": self.cached_tokens, "version": self.model_version}
        override = call.fault.usage if call.fault is not None and call.fault.kind == "usage" else None
        if body.get("stream"):
            events = events_of(body, reply, **shape)
            if override:
                events = [(name, hostile.with_usage(data, override)) for name, data in events]
            return self._sse(call, events)
        whole = whole_of(body, reply, **shape)
        return JSONResponse(hostile.with_usage(whole, override) if override else whole)


Events = list[tuple[str | None, Any]]


def _openai_events(chunks: Callable[..., list[dict[str, Any]]]) -> Callable[..., Events]:
    def events(body: dict[str, Any], reply: Reply, **shape: Any) -> Events:
        return [*((None, c) for c in chunks(body, reply, **shape)), (None, "[DONE]")]

    return events


def _unversioned(shape: Callable[..., Any]) -> Callable[..., Any]:
    """The Responses and Messages shapes carry no model version."""

    def call(body: dict[str, Any], reply: Reply, *, version: str | None, **shape_args: Any) -> Any:
        return shape(body, reply, **shape_args)

    return call


def _completion_reply(body: dict[str, Any]) -> Reply:
    return make_reply(*openai_shapes.completion_reply_inputs(body), tools=None, max_tokens=body.get("max_tokens"))


def _responses_reply(body: dict[str, Any]) -> Reply:
    return make_reply(*openai_shapes.responses_inputs(body), tools=None, max_tokens=body.get("max_output_tokens"))


# Per API: its reply, its stream's events, its whole answer.
_SHAPES: dict[str, tuple[Callable[[dict[str, Any]], Reply], Callable[..., Events], Callable[..., Any]]] = {
    "chat": (chat_reply, _openai_events(openai_shapes.chat_chunks), openai_shapes.chat_completion),
    "completions": (_completion_reply, _openai_events(openai_shapes.completion_chunks), openai_shapes.completion),
    "responses": (_responses_reply, _unversioned(openai_shapes.response_events), _unversioned(openai_shapes.response_object)),
    "messages": (chat_reply, _unversioned(anthropic_shapes.message_events), _unversioned(anthropic_shapes.message)),
}
