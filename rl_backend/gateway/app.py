"""The gateway: rollout registry and auth, the HTTP routes, pause/resume, and starting it on a thread.

An agent gets base URLs under `/rollouts/<rid>/` and a token valid for that rollout only. Every model call it makes
becomes one CallRecord in the run store (see proxy.py); a reward it posts goes to the store too. Model calls take a
direct ASGI path (no router, no middleware: they are the hot path); everything else is a small Starlette app.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rl_backend.gateway.adapters import build_exchange
from rl_backend.gateway.admin import AdminAPI
from rl_backend.gateway.budget import SpendLimit
from rl_backend.gateway.config import ResolvedUpstream
from rl_backend.gateway.errors import Dialect, GatewayError, error_body, error_response, json_response
from rl_backend.gateway.exchange import check_optional
from rl_backend.gateway.http_guard import REQUEST_TIMEOUT_S, guarded
from rl_backend.gateway.httpio import dialect_of, parse_json_object, presented_token, read_json_object
from rl_backend.gateway.ids import check_rollout_id, shown_id
from rl_backend.gateway.knobs import knobs_for_call, validate_knobs
from rl_backend.gateway.oversize import KEEP_BYTES
from rl_backend.gateway.pricing import DeclaredPrice, PriceTable
from rl_backend.gateway.proxy import GatewayState, ProxyCall, Services
from rl_backend.gateway.routing import Router
from rl_backend.gateway.upstream import RetryPolicy, UpstreamClient
from rl_backend.gateway.writer import RecordWriter
from rl_backend.httpserver import ServerThread
from rl_backend.netaddr import is_loopback_host
from rl_backend.store.db import RunStore
from rl_backend.store.gateway_state import AdminState
from rl_backend.store.records import check_reward

# The model-call endpoints under /rollouts/<rid>/, and the API kind each serves.
PROXY_PATHS = {
    "openai/v1/chat/completions": "chat",
    "openai/v1/completions": "completions",
    "openai/v1/responses": "responses",
    "anthropic/v1/messages": "messages",
}


_NO_TOKEN = "agl-" + secrets.token_urlsafe(24)  # compared against when the id is unknown, so timing tells nothing


@dataclass
class RolloutEntry:
    token: str
    knobs: dict[str, Any]


def _scope_token(headers: dict[str, str]) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return headers.get("x-api-key") or None


class Gateway:
    def __init__(
        self,
        upstreams: dict[str, ResolvedUpstream],
        store: RunStore,
        *,
        default_model: str | None = None,
        admin_token: str | None = None,
        record_token_ids: bool = True,
        max_body_bytes: int = 32 * 2**20,
        prices: Mapping[str, DeclaredPrice] | None = None,  # declared prices, by upstream/model or model
        retry: RetryPolicy | None = None,
        durable_before_reply: bool = True,
        pause_retry_after_s: float = 2.0,
        spend_limit: SpendLimit | None = None,
        keep_response_bytes: int = KEEP_BYTES,  # of an answer, what a record keeps; the agent still gets all of it
        durable: AdminState | None = None,  # where admin state outlives this process (a cluster's gateway)
    ) -> None:
        self.router = Router(upstreams, default_model)
        self.store = store
        self.admin_token = admin_token
        self.record_token_ids = record_token_ids
        self.max_body_bytes = max_body_bytes
        self.pause_retry_after_s = pause_retry_after_s
        self.pause_hold_s = 0.0  # set by pause(hold_s=...)
        self.calls_held = 0  # calls that arrived during a pause and waited for the resume
        self.state = GatewayState()
        self.writer = RecordWriter(store)
        self.services = Services(
            client=UpstreamClient(retry),
            writer=self.writer,
            prices=PriceTable(prices),
            state=self.state,
            durable_before_reply=durable_before_reply,
            spend=spend_limit,
            keep_bytes=keep_response_bytes,
        )
        self._rollouts: dict[str, RolloutEntry] = {}
        self._secrets = tuple(u.api_key for u in upstreams.values() if u.api_key)
        self._starlette: Starlette | None = None
        self.base_url: str | None = None  # set by start_gateway
        self.durable = durable
        if durable is not None:
            self._restore(durable)

    def _restore(self, durable: AdminState) -> None:
        """What this gateway's previous process was told: the rollouts it admitted (their agents keep their tokens),
        the policy's servers, the pause and the model version. An upstream no longer in the config is skipped."""
        for rollout_id, (token, knobs) in durable.rollouts().items():
            self._rollouts[rollout_id] = RolloutEntry(token, knobs)
        for upstream, (base_urls, model) in durable.endpoints().items():
            with contextlib.suppress(ValueError):
                self.router.set_endpoints(upstream, base_urls, model)
        settings = durable.settings()
        self.pause_hold_s = float(settings.get("pause_hold_s", 0.0))
        self.state.paused = bool(settings.get("paused", False))
        if settings.get("model_version") is not None:
            self.state.model_version = settings["model_version"]

    # -- rollouts -------------------------------------------------------------------------------------------------

    def register_rollout(self, rollout_id: str, knobs: dict[str, Any] | None = None) -> str:
        """Admit a rollout; returns its secret token (the agent's API key). Raises ValueError for a bad id or knobs."""
        check_rollout_id(rollout_id)
        checked = validate_knobs(knobs)
        if "model" in checked:
            self.router.resolve(None, checked["model"], rollout_id)  # fail now, not at the agent's first call
        token = "agl-" + secrets.token_urlsafe(24)
        if self.durable is not None:  # stored before the token is handed out: an agent never holds a lost one
            self.durable.put_rollout(rollout_id, token, checked)
        self._rollouts[rollout_id] = RolloutEntry(token, checked)
        return token

    def unregister_rollout(self, rollout_id: str) -> None:
        self._rollouts.pop(rollout_id, None)
        if self.durable is not None:
            self.durable.drop_rollout(rollout_id)

    def rollout_entry(self, rollout_id: str) -> RolloutEntry | None:
        return self._rollouts.get(rollout_id)

    def _authorize(self, rollout_id: str, token: str | None) -> RolloutEntry:
        # The token is checked before anything is said about the rollout: whether an id is registered is no
        # business of a caller that cannot show its token.
        if token is None:
            raise GatewayError(
                401,
                "no API key: send this rollout's token (the OPENAI_API_KEY / ANTHROPIC_API_KEY agl set) as "
                "`Authorization: Bearer <token>` or `x-api-key`",
                code="invalid_api_key",
            )
        entry = self._rollouts.get(rollout_id)
        expected = entry.token if entry is not None else _NO_TOKEN
        if not hmac.compare_digest(token.encode(), expected.encode()) or entry is None:
            raise GatewayError(
                401,
                f"this API key is not valid for rollout {shown_id(rollout_id)}: each rollout has its own token, "
                "valid while the rollout runs; use the base URL and API key agl set in this agent's environment",
                code="invalid_api_key",
            )
        return entry

    # -- pause, resume, state (Python side, for an in-process trainer) --------------------------------------------

    def pause(self, hold_s: float = 0.0) -> None:
        """New calls get 429 with Retry-After; calls in flight finish. With `hold_s`, a new call first waits up to
        that long for resume(): an agent whose SDK gives up on 429 after a few seconds (the OpenAI SDK retries twice)
        never sees a pause as short as a training step."""
        self.pause_hold_s = hold_s
        self.state.paused = True
        self._keep_settings()

    def resume(self, model_version: str | None = None) -> None:
        if model_version is not None:
            self.state.model_version = model_version
        self.state.paused = False
        self._keep_settings()

    def set_model_version(self, model_version: str) -> None:
        """Later records carry `model_version` (for upstreams whose responses name none, such as vLLM)."""
        self.state.model_version = model_version
        self._keep_settings()

    def _keep_settings(self) -> None:
        if self.durable is not None:
            for key, value in (("paused", self.state.paused), ("pause_hold_s", self.pause_hold_s),
                               ("model_version", self.state.model_version)):
                self.durable.put_setting(key, value)

    def set_endpoints(self, upstream: str, base_urls: list[str], model: str | None = None) -> None:
        """Where the servers of a `registered_later` upstream (the policy a trainer trains) now are: the next call
        goes there. Raises ValueError for another upstream or no URL."""
        self.router.set_endpoints(upstream, base_urls, model)
        if self.durable is not None:
            self.durable.put_endpoints(upstream, list(base_urls), model)

    @property
    def spend_limit(self) -> SpendLimit | None:
        return self.services.spend

    async def _held_until_resumed(self) -> bool:
        # Polled, not an event: pause() and resume() are called from the trainer's thread, not this loop.
        if self.pause_hold_s <= 0:
            return False
        self.calls_held += 1
        deadline = time.monotonic() + self.pause_hold_s
        while self.state.paused and time.monotonic() < deadline:
            await anyio.sleep(0.01)
        return not self.state.paused

    @property
    def in_flight(self) -> int:
        return self.state.in_flight

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Block (not on the gateway's loop) until no call is in flight; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.state.in_flight > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Block until every record queued so far is committed."""
        return self.writer.flush(timeout_s)

    def state_dict(self) -> dict[str, Any]:
        return {
            "paused": self.state.paused,
            "in_flight": self.state.in_flight,
            "model_version": self.state.model_version,
            "calls_started": self.state.calls_started,
            "calls_recorded": self.writer.written,
            "calls_held": self.calls_held,
            "rollouts": len(self._rollouts),
            "upstream_connections_opened": self.services.client.connections_opened,
            "spend": self.services.spend.as_dict() if self.services.spend is not None else None,
        }

    # -- HTTP -----------------------------------------------------------------------------------------------------

    @property
    def app(self) -> Gateway:
        """The ASGI application (the gateway itself)."""
        return self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/rollouts/"):
            rollout_id, _, rest = scope["path"][10:].partition("/")
            kind = PROXY_PATHS.get(rest)
            if kind is not None and rollout_id:
                if scope["method"] == "POST":
                    await self._proxy(scope, receive, send, rollout_id, kind)
                    return
                message = f"{scope['method']} is not allowed on {scope['path']!r}: model calls are POSTs"
                body = error_body(405, message, dialect_of(scope["path"]))
                await json_response(405, body, {"allow": "POST"})(scope, receive, send)
                return
        if self._starlette is None:
            self._starlette = self._build_app()
        await self._starlette(scope, receive, send)

    def _build_app(self) -> Starlette:
        prefix = "/rollouts/{rid}"
        routes = [
            Route(f"{prefix}/openai/v1/models", self._models, methods=["GET"]),
            Route(f"{prefix}/reward", self._reward, methods=["POST"]),
            *AdminAPI(self).routes(),
            Route("/healthz", self._health, methods=["GET"]),
        ]

        async def http_error(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 500
            path = request.url.path
            if status == 404:
                message = (
                    f"no such endpoint {path!r}: this gateway serves /rollouts/<id>/openai/v1/"
                    "chat/completions, …/completions, …/responses and /rollouts/<id>/anthropic/v1/messages"
                )
            elif status == 405:
                message = f"{request.method} is not allowed on {path!r}"
            else:
                message = f"gateway error: {exc}"
            return json_response(status, error_body(status, message, dialect_of(path)))

        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            self.writer.start()
            await self.services.client.start()
            try:
                yield
            finally:
                await self.services.client.aclose()
                for transport in {id(u.transport): u.transport for u in self.router.upstreams.values()
                                  if u.transport is not None}.values():
                    await transport.aclose()
                await anyio.to_thread.run_sync(self.writer.close)

        return Starlette(
            routes=routes,
            exception_handlers={404: http_error, 405: http_error, Exception: http_error},
            lifespan=lifespan,
        )

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, rollout_id: str, kind: str) -> None:
        dialect: Dialect = "anthropic" if kind == "messages" else "openai"
        started_at, t0 = time.time(), time.perf_counter()
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            entry = self._authorize(rollout_id, _scope_token(headers))
            if self.state.paused and not await self._held_until_resumed():
                raise GatewayError(
                    429,
                    "the gateway is paused while the model is updated; retry shortly",
                    code="gateway_paused",
                    headers={"retry-after": f"{self.pause_retry_after_s:g}"},
                )
        except GatewayError as exc:
            await error_response(exc, dialect)(scope, receive, send)
            return
        # In flight from admission on, so a drain that starts while this body is still arriving waits for it.
        self.state.in_flight += 1
        try:
            body = parse_json_object(await self._read_body(headers, receive))
            check_optional(body, "model", "string")
            request_model = body.get("model")
            route = self.router.resolve(request_model, entry.knobs.get("model"), rollout_id)
            if self.services.spend is not None and not self.services.prices.knows(route.upstream, route.model):
                raise _unpriced(route.upstream.name, route.model)
            token_ids = self.record_token_ids and route.upstream.returns_token_ids
            knobs = knobs_for_call(entry.knobs, route.upstream.name, route.model)  # a scoped knob: this model's?
            exchange = build_exchange(kind, body, route, token_ids=token_ids, knobs=knobs)
        except BaseException as exc:
            self.state.in_flight -= 1
            if isinstance(exc, GatewayError):
                await error_response(exc, dialect)(scope, receive, send)
                return
            raise
        call = ProxyCall(
            self.services,
            exchange,
            rollout_id=rollout_id,
            request_model=request_model,
            agent_headers=headers,
            secrets=(*self._secrets, entry.token),
            started_at=started_at,
            t0=t0,
        )
        await call(scope, receive, send)

    async def _read_body(self, headers: dict[str, str], receive: Receive) -> bytes:
        limit = self.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise GatewayError(413, f"request body of {int(declared)} bytes is over this gateway's limit of {limit} bytes")
        message = await receive()
        body = message.get("body", b"")
        if not message.get("more_body", False) and len(body) <= limit:
            return bytes(body)  # the usual case: the whole body in one message, no copy
        buf = bytearray(body)
        while True:
            if len(buf) > limit:
                raise GatewayError(413, f"request body is over this gateway's limit of {limit} bytes")
            if not message.get("more_body", False):
                return bytes(buf)
            message = await receive()
            if message["type"] != "http.request":
                raise GatewayError(400, "the client closed the connection before sending the whole body")
            buf += message.get("body", b"")

    async def _models(self, request: Request) -> Response:
        try:
            self._authorize(request.path_params["rid"], presented_token(request))
        except GatewayError as exc:
            return error_response(exc, "openai")
        names = [self.router.default_model] if self.router.default_model else []
        names += [f"{n}/{u.default_model}" for n, u in self.router.upstreams.items() if u.default_model]
        data = [{"id": n, "object": "model", "created": 0, "owned_by": n.split("/", 1)[0]} for n in dict.fromkeys(names)]
        return json_response(200, {"object": "list", "data": data})

    async def _reward(self, request: Request) -> Response:
        rollout_id = request.path_params["rid"]
        try:
            self._authorize(rollout_id, presented_token(request))
            body = await read_json_object(request, 2**20)
            try:
                value = check_reward(body.get("reward"))
            except ValueError as exc:
                raise GatewayError(400, f"`reward` is unusable: {exc}", param="reward") from None
            detail = body.get("detail")
            if detail is not None and not isinstance(detail, dict):
                raise GatewayError(400, "`detail` must be a JSON object when given", param="detail")
        except GatewayError as exc:
            return error_response(exc, "openai")
        await self.writer.call(lambda store: store.report_reward(rollout_id, value, detail))
        return json_response(200, {"ok": True, "rollout_id": rollout_id, "reward": value})

    async def _health(self, request: Request) -> Response:
        return json_response(200, {"ok": True})


def _unpriced(upstream: str, model: str) -> GatewayError:
    """Under a budget in USD, a call whose cost could not be counted would make the ceiling a guess: refused."""
    return GatewayError(
        400,
        f"model {upstream}/{model} has no price, so agl cannot count it against the budget: declare it in agl.yaml, "
        f"e.g. prices: {{{upstream}/{model}: {{input: 0.5, output: 1.5}}}} (USD per 1M tokens), or mark the upstream "
        "`free: true`",
        param="model",
        code="model_unpriced",
    )


def start_gateway(gateway: Gateway, host: str = "127.0.0.1", port: int = 0, *,
                  request_timeout_s: float = REQUEST_TIMEOUT_S) -> ServerThread:
    """Serve the gateway on a background thread; returns the started server (its .base_url). A request's head, and
    each pause in its body, may take `request_timeout_s` at most (http_guard.py)."""
    if not is_loopback_host(host) and not gateway.admin_token:
        raise ValueError(
            f"refusing to serve the gateway on {host!r}: beyond loopback it needs an admin token "
            "(Gateway(..., admin_token=...))"
        )
    server = ServerThread(gateway.app, host, port, http=guarded(request_timeout_s)).start()
    gateway.base_url = server.base_url
    return server
