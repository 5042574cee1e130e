"""The HTTP face of the engine: an OpenAI-compatible Starlette app, and a one-call embedded server.

Routes: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions (streaming or not), and
POST /agl/weights {"path": dir, "version": str} to serve a new checkpoint (for a trainer in another process).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..httpserver import ServerThread
from .detok import TokenText
from .engine import Completion, Engine, EngineError
from .linear import Precision
from .model_store import DEFAULT_MODEL
from .protocol import Parsed, RequestError, parse_chat, parse_completion
from .responses import Reply, sse

log = logging.getLogger(__name__)


def _error(
    status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> JSONResponse:
    err = RequestError(message, param=param, code=code, status=status, type=type)
    return JSONResponse(err.body(), status_code=status)


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        raise RequestError("the request body is empty; send a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from exc


async def _until_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(engine: Engine) -> Starlette:
    """An OpenAI-compatible app over a started `engine`."""
    tokens = TokenText(engine.tokenizer)
    started = int(time.time())

    def encode_text(text: str) -> list[int]:
        return [int(t) for t in engine.tokenizer.encode(text)]

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": engine.name, **engine.stats()})

    async def models(request: Request) -> Response:
        card = {
            "id": engine.name,
            "object": "model",
            "created": started,
            "owned_by": "agl",
            "max_model_len": engine.context_length,
            "model_version": engine.model_version,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def run(request: Request, kind: str, parse: Callable[[Any], Parsed]) -> Response:
        parsed = parse(await _json_body(request))
        try:
            stream = engine.stream(parsed.prompt_ids, parsed.params)
        except ValueError as exc:  # context overflow, bad token ids, bad sampling values
            raise RequestError(str(exc)) from exc
        reply = Reply(parsed, kind, tokens)
        if parsed.stream:
            return StreamingResponse(
                _sse_events(reply, stream, engine.model_version),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await _complete(request, reply, stream)

    async def chat(request: Request) -> Response:
        return await run(request, "chat", lambda body: parse_chat(body, engine.name, engine.encode_chat, engine.loaded.aliases))

    async def completions(request: Request) -> Response:
        return await run(request, "text", lambda body: parse_completion(body, engine.name, encode_text, engine.loaded.aliases))

    async def weights(request: Request) -> Response:
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("path"), str) or not isinstance(body.get("version"), str):
            raise RequestError('send {"path": "<checkpoint dir>", "version": "<name>"}')
        try:
            await asyncio.to_thread(engine.load_weights_from_dir, body["path"], body["version"])
        except ValueError as exc:
            raise RequestError(str(exc), param="path") from exc
        return JSONResponse({"model": engine.name, "model_version": engine.model_version})

    async def on_request_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestError)
        return JSONResponse(exc.body(), status_code=exc.status)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        msg = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return _error(exc.status_code, msg)

    async def on_server_error(request: Request, exc: Exception) -> Response:
        log.exception("request failed", exc_info=exc)
        return _error(500, f"the server failed: {exc}", type="server_error")

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/agl/weights", weights, methods=["POST"]),
    ]
    handlers: dict[Any, Callable[..., Any]] = {
        RequestError: on_request_error,
        HTTPException: on_http_error,
        EngineError: on_server_error,
        Exception: on_server_error,
    }
    return Starlette(routes=routes, exception_handlers=handlers)


async def _complete(request: Request, reply: Reply, stream: AsyncIterator[Any]) -> Response:
    out = Completion(prompt_token_ids=reply.parsed.prompt_ids)

    async def collect() -> None:
        async for delta in stream:
            out.extend(delta)

    # A non-streaming handler would otherwise not notice its client leaving; the engine should stop that row.
    work = asyncio.ensure_future(collect())
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            # Cancelling only asks; wait until the task has really stopped before reading its state.
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        return Response(status_code=499)  # nobody is there to read it
    work.result()  # re-raises EngineError
    return JSONResponse(reply.full(out))


async def _sse_events(reply: Reply, stream: AsyncIterator[Any], version: str) -> AsyncIterator[bytes]:
    n_tokens, offset, is_first = 0, 0, True
    try:
        async for delta in stream:
            if is_first:
                # The role chunk waits for the first token so that it names the model version that was admitted.
                head = reply.first_chunk(delta.model_version)
                if head is not None:
                    yield sse(head)
            yield sse(reply.chunk(delta, is_first, offset))
            is_first = False
            n_tokens += len(delta.token_ids)
            offset += len(delta.text)
            version = delta.model_version
    except EngineError as exc:
        yield sse({"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}})
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    if reply.parsed.include_usage:
        yield sse(reply.usage_chunk(n_tokens, version))
    yield sse("[DONE]")


@dataclass
class EmbeddedServer:
    """A running server: `base_url` (the OpenAI base is base_url + "/v1"), `engine`, `stop()`."""

    engine: Engine
    thread: ServerThread

    @property
    def base_url(self) -> str:
        return self.thread.base_url

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def model(self) -> str:
        return self.engine.name

    def stop(self) -> None:
        self.thread.stop()
        self.engine.stop()

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_embedded_server(
    model: str = DEFAULT_MODEL,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    engine: Engine | None = None,
    max_batch_size: int = 16,
    threads: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    precision: Precision = "float32",
    log_level: str = "warning",
) -> EmbeddedServer:
    """Load `model` (unless an `engine` is given), start it, and serve it on host:port (0: the OS picks).

    `dtype` is the torch dtype the model is loaded in ("float32", "bfloat16"; default float32 on CPU, bfloat16 on
    GPU); `precision` is the CPU fast runner's (float32, or bfloat16 for evaluation only: see linear.py); `threads`
    fixes the CPU threads (default: follow the load).
    """
    if engine is None:
        engine = Engine.from_model(
            model, device=device, dtype=dtype, max_batch_size=max_batch_size, threads=threads, precision=precision
        )
    engine.start()
    thread = ServerThread(create_app(engine), host=host, port=port, log_level=log_level)
    try:
        thread.start()
    except BaseException:
        engine.stop()
        raise
    return EmbeddedServer(engine=engine, thread=thread)
