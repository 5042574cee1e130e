"""A gateway in another process (`agl gateway serve`, the Deployment `agl train --on kubernetes` makes), driven over
its admin API (admin.py) with the subset of `Gateway` that the rollout runner and the training loops use.

Rollouts are registered and unregistered over HTTP, pause/resume/wait_idle map onto /admin/pause, /admin/resume and
/admin/state, and `copy_rollout` brings a finished rollout's calls and posted reward into the caller's own run store:
the remote gateway records them in its store, and reports, trajectories and the cost ledger read the local one.

Every failure is a RemoteGatewayError that names what to fix: the URL ($AGL_GATEWAY_URL) or the admin token
($AGL_GATEWAY_ADMIN_TOKEN).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from rl_backend.store.db import RunStore
from rl_backend.store.records import CallRecord

URL_ENV = "AGL_GATEWAY_URL"
TOKEN_ENV = "AGL_GATEWAY_ADMIN_TOKEN"


class RemoteGatewayError(RuntimeError):
    """The remote gateway could not be used; `hint` says what to change."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class RemoteGateway:
    """The admin-API client. Thread-safe (one httpx.Client); the runner calls it from its event loop's thread."""

    # A remote gateway enforces no budget for this process: `budget.usd` is checked between rollouts instead.
    spend_limit = None

    def __init__(self, url: str, admin_token: str, *, timeout_s: float = 30.0) -> None:
        self.base_url = url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.base_url, headers={"authorization": f"Bearer {admin_token}"}, timeout=timeout_s,
        )
        # This gateway's clock when each rollout was registered: its calls are those recorded since then.
        self._registered_at: dict[str, float] = {}

    def close(self) -> None:
        self._client.close()

    # -- HTTP --------------------------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, ok: tuple[int, ...] = (200,), **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RemoteGatewayError(
                f"cannot reach the gateway at {self.base_url} (${URL_ENV}): {type(exc).__name__}: {exc}",
                hint=f"check that `agl gateway serve` runs there and that ${URL_ENV} is its address "
                     f"(unset ${URL_ENV} to start a gateway in this process)",
            ) from None
        if response.status_code in ok:
            return response
        message = _error_message(response)
        if response.status_code in (401, 403):
            raise RemoteGatewayError(
                f"the gateway at {self.base_url} refused the admin token: {message}",
                hint=f"set ${TOKEN_ENV} to the admin token that gateway was started with",
            )
        raise RemoteGatewayError(
            f"{method} {self.base_url}{path} answered {response.status_code}: {message}"
        )

    def state(self) -> dict[str, Any]:
        """GET /admin/state; also the check that the URL and the token are right."""
        result: dict[str, Any] = self._request("GET", "/admin/state").json()
        return result

    # -- rollouts ----------------------------------------------------------------------------------------------------

    def register_rollout(self, rollout_id: str, knobs: dict[str, Any] | None = None) -> str:
        """Admit a rollout; returns its token. Raises ValueError for knobs the gateway refuses (as Gateway does)."""
        response = self._request("POST", "/admin/rollouts", ok=(200, 201, 400),
                                 json={"rollout_id": rollout_id, "knobs": knobs or {}})
        body = response.json()
        if response.status_code == 400:
            raise ValueError(_error_message(response))
        # A gateway without `registered_at` (an older agl): fall back to this clock, a little early to be safe.
        registered_at = body.get("registered_at")
        self._registered_at[rollout_id] = float(registered_at) if registered_at is not None else time.time() - 5.0
        return str(body["token"])

    def unregister_rollout(self, rollout_id: str) -> None:
        self._request("DELETE", f"/admin/rollouts/{rollout_id}", ok=(200, 404))  # 404: already gone

    def fetch_rollout(self, rollout_id: str) -> tuple[list[CallRecord], tuple[float, dict[str, Any] | None] | None]:
        """The calls this process's registration of `rollout_id` recorded, and the reward its agent posted."""
        since = self._registered_at.get(rollout_id)
        params = {"since": repr(since)} if since is not None else None
        body = self._request("GET", f"/admin/rollouts/{rollout_id}/calls", params=params).json()
        calls = [CallRecord.model_validate(doc) for doc in body.get("calls") or []]
        reward = body.get("reward")
        return calls, (None if reward is None else (float(reward["reward"]), reward.get("detail")))

    def fetch_calls(self, rollout_id: str) -> list[CallRecord]:
        return self.fetch_rollout(rollout_id)[0]

    def copy_rollout(self, rollout_id: str, store: RunStore) -> int:
        """Copy the rollout's calls and posted reward into `store` (idempotent: call ids already there are skipped);
        returns the number of calls."""
        calls, reward = self.fetch_rollout(rollout_id)
        store.insert_calls(calls)
        if reward is not None:
            store.report_reward(rollout_id, reward[0], reward[1])
        self._registered_at.pop(rollout_id, None)
        return len(calls)

    # -- pause, resume, state (what a training loop's gate uses) -----------------------------------------------------

    def pause(self, hold_s: float = 0.0) -> None:
        self._request("POST", "/admin/pause", json={"hold_s": hold_s})

    def resume(self, model_version: str | None = None) -> None:
        self._request("POST", "/admin/resume", json={} if model_version is None else {"model_version": model_version})

    def set_model_version(self, model_version: str) -> None:
        """Later records carry `model_version` (POST /admin/resume with it; nothing is paused between sync steps)."""
        self.resume(model_version)

    def set_endpoints(self, upstream: str, base_urls: list[str], model: str | None = None) -> None:
        """Where the servers of the policy being trained are (PUT /admin/upstreams/<name>/endpoints); ValueError when
        that gateway's upstream does not take registered endpoints."""
        body: dict[str, Any] = {"base_urls": list(base_urls)}
        if model is not None:
            body["model"] = model
        response = self._request("PUT", f"/admin/upstreams/{upstream}/endpoints", ok=(200, 400), json=body)
        if response.status_code == 400:
            raise ValueError(_error_message(response))

    @property
    def in_flight(self) -> int:
        return int(self.state()["in_flight"])

    @property
    def calls_held(self) -> int:
        return int(self.state().get("calls_held") or 0)  # 0 from a gateway that does not report it

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Block until no call is in flight on the gateway; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def flush(self, timeout_s: float = 30.0) -> bool:
        return True  # the calls endpoint reads after every record queued before it: nothing to wait for here


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except ValueError:
        error = None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return response.text[:300] or response.reason_phrase


def from_environment(environ: dict[str, str]) -> RemoteGateway | None:
    """The gateway $AGL_GATEWAY_URL names (with $AGL_GATEWAY_ADMIN_TOKEN), checked; None when the URL is not set."""
    url = environ.get(URL_ENV, "").strip()
    if not url:
        return None
    token = environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise RemoteGatewayError(
            f"${URL_ENV} is set ({url}) but ${TOKEN_ENV} is not: the gateway's admin API needs its admin token",
            hint=f"export {TOKEN_ENV}=<the token the gateway was started with>, or unset {URL_ENV}",
        )
    if not url.startswith(("http://", "https://")):
        raise RemoteGatewayError(f"${URL_ENV} must be an http(s) URL, got {url!r}",
                                 hint="e.g. http://agl-gateway.default.svc:8090")
    gateway = RemoteGateway(url, token)
    try:
        gateway.state()
    except RemoteGatewayError:
        gateway.close()
        raise
    return gateway
