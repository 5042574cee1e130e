"""Server-sent events: an incremental decoder for upstream byte streams and an encoder for what we forward.

The decoder yields each event as soon as its terminating blank line arrives, so the gateway forwards events as
they come instead of buffering a stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_backend.gateway.jsonfast import dumps, loads


def is_done(data: str) -> bool:
    """OpenAI's end-of-stream marker, `[DONE]` (spaces around it tolerated)."""
    return len(data) < 32 and data.strip() == "[DONE]"


@dataclass
class SSEEvent:
    data: str
    event: str | None = None

    def json(self) -> Any:
        return loads(self.data)

    def encode(self) -> bytes:
        return encode_event(self.data, self.event)


def encode_event(data: str, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    body = "".join(f"data: {line}\n" for line in data.split("\n"))
    return (head + body + "\n").encode()


def encode_json_event(payload: Any, event: str | None = None) -> bytes:
    # Compact JSON holds no line break, so it is one `data:` line.
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + dumps(payload) + b"\n\n"


class SSEDecoder:
    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        # Normalise CRLF over the whole unconsumed buffer, so a CR and LF split across chunks still pair up.
        self._buffer = (self._buffer + chunk).replace(b"\r\n", b"\n")
        events: list[SSEEvent] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                break
            block, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            event = self._parse(block)
            if event is not None:
                events.append(event)
        return events

    def flush(self) -> list[SSEEvent]:
        """An event the stream ended without terminating (some servers omit the final blank line)."""
        block, self._buffer = self._buffer, b""
        event = self._parse(block.rstrip(b"\n"))
        return [] if event is None else [event]

    @staticmethod
    def _parse(block: bytes) -> SSEEvent | None:
        # The usual block is one `data: …` line: take it without splitting (most of a stream's cost is here).
        if block.startswith(b"data: ") and b"\n" not in block:
            return SSEEvent(block[6:].decode("utf-8", "replace"))
        data: list[str] = []
        name: str | None = None
        for raw in block.decode("utf-8", "replace").split("\n"):
            if not raw or raw.startswith(":"):
                continue  # comments keep connections alive; nothing to forward
            field, _, value = raw.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "data":
                data.append(value)
            elif field == "event":
                name = value
        if not data and name is None:
            return None
        return SSEEvent("\n".join(data), name)
