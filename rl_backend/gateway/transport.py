"""How the gateway reaches an upstream: a `Transport` posts one request and returns once the response head is in.

The network transport is the pooled HTTP/1.1 client (h1client.H1Pool). `InProcessTransport` calls an ASGI app on
the gateway's own event loop instead, the way httpx's MockTransport stands in for the network: the embedded model,
a replay recording and the test fakes are served so, with no loopback server and no socket between them and the
gateway. It keeps what the proxy relies on: the head first and the body as the app sends it (a stream passes on as
it comes), the read timeout, an app that stops mid-answer reading as a broken connection, and closing a response
before its end telling the app that its client left (`http.disconnect`), as a closed connection would.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from starlette.types import ASGIApp, Message

from rl_backend.gateway.h1client import (
    BodyStream,
    DeadlinePassed,
    HTTPError,
    NoResponse,
    Progress,
    ReadTimeout,
    deadline_passed,
    next_wait,
)

log = logging.getLogger(__name__)

# The base URL of an upstream an InProcessTransport serves (the host names no machine; only the path is used).
IN_PROCESS_URL = "http://in-process"


class UpstreamResponse(Protocol):
    """A response whose head has arrived; read its body with `aread()` or `aiter_bytes()`, then `close()`."""

    status_code: int
    headers: dict[str, str]

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aread(self) -> bytes: ...

    def close(self) -> None: ...


class Transport(Protocol):
    async def post(self, url: str, headers: dict[str, str], body: bytes, *, timeout: float,
                   connect_timeout: float, deadline: float | None = None) -> UpstreamResponse:
        """Send a POST; return once the response head is in. `timeout` is the longest silence, `deadline`
        (time.monotonic) when the whole answer must have ended. Raises h1client's errors (HTTPError and kin)."""
        ...

    async def aclose(self) -> None: ...


class _Call(Progress):
    """One request to an in-process app: what the app has sent so far, for the reader waiting on it."""

    def __init__(self, body: bytes) -> None:
        self.body: bytes | None = body
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.complete = False  # the app sent its last body message
        self.chunks: collections.deque[bytes] = collections.deque()
        self.gone = asyncio.Event()  # the reader closed the response, or it is complete: receive() says disconnect

    async def run(self, app: ASGIApp, scope: dict[str, Any]) -> None:
        try:
            await app(scope, self.receive, self.send)
        except Exception as exc:  # as an HTTP server would: a 500 before the head, a broken answer after it
            log.error("in-process upstream failed", exc_info=exc)
            if not self.head_done:
                self._server_error()
            elif not self.complete:
                self.error = HTTPError(f"the upstream failed mid-answer ({type(exc).__name__}: {exc})")
        else:
            if not self.head_done and not self.gone.is_set():
                self._server_error()  # returned without answering
            elif not self.complete and not self.gone.is_set():
                self.error = HTTPError("the upstream closed the connection mid-answer")
        finally:
            if not self.head_done and self.error is None:
                self.error = NoResponse("the upstream closed the connection before answering")
            self.wake()

    def _server_error(self) -> None:
        self.status, self.headers, self.head_done = 500, {"content-type": "text/plain; charset=utf-8"}, True
        self.chunks.append(b"Internal Server Error")
        self.complete = True

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.gone.is_set():
            return  # nobody reads it any more
        if message["type"] == "http.response.start":
            headers: dict[str, str] = {}
            for name, value in message.get("headers") or ():
                key, text = name.decode("latin-1").lower(), value.decode("latin-1")
                headers[key] = f"{headers[key]}, {text}" if key in headers else text
            self.status, self.headers, self.head_done = int(message["status"]), headers, True
        elif message["type"] == "http.response.body":
            if message.get("body"):
                self.chunks.append(bytes(message["body"]))
            if not message.get("more_body", False):
                self.complete = True
                self.gone.set()
        self.wake()

    def take(self) -> bytes:
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        return data


class InProcessResponse(BodyStream):
    def __init__(self, call: _Call, timeout: float, deadline: float | None = None) -> None:
        self._source = call
        self._timeout = timeout
        self._deadline = deadline
        self.status_code = call.status
        self.headers = call.headers

    def close(self) -> None:
        """Before the end of the answer: the app's next receive() says its client disconnected."""
        self._source.gone.set()

    async def aclose(self) -> None:
        self.close()


class InProcessTransport:
    """Serves upstream requests from an ASGI app (one that needs no lifespan) on the caller's event loop."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._running: set[asyncio.Task[None]] = set()

    async def post(self, url: str, headers: dict[str, str], body: bytes, *, timeout: float,
                   connect_timeout: float, deadline: float | None = None) -> InProcessResponse:
        parts = urlsplit(url)
        host = parts.hostname or "in-process"
        raw_headers = [(b"host", (parts.netloc or host).encode("latin-1"))]
        raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw_headers.append((b"content-length", str(len(body)).encode()))
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": parts.scheme or "http", "path": unquote(parts.path) or "/",
            "raw_path": (parts.path or "/").encode("latin-1"), "query_string": parts.query.encode("latin-1"),
            "root_path": "", "headers": raw_headers, "client": ("127.0.0.1", 0),
            "server": (host, parts.port or (443 if parts.scheme == "https" else 80)),
        }
        call = _Call(body)
        task = asyncio.get_running_loop().create_task(call.run(self.app, scope))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        try:
            while not call.head_done:
                try:
                    await call.wait(next_wait(timeout, deadline))
                except ReadTimeout:
                    if deadline_passed(deadline):
                        raise DeadlinePassed("no answer by the call's deadline") from None
                    raise
        except BaseException:
            call.gone.set()  # timed out or cancelled: the app sees its client leave
            raise
        return InProcessResponse(call, timeout, deadline)

    async def aclose(self) -> None:
        """Stop what is still running (answers nobody reads any more)."""
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
