"""The gateway's side of upstream HTTP: one pooled httpx client, timeouts, and retries before the agent sees a byte.

`open()` returns an upstream response whose headers have arrived and whose body is still unread, so a stream can be
passed on as it comes. Connect failures, 408/409/429 and 5xx are retried with capped, jittered exponential backoff
(honouring Retry-After); once `open()` has returned, nothing is retried, because bytes may reach the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import itertools
import random
import time
from dataclasses import dataclass

import anyio
import httpx

from rl_backend.gateway.routing import Route

RETRYABLE_STATUS = frozenset({408, 409, 429, *range(500, 600)})
# Errors that mean the request never reached a server that answered it: safe to try again.
_CONNECT_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.RemoteProtocolError,  # typically a pooled keep-alive socket the server had closed
    httpx.ReadError,
    httpx.WriteError,
)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    backoff_base_s: float = 0.25
    backoff_cap_s: float = 8.0
    # A Retry-After longer than this is not waited out: the 429 goes back to the agent, whose SDK may wait itself.
    retry_after_cap_s: float = 30.0
    connect_timeout_s: float = 10.0

    def backoff(self, attempt: int) -> float:
        """Delay before attempt `attempt + 1` (attempt counts from 1): exponential, capped, with jitter."""
        ceiling = min(self.backoff_cap_s, self.backoff_base_s * 2 ** (attempt - 1))
        return ceiling * random.uniform(0.5, 1.0)


class UpstreamUnavailable(Exception):
    """No upstream response at all: unreachable (502) or no answer in time (504)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Opened:
    response: httpx.Response
    attempts: int
    url: str


def retry_after_s(response: httpx.Response) -> float | None:
    ms = response.headers.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


async def close_quietly(response: httpx.Response) -> None:
    """Close an upstream response even from a cancelled task (the agent went away): cancels the upstream work."""
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        await response.aclose()


class UpstreamClient:
    """Pooled upstream connections shared by all calls.

    The pool is split over a few httpx clients, used in turn: httpcore scans its whole pool at every request start
    and end, so one pool of N busy connections costs O(N^2) per request wave; shards keep N small.
    """

    def __init__(self, retry: RetryPolicy | None = None, *, max_connections: int = 1024, shards: int = 8) -> None:
        self.retry = retry or RetryPolicy()
        self._max_connections = max_connections
        self._shards = max(1, shards)
        self._clients: list[httpx.AsyncClient] = []
        self._turn = itertools.count()

    async def start(self) -> None:
        # Created inside the serving loop: an httpx client's pool is bound to the loop it first runs in.
        if not self._clients:
            per_shard = max(1, self._max_connections // self._shards)
            tls = httpx.create_ssl_context()  # loading CA certificates takes ~0.1 s: once, for all shards
            self._clients = [
                httpx.AsyncClient(
                    verify=tls,
                    limits=httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard),
                    follow_redirects=False,
                    trust_env=False,  # an HTTP(S)_PROXY meant for the agent must not capture loopback upstreams
                )
                for _ in range(self._shards)
            ]

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()

    @property
    def client(self) -> httpx.AsyncClient:
        if not self._clients:
            raise RuntimeError("the gateway's upstream client is not started (is the app running under a server?)")
        return self._clients[next(self._turn) % len(self._clients)]

    async def open(self, route: Route, path: str, body: bytes, headers: dict[str, str]) -> Opened:
        upstream = route.upstream
        urls = upstream.base_urls
        timeout = httpx.Timeout(upstream.timeout_s, connect=min(self.retry.connect_timeout_s, upstream.timeout_s))
        connect_failures = 0
        attempt = 0
        while True:
            attempt += 1
            # Stay on the rollout's replica; move to the next only when this one cannot be reached at all.
            url = urls[(route.replica + connect_failures) % len(urls)].rstrip("/") + path
            client = self.client
            request = client.build_request("POST", url, content=body, headers=headers, timeout=timeout)
            try:
                response = await client.send(request, stream=True)
            except _CONNECT_ERRORS as exc:
                connect_failures += 1
                if attempt >= self.retry.max_attempts:
                    raise UpstreamUnavailable(
                        502,
                        f"upstream {upstream.name!r} could not be reached at {url} after {attempt} attempts: "
                        f"{type(exc).__name__}: {exc}",
                    ) from exc
                await asyncio.sleep(self.retry.backoff(attempt))
                continue
            except httpx.TimeoutException as exc:
                raise UpstreamUnavailable(
                    504, f"upstream {upstream.name!r} did not answer within {upstream.timeout_s:g} s ({url})"
                ) from exc
            if response.status_code in RETRYABLE_STATUS and attempt < self.retry.max_attempts:
                delay = retry_after_s(response)
                if delay is None:
                    delay = self.retry.backoff(attempt)
                elif delay > self.retry.retry_after_cap_s:
                    return Opened(response, attempt, url)
                try:
                    await response.aread()  # read the small error body so the connection returns to the pool
                except httpx.HTTPError:
                    pass
                finally:
                    await close_quietly(response)
                await asyncio.sleep(delay)
                continue
            return Opened(response, attempt, url)
