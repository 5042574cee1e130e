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


class EventTooLarge(ValueError):
    """A stream event longer than the decoder holds: it would have to be kept whole to be read."""


class SSEDecoder:
    """Events from a byte stream. Linear in the bytes fed, however they are split: an event arriving in many small
    chunks is not copied again at each one; with `max_event_bytes`, an event growing past it raises EventTooLarge."""

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # how much of the buffer is known to hold no event's end
        self._cr = False  # the last chunk ended in CR: its LF may start the next
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._cr:
            chunk, self._cr = b"\r" + chunk, False
        if chunk.endswith(b"\r"):
            chunk, self._cr = chunk[:-1], True
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        buf = self._buffer
        # The usual chunk starts with a new event: read it where it lies; only an unfinished event is buffered.
        data: bytes | bytearray = chunk
        search = 0
        if buf:
            buf += chunk
            data, search = buf, max(self._scanned - 1, 0)  # a blank line may straddle the old end and the new bytes
        events: list[SSEEvent] = []
        pos = 0
        while True:
            end = data.find(b"\n\n", search)
            if end < 0:
                break
            event = self._parse(data[pos:end])
            if event is not None:
                events.append(event)
            pos = search = end + 2
        if data is buf:
            del buf[:pos]
        elif pos < len(chunk):
            buf += chunk[pos:]
        self._scanned = len(buf)
        if self.max_event_bytes is not None and len(buf) > self.max_event_bytes:
            raise EventTooLarge(f"a stream event passed {self.max_event_bytes} bytes without ending")
        return events

    def flush(self) -> list[SSEEvent]:
        """An event the stream ended without terminating (some servers omit the final blank line)."""
        block = bytes(self._buffer) + (b"\r" if self._cr else b"")
        self._buffer, self._scanned, self._cr = bytearray(), 0, False
        event = self._parse(block.rstrip(b"\n"))
        return [] if event is None else [event]

    @staticmethod
    def _parse(block: bytes | bytearray) -> SSEEvent | None:
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
