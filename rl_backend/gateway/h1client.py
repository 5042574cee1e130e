"""A lean HTTP/1.1 client for upstream calls: pooled keep-alive connections on asyncio, parsed by httptools.

Why not httpx: on the gateway's hot path httpx (httpcore, h11, anyio streams) cost about half a millisecond of CPU
per call, more than all the rest of the gateway; the profile was dominated by it. This client does only what the
gateway needs — POST a body, stream the answer back as it arrives, keep connections alive, TLS, timeouts — with
llhttp (the C parser uvicorn also uses) doing the HTTP parsing, chunked decoding included.

Errors: `ConnectError` (no connection; `ConnectTimeout` included) and `NoResponse` (the connection broke before
the response head) mean the upstream never answered this request, so the caller may retry; `ReadTimeout` is no
byte for `timeout` seconds, `DeadlinePassed` an answer still unfinished at the call's `deadline` (a stream that
never ends); any other `HTTPError` is a connection that broke mid-answer or spoke bad HTTP.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ssl
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools

_FIXED_HEADERS = "user-agent: agl-gateway\r\naccept-encoding: identity\r\n"
_PAUSE_AT = 1 << 20  # stop reading from the upstream while this much is buffered and unread
_RESUME_AT = 1 << 18


class HTTPError(Exception):
    """The upstream connection broke or spoke bad HTTP."""


class ConnectError(HTTPError):
    """No connection could be opened (refused, unreachable, DNS, TLS handshake)."""


class ConnectTimeout(ConnectError):
    pass


class NoResponse(HTTPError):
    """The connection closed before the response head arrived: the upstream did not answer this request."""


class ReadTimeout(HTTPError):
    """No byte of the response within the read timeout."""


class DeadlinePassed(ReadTimeout):
    """The response had not ended by the call's deadline, however steadily it came."""


def next_wait(timeout: float, deadline: float | None) -> float:
    """How long to wait for the next byte: the read timeout, or less when the deadline comes first."""
    return timeout if deadline is None else max(min(timeout, deadline - time.monotonic()), 0.0)


def deadline_passed(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int
    host_header: str


@functools.lru_cache(maxsize=1024)
def split_url(url: str) -> tuple[Origin, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConnectError(f"unsupported upstream URL {url!r}: use http:// or https://")
    default = 443 if parts.scheme == "https" else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    origin = Origin(parts.scheme, host, port, shown if port == default else f"{shown}:{port}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return origin, path


class Progress:
    """The reader of an answer waits (`wait`) until its writer makes progress (`wake`) or fails (`error`)."""

    waiter: asyncio.Future[None] | None = None
    error: HTTPError | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until progress; the error if there is one; ReadTimeout after `timeout` seconds of silence."""
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timer = loop.call_later(timeout, _expire, waiter, timeout)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None


class _Connection(asyncio.Protocol, Progress):
    """One keep-alive connection; carries one request at a time. The parser calls the on_* methods."""

    def __init__(self, pool: H1Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.received_any = False
        self.error: HTTPError | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None
        self.until_close = False  # a body with neither length nor chunking ends when the connection does

    # -- asyncio.Protocol -----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HTTPError(f"the upstream sent malformed HTTP: {exc}"))
            self._abort()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.complete:
            return
        if self.head_done and self.until_close and exc is None:
            self.on_message_complete()
        elif not self.head_done:
            self._fail(NoResponse(f"the upstream closed the connection before answering{_cause(exc)}"))
        else:
            self._fail(HTTPError(f"the upstream closed the connection mid-answer{_cause(exc)}"))

    # -- parser callbacks -----------------------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # 1xx: an interim answer; the real head follows
            self.raw_headers = []
            return
        self.status = status
        self.head_done = True
        names = {n.lower() for n, _ in self.raw_headers}
        self.until_close = b"content-length" not in names and b"transfer-encoding" not in names
        self.wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered >= _PAUSE_AT and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self.wake()

    def on_message_complete(self) -> None:
        if not self.head_done:
            return  # the end of a 1xx
        self.keep_alive = self.parser.should_keep_alive() and not self.until_close
        self.complete = True
        self.wake()

    # -- waiting --------------------------------------------------------------------------------------------------

    def _fail(self, error: HTTPError) -> None:
        if self.error is None:
            self.error = error
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def take(self) -> bytes:
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data


def _expire(waiter: asyncio.Future[None], timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(ReadTimeout(f"no answer from the upstream for {timeout:g} s"))


def _cause(exc: BaseException | None) -> str:
    return f" ({type(exc).__name__}: {exc})" if exc is not None else ""


class BodyStream:
    """A response body read as its source delivers it: a connection here, an in-process call in transport.py. The
    source has `chunks`, `take()`, `complete`, `error` and `wait(timeout)` (ReadTimeout after that much silence).
    With a `_deadline` (time.monotonic), a body still unfinished then raises DeadlinePassed."""

    _source: Any
    _timeout: float
    _deadline: float | None = None
    _decoder: Any = None

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        source = self._source
        deadline = self._deadline
        while True:
            if source.chunks:
                data = source.take()
                yield self._decoder.decompress(data) if self._decoder is not None else data
            elif source.complete:
                return
            elif source.error is not None:
                raise source.error
            else:
                try:
                    await source.wait(next_wait(self._timeout, deadline))
                except ReadTimeout:
                    if deadline_passed(deadline):
                        raise DeadlinePassed("the answer had not ended by the call's deadline") from None
                    raise
            if deadline_passed(deadline) and not source.complete:  # an answer that keeps coming is no answer either
                raise DeadlinePassed("the answer had not ended by the call's deadline")

    async def aread(self) -> bytes:
        parts = [chunk async for chunk in self.aiter_bytes()]
        return parts[0] if len(parts) == 1 else b"".join(parts)


class Response(BodyStream):
    """An upstream response whose head has arrived; read its body with `aread()` or `aiter_bytes()`, then close."""

    def __init__(self, conn: _Connection, timeout: float, deadline: float | None = None) -> None:
        self._source = conn
        self._timeout = timeout
        self._deadline = deadline
        self._closed = False
        self.status_code = conn.status
        headers: dict[str, str] = {}
        for name, value in conn.raw_headers:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self.headers = headers
        encoding = headers.get("content-encoding", "identity").lower()
        self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 32) if encoding in ("gzip", "deflate", "x-gzip") else None

    def close(self) -> None:
        """Give the connection back when the answer was read to its end, else close it (the upstream sees that)."""
        if self._closed:
            return
        self._closed = True
        conn = self._source
        if conn.complete and conn.keep_alive and not conn.closed and conn.error is None:
            conn.pool.release(conn)
        else:
            conn._abort()

    async def aclose(self) -> None:
        self.close()


class H1Pool:
    """Keep-alive connections per origin, most recently used first; idle ones expire after `keepalive_s`."""

    def __init__(self, *, max_idle_per_origin: int = 256, keepalive_s: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.max_idle = max_idle_per_origin
        self.keepalive_s = keepalive_s
        self._idle: dict[Origin, list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = ssl_context  # default: the system's CAs and certifi's
        self._closed = False
        self.opened = 0  # connections opened so far (a pool that works opens few)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context()
            try:
                import certifi

                ctx.load_verify_locations(certifi.where())
            except ImportError:  # the system's CA store only
                pass
            ctx.set_alpn_protocols(["http/1.1"])
            self._ssl = ctx
        return self._ssl

    async def _connect(self, origin: Origin, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._ssl_context() if origin.scheme == "https" else None
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, origin), origin.host, origin.port, ssl=tls,
                    server_hostname=origin.host if tls is not None else None,
                )
        except TimeoutError:
            raise ConnectTimeout(f"no connection to {origin.host}:{origin.port} within {timeout:g} s") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"cannot connect to {origin.host}:{origin.port}: {exc}") from exc
        self.opened += 1
        return conn

    def _reuse(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn._abort()
        return None

    def release(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.origin, [])
        if self._closed or len(idle) >= self.max_idle:
            conn._abort()
            return
        conn._reset()
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)

    async def post(self, url: str, headers: dict[str, str], body: bytes, *, timeout: float,
                   connect_timeout: float, deadline: float | None = None) -> Response:
        """Send a POST; returns once the response head is in (its body still streaming in). `timeout`: the longest
        silence; `deadline` (time.monotonic): when the whole answer must have ended."""
        origin, path = split_url(url)
        # No compression asked for (a compressed answer is still decoded); the body length is always known.
        head = [f"POST {path} HTTP/1.1\r\nhost: {origin.host_header}\r\n{_FIXED_HEADERS}"]
        for name, value in headers.items():
            if "\n" in value or "\r" in value:
                raise ValueError(f"header {name!r} holds a line break")
            head.append(f"{name}: {value}\r\n")
        head.append(f"content-length: {len(body)}\r\n\r\n")
        message = "".join(head).encode("latin-1") + body
        while True:
            conn = self._reuse(origin)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(origin, connect_timeout)
            assert conn.transport is not None
            conn.transport.write(message)
            try:
                while not conn.head_done:
                    try:
                        await conn.wait(next_wait(timeout, deadline))
                    except ReadTimeout:
                        if deadline_passed(deadline):
                            raise DeadlinePassed("no answer by the call's deadline") from None
                        raise
            except NoResponse:
                if reused:  # the server closed this idle connection as we sent: it never saw the request
                    continue
                raise
            except BaseException:
                conn._abort()  # cancelled or timed out: the upstream sees the connection close
                raise
            return Response(conn, timeout, deadline)

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn._abort()
        self._idle.clear()
