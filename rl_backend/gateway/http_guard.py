"""uvicorn's httptools protocol with time limits on a request as it arrives: its head, then its body.

uvicorn closes a connection that idles between requests (its keep-alive timeout), but waits without end for one whose
request has begun: a client that sends part of a head, or a body a byte now and then (slowloris), holds a connection,
and the gateway, reading that body, counts the call in flight. Here a request's head must be complete within
`timeout_s` of its first byte (or of the connection opening), and its body may not pause longer than `timeout_s`;
past either the connection is closed, with a 408 when nothing was answered on it yet.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

REQUEST_TIMEOUT_S = 30.0
_TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    timeout_s: float = REQUEST_TIMEOUT_S

    _timer: asyncio.TimerHandle | None = None
    _phase: str | None = None  # "head" (a deadline from its first byte), "body" (an idle limit), None (nothing due)

    def _arm(self, phase: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._phase = phase
        self._timer = self.loop.call_later(self.timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase = None, None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._phase == "head" and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("head")  # a connection that sends nothing at all is closed too

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._phase == "body":
            self._arm("body")  # the body moved: its idle limit starts again

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm("head")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm("body")

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def guarded(timeout_s: float, base: type[GuardedHttpToolsProtocol] = GuardedHttpToolsProtocol) -> type[Any]:
    """`base` with its request time limits set to `timeout_s` (uvicorn takes a protocol class, not an instance)."""
    if timeout_s <= 0:
        raise ValueError(f"a request timeout must be positive, got {timeout_s:g}")
    return type(base.__name__, (base,), {"timeout_s": timeout_s})
