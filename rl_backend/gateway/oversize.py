"""What the gateway keeps of an upstream answer too big to hold: the agent gets every byte, the record a bounded part
and a note saying so.

A whole (JSON) answer up to `KEEP_BYTES` is read, checked and recorded as usual. Past that the gateway stops holding
it: what it has read goes to the agent and the rest follows as it arrives, unchanged, while the record keeps the first
`KEEP_BYTES` as text and the usage found in the answer's last bytes (OpenAI and Anthropic answers end with it). A
stream passes on event by event anyway; past `KEEP_BYTES` its record stops collecting text, token ids and logprobs
(a part of the token ids would make a wrong trajectory) and keeps what usage says. A single stream event over
`MAX_EVENT_BYTES` is refused as malformed: it would have to be held whole to be read. A record that kept less than
the answer has `response["agl_truncated"]`: the bytes kept and the answer's size.
"""

from __future__ import annotations

import json
import re
from typing import Any

KEEP_BYTES = 8 << 20
MAX_EVENT_BYTES = 32 << 20
TAIL_BYTES = 64 << 10
TRUNCATED = "agl_truncated"
_MODEL = re.compile(r'"model"\s*:\s*"([^"\\]{1,200})"')


def truncation_note(kept: int, total: int) -> dict[str, int]:
    return {"kept_bytes": kept, "total_bytes": total}


class Tail:
    """The last TAIL_BYTES of an answer passing through, to read its usage from once it has ended."""

    def __init__(self) -> None:
        self._data = bytearray()

    def add(self, chunk: bytes) -> None:
        self._data += chunk[-TAIL_BYTES:]
        if len(self._data) > TAIL_BYTES:
            del self._data[: len(self._data) - TAIL_BYTES]

    def usage(self) -> Any:
        """The value of the answer's last `"usage"` key, or None when the tail holds none that parses."""
        text = self._data.decode("utf-8", "replace")
        at = text.rfind('"usage"')
        if at < 0:
            return None
        colon = text.find(":", at + 7)
        if colon < 0:
            return None
        start = colon + 1
        while start < len(text) and text[start] in " \t\r\n":
            start += 1
        try:
            value, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            return None
        return value


def model_in(head: bytes) -> str | None:
    """The model an answer names near its start (for its price), if it names one there."""
    match = _MODEL.search(head[:4096].decode("utf-8", "replace"))
    return match.group(1) if match else None
