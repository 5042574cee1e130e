"""The gateway's admin HTTP endpoints, for a trainer or controller in another process (behind the admin token).

- `POST /admin/pause` {drain_timeout_s?, hold_s?}: new calls get 429 + Retry-After (with `hold_s`, they first wait
  up to that long for the resume); waits up to the drain timeout for calls in flight to finish and says whether they
  did (`drained`).
- `POST /admin/resume` {model_version?}: calls flow again; later records carry the new model version.
- `GET /admin/state`: paused, in flight, calls started and recorded, rollouts registered.
- `POST /admin/rollouts` {rollout_id, knobs?} -> {token, openai_base_url, anthropic_base_url, reward_url,
  registered_at}: admit a rollout (idempotent: the same id with the same knobs gets the same token back; other knobs
  are a 409). `registered_at` is this gateway's clock, for `since` below.
- `PUT /admin/upstreams/<name>/endpoints` {base_urls, model?}: where the servers of the policy being trained are
  (verl's rollout replicas, known only once the trainer has started them); 400 for an upstream that does not take
  registered endpoints.
- `DELETE /admin/rollouts/<rid>`: the rollout's token stops working (its calls already in flight finish); 404 when it
  is not registered.
- `GET /admin/rollouts/<rid>/calls[?since=<epoch s>]` -> {rollout_id, calls, reward}: the rollout's recorded calls
  (CallRecords as JSON, in the order they were recorded) and the reward its agent posted ({reward, detail} or null),
  so a trainer in another process can copy them into its own run store. Registered or not: a rollout that ended,
  or made no call, has `calls: []`. Rollout ids are not unique across runs (they are derived from the task), so
  `since` (the `registered_at` of this attempt) leaves out what an earlier run recorded under the same id.

Without the admin token (`Authorization: Bearer <token>`, the AGL_GATEWAY_ADMIN_TOKEN the gateway was started with)
every admin endpoint answers 401; a gateway started without one answers 403.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rl_backend.gateway.errors import GatewayError, error_response, json_response
from rl_backend.gateway.exchange import check_optional
from rl_backend.gateway.httpio import presented_token, read_json_object
from rl_backend.gateway.ids import check_rollout_id
from rl_backend.gateway.knobs import validate_knobs
from rl_backend.gateway.proxy import GatewayState
from rl_backend.store.db import RunStore


class RolloutGrant(Protocol):
    token: str
    knobs: dict[str, Any]


T = TypeVar("T")


class StoreQueue(Protocol):
    async def call(self, fn: Callable[[RunStore], T]) -> T: ...


class AdminTarget(Protocol):
    """What these endpoints drive: the gateway (app.py), as far as its admin side goes."""

    @property
    def admin_token(self) -> str | None: ...
    @property
    def state(self) -> GatewayState: ...
    @property
    def writer(self) -> StoreQueue: ...

    def pause(self, hold_s: float = 0.0) -> None: ...
    def resume(self, model_version: str | None = None) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def rollout_entry(self, rollout_id: str) -> RolloutGrant | None: ...
    def register_rollout(self, rollout_id: str, knobs: dict[str, Any] | None = None) -> str: ...
    def unregister_rollout(self, rollout_id: str) -> None: ...
    def set_endpoints(self, upstream: str, base_urls: list[str], model: str | None = None) -> None: ...


def _path_id(rollout_id: str) -> None:
    try:
        check_rollout_id(rollout_id)
    except ValueError as exc:
        raise GatewayError(400, str(exc), param="rollout_id") from None


class AdminAPI:
    def __init__(self, gateway: AdminTarget) -> None:
        self.gateway = gateway
        self._registered_at: dict[str, float] = {}  # by rollout id, for a retried registration's answer

    def routes(self) -> list[Route]:
        return [
            Route("/admin/pause", self.pause, methods=["POST"]),
            Route("/admin/resume", self.resume, methods=["POST"]),
            Route("/admin/state", self.state, methods=["GET"]),
            Route("/admin/rollouts", self.register, methods=["POST"]),
            Route("/admin/rollouts/{rid}", self.unregister, methods=["DELETE"]),
            Route("/admin/rollouts/{rid}/calls", self.calls, methods=["GET"]),
            Route("/admin/upstreams/{name}/endpoints", self.endpoints, methods=["PUT"]),
        ]

    def _guard(self, request: Request) -> None:
        admin_token = self.gateway.admin_token
        if admin_token is None:
            raise GatewayError(403, "admin endpoints are off: this gateway was started without an admin token")
        token = presented_token(request)
        if token is None or not hmac.compare_digest(token.encode(), admin_token.encode()):
            raise GatewayError(
                401,
                "admin endpoints need `Authorization: Bearer <admin token>`, the token this gateway was started "
                "with ($AGL_GATEWAY_ADMIN_TOKEN or --admin-token)" + (" (that one is wrong)" if token else ""),
            )

    async def _body(self, request: Request) -> dict[str, Any]:
        if request.headers.get("content-length") in (None, "0") and "transfer-encoding" not in request.headers:
            return {}
        return await read_json_object(request, 2**16)

    async def pause(self, request: Request) -> Response:
        gw = self.gateway
        try:
            self._guard(request)
            body = await self._body(request)
            check_optional(body, "drain_timeout_s", "number")
            check_optional(body, "hold_s", "number")
        except GatewayError as exc:
            return error_response(exc, "openai")
        gw.pause(hold_s=float(body.get("hold_s") or 0.0))
        drained = gw.state.in_flight == 0
        timeout = body.get("drain_timeout_s")
        if timeout:
            with anyio.move_on_after(float(timeout)):
                while gw.state.in_flight > 0:
                    await asyncio.sleep(0.005)
            drained = gw.state.in_flight == 0
        return json_response(200, {**gw.state_dict(), "drained": drained})

    async def resume(self, request: Request) -> Response:
        try:
            self._guard(request)
            body = await self._body(request)
            check_optional(body, "model_version", "string")
        except GatewayError as exc:
            return error_response(exc, "openai")
        self.gateway.resume(body.get("model_version"))
        return json_response(200, self.gateway.state_dict())

    async def state(self, request: Request) -> Response:
        try:
            self._guard(request)
        except GatewayError as exc:
            return error_response(exc, "openai")
        return json_response(200, self.gateway.state_dict())

    async def register(self, request: Request) -> Response:
        gw = self.gateway
        try:
            self._guard(request)
            body = await self._body(request)
            rollout_id = body.get("rollout_id")
            try:
                check_rollout_id(rollout_id)
            except ValueError as exc:
                raise GatewayError(400, str(exc), param="rollout_id") from None
            assert isinstance(rollout_id, str)
            check_optional(body, "knobs", "object")
            knobs = body.get("knobs") or {}
            existing = gw.rollout_entry(rollout_id)
            if existing is not None:
                # A controller that retries after a lost answer gets the same token; different knobs are a bug.
                try:
                    same = validate_knobs(knobs) == existing.knobs
                except ValueError:
                    same = False
                if not same:
                    raise GatewayError(
                        409, f"rollout {rollout_id!r} is already registered with other knobs; DELETE it first",
                        code="rollout_exists",
                    )
                token, status = existing.token, 200
            else:
                try:
                    token = gw.register_rollout(rollout_id, knobs)
                except ValueError as exc:
                    raise GatewayError(400, str(exc), param="knobs") from None
                status = 201
                self._registered_at[rollout_id] = time.time()
        except GatewayError as exc:
            return error_response(exc, "openai")
        base = str(request.base_url).rstrip("/") + f"/rollouts/{rollout_id}"
        return json_response(
            status,
            {
                "rollout_id": rollout_id,
                "token": token,
                "openai_base_url": f"{base}/openai/v1",
                "anthropic_base_url": f"{base}/anthropic",
                "reward_url": f"{base}/reward",
                "registered_at": self._registered_at.get(rollout_id),
            },
        )

    async def endpoints(self, request: Request) -> Response:
        try:
            self._guard(request)
            body = await self._body(request)
            urls = body.get("base_urls")
            if (not isinstance(urls, list) or not urls or len(urls) > 1024
                    or not all(isinstance(u, str) and u.startswith(("http://", "https://")) and len(u) < 2048
                               for u in urls)):
                raise GatewayError(400, "`base_urls` must be a non-empty list of http(s) URLs", param="base_urls")
            check_optional(body, "model", "string")
            try:
                self.gateway.set_endpoints(request.path_params["name"], list(urls), body.get("model"))
            except ValueError as exc:
                raise GatewayError(400, str(exc), param="name") from None
        except GatewayError as exc:
            return error_response(exc, "openai")
        return json_response(200, {"upstream": request.path_params["name"], "base_urls": urls,
                                   "model": body.get("model")})

    async def unregister(self, request: Request) -> Response:
        rollout_id = request.path_params["rid"]
        try:
            self._guard(request)
            _path_id(rollout_id)
            if self.gateway.rollout_entry(rollout_id) is None:
                raise GatewayError(404, f"rollout {rollout_id!r} is not registered", code="rollout_not_found")
        except GatewayError as exc:
            return error_response(exc, "openai")
        self.gateway.unregister_rollout(rollout_id)
        self._registered_at.pop(rollout_id, None)
        return json_response(200, {"ok": True, "rollout_id": rollout_id})

    async def calls(self, request: Request) -> Response:
        rollout_id = request.path_params["rid"]
        try:
            self._guard(request)
            _path_id(rollout_id)
            text = request.query_params.get("since")
            try:
                since = float(text) if text is not None else None
            except ValueError:
                since = math.nan
            if since is not None and not math.isfinite(since):
                raise GatewayError(400, f"`since` must be a time in seconds since the epoch, got {text!r}", param="since")
        except GatewayError as exc:
            return error_response(exc, "openai")

        def read(store: RunStore) -> dict[str, Any]:
            calls = [c for c in store.calls(rollout_id) if since is None or c.started_at >= since]
            reward = store.reported_reward(rollout_id, since=since)
            return {
                "rollout_id": rollout_id,
                "calls": [c.model_dump(mode="json") for c in calls],
                "reward": None if reward is None else {"reward": reward[0], "detail": reward[1]},
            }

        # On the writer's thread, after every record queued before this request: nothing recorded is left out, and
        # reading a long rollout from SQLite does not stall the event loop.
        return json_response(200, await self.gateway.writer.call(read))
