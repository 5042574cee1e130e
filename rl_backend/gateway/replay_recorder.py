"""`record_to:` a transport in front of an upstream's own that appends every successful answer to a JSONL recording,
for `kind: replay` to serve back later (replay.py holds the line format and how requests are matched).

The answer reaches the agent as it comes: the recorder keeps a copy of what the gateway reads and writes the line
once the answer has been read to its end. Only 2xx answers are recorded; API keys and other request headers never
are. A streamed answer is kept as its raw event stream and replayed byte for byte; one cut short is not kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rl_backend.gateway.replay import api_of_path, match_info, preview, request_key
from rl_backend.gateway.transport import Transport, UpstreamResponse

_KEEP_RESPONSE = ("x-request-id", "request-id", "retry-after", "retry-after-ms")


class RecordingFile:
    """Appends recording lines to one file. Every writer runs on the gateway's event loop, one line per write."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.written = 0

    def add(self, api: str, body: dict[str, Any], status: int, headers: dict[str, str], *, response: Any = None,
            sse: str | None = None, elapsed_s: float | None = None) -> None:
        line: dict[str, Any] = {
            "key": request_key(api, body), "api": api, "model": body.get("model"), "match": match_info(api, body),
            "preview": preview(body), "status": status, "headers": headers,
        }
        if sse is not None:
            line["sse"] = sse
        else:
            line["response"] = response
        if elapsed_s is not None:
            line["elapsed_s"] = round(elapsed_s, 3)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
        self.written += 1


class _CopiedResponse:
    """The upstream's response, passed on unchanged; `on_end` gets all of its body once it was read to the end."""

    def __init__(self, response: UpstreamResponse, on_end: Callable[[bytes], None]) -> None:
        self._response = response
        self._on_end = on_end
        self.status_code = response.status_code
        self.headers = response.headers

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        parts: list[bytes] = []
        async for chunk in self._response.aiter_bytes():
            parts.append(chunk)
            yield chunk
        self._on_end(b"".join(parts))

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])

    def close(self) -> None:
        self._response.close()


class RecordingTransport:
    """`inner`'s answers, recorded to `file` when they succeed."""

    def __init__(self, inner: Transport, file: RecordingFile) -> None:
        self.inner = inner
        self.file = file

    async def post(self, url: str, headers: dict[str, str], body: bytes, *, timeout: float,
                   connect_timeout: float, deadline: float | None = None) -> UpstreamResponse:
        started = time.perf_counter()
        response = await self.inner.post(url, headers, body, timeout=timeout, connect_timeout=connect_timeout,
                                         deadline=deadline)
        api = api_of_path(urlsplit(url).path)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if api is None or not isinstance(request, dict) or not 200 <= response.status_code < 300:
            return response
        kept = {k: v for k, v in response.headers.items() if k in _KEEP_RESPONSE}
        streamed = "text/event-stream" in response.headers.get("content-type", "application/json")

        def record(data: bytes) -> None:
            assert api is not None and isinstance(request, dict)
            elapsed = time.perf_counter() - started
            if streamed:
                self.file.add(api, request, response.status_code, kept, sse=data.decode("utf-8", "replace"),
                              elapsed_s=elapsed)
                return
            try:
                parsed = json.loads(data)
            except ValueError:
                return  # not an answer replay could serve
            self.file.add(api, request, response.status_code, kept, response=parsed, elapsed_s=elapsed)

        return _CopiedResponse(response, record)

    async def aclose(self) -> None:
        await self.inner.aclose()
