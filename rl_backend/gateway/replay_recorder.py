"""Record: a pass-through proxy in front of a live upstream that appends every successful response to a JSONL file,
for `kind: replay` to serve back later (see replay.py for the line format and how requests are matched).

`record_to:` on an upstream in agl.yaml starts one of these per run: the gateway talks to the proxy, the proxy to
the real API (same path, same headers, API key included), and the agent's answer streams through unchanged. Only
2xx answers are recorded; API keys and other request headers never are. A streamed answer is kept as its raw
event stream and replayed byte for byte.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rl_backend.gateway.config import ResolvedUpstream
from rl_backend.gateway.replay import api_of_path, match_info, preview, request_key

_DROP_REQUEST = {"host", "content-length", "connection", "transfer-encoding"}
_KEEP_RESPONSE = ("x-request-id", "request-id", "retry-after", "retry-after-ms")
_FILE_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


class RecordWriter:
    """Appends recording lines to one file; safe across threads and across proxies sharing the file."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _LOCKS_LOCK:
            self._lock = _FILE_LOCKS.setdefault(self.path, threading.Lock())
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
        text = json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(text)
            self.written += 1


class RecordingProxy:
    """ASGI app: POST /u<i>/<path> goes to targets[i] + <path>; 2xx answers are recorded."""

    def __init__(self, targets: list[str], writer: RecordWriter, *, timeout_s: float = 600.0) -> None:
        self.targets = [t.rstrip("/") for t in targets]
        self.writer = writer
        self.timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None

    @property
    def app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, connect=10.0))
            try:
                yield
            finally:
                await self._client.aclose()

        return Starlette(routes=[Route("/u{index:int}/{path:path}", self._forward, methods=["POST"])], lifespan=lifespan)

    async def _forward(self, request: Request) -> Response:
        index, path = request.path_params["index"], "/" + request.path_params["path"]
        if index >= len(self.targets) or self._client is None:
            return JSONResponse({"error": {"message": f"record proxy: no upstream #{index}"}}, 404)
        raw = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        started = time.perf_counter()
        upstream = await self._client.send(
            self._client.build_request("POST", self.targets[index] + path, content=raw, headers=headers), stream=True
        )
        kept = {k: v for k, v in upstream.headers.items() if k.lower() in _KEEP_RESPONSE}
        api = api_of_path(path)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        recordable = api is not None and isinstance(body, dict) and 200 <= upstream.status_code < 300
        ctype = upstream.headers.get("content-type", "application/json")
        if "text/event-stream" not in ctype:
            data = await upstream.aread()
            await upstream.aclose()
            if recordable:
                assert api is not None and isinstance(body, dict)
                try:
                    parsed = json.loads(data)
                except ValueError:
                    parsed = None
                if parsed is not None:
                    self.writer.add(api, body, upstream.status_code, kept, response=parsed,
                                    elapsed_s=time.perf_counter() - started)
            return Response(data, upstream.status_code, headers=kept, media_type=ctype.split(";")[0])

        chunks: list[bytes] = []
        complete = False

        async def relay() -> AsyncIterator[bytes]:
            nonlocal complete
            async for chunk in upstream.aiter_bytes():
                chunks.append(chunk)
                yield chunk
            complete = True

        def finish() -> None:
            if recordable and complete:  # a stream the agent hung up on is not a recording
                assert api is not None and isinstance(body, dict)
                self.writer.add(api, body, upstream.status_code, kept, sse=b"".join(chunks).decode("utf-8", "replace"),
                                elapsed_s=time.perf_counter() - started)

        async def close_and_record() -> None:
            await upstream.aclose()
            finish()

        return StreamingResponse(relay(), upstream.status_code, headers=kept, media_type="text/event-stream",
                                 background=BackgroundTask(close_and_record))


class RecordingServer:
    def __init__(self, targets: list[str], path: Path | str, *, timeout_s: float = 600.0) -> None:
        from rl_backend.httpserver import ServerThread

        self.writer = RecordWriter(path)
        self.proxy = RecordingProxy(targets, self.writer, timeout_s=timeout_s)
        self._server = ServerThread(self.proxy.app)

    def start(self) -> RecordingServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    @property
    def base_urls(self) -> list[str]:
        return [f"{self._server.base_url}/u{i}" for i in range(len(self.proxy.targets))]


def start_recording(upstream: ResolvedUpstream, path: Path | str) -> tuple[ResolvedUpstream, RecordingServer]:
    """Put a recording proxy in front of `upstream`; returns the upstream to give the gateway, and the proxy to stop.

    The upstream keeps its price: a hosted API behind the loopback proxy is still charged for."""
    from rl_backend.gateway.pricing import upstream_is_free

    server = RecordingServer(upstream.base_urls, path, timeout_s=upstream.timeout_s).start()
    wrapped = upstream.model_copy(update={"base_urls": server.base_urls, "free": upstream_is_free(upstream)})
    return wrapped, server
