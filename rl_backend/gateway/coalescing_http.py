"""uvicorn's httptools protocol, with the request time limits of http_guard.py, and one change: what the app writes
during one turn of the event loop leaves in one send.

uvicorn writes a response's head as soon as the app sends `http.response.start`, and its body at
`http.response.body`: two system calls, and two wake-ups of the agent reading the answer. On loopback those cost
more than the rest of a small response; coalescing them also joins stream events that arrive together. The data
leaves at the end of the current turn of the loop (`call_soon`), before the loop waits for anything.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rl_backend.gateway.http_guard import GuardedHttpToolsProtocol


class CoalescingTransport:
    """Wraps a transport; `write` gathers, the next turn of the loop sends. Everything else passes through."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._parts: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._parts:
            self._loop.call_soon(self.flush)
        self._parts.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._parts:
            data = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            self._parts.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._parts.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(GuardedHttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport))  # type: ignore[arg-type]
