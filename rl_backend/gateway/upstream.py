"""The gateway's side of upstream HTTP: pooled keep-alive connections, timeouts, and retries before the agent sees
a byte. An upstream's `timeout_s` is the call's deadline, retries and the answer's last byte included (a stream that
never ends is cut there); `idle_timeout_s` (default: `timeout_s`) bounds each silence.

`open()` returns an upstream response whose head has arrived and whose body is still unread, so a stream can be
passed on as it comes. Connect failures, a connection that closed before answering, 408/409/429 and 5xx are
retried with capped, jittered exponential backoff (honouring Retry-After); once `open()` has returned, nothing is
retried, because bytes may reach the agent.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rl_backend.gateway.h1client import DeadlinePassed, H1Pool, HTTPError, ReadTimeout
from rl_backend.gateway.routing import Route
from rl_backend.gateway.transport import Transport, UpstreamResponse

RETRYABLE_STATUS = frozenset({408, 409, 429, *range(500, 600)})
# Before the response head, any failure (no connection, closed unanswered, bad HTTP) means no server answered this
# request properly: safe to try again, on the next replica if this one cannot be reached. (A read timeout is not.)
_CONNECT_ERRORS = (HTTPError,)


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
    response: UpstreamResponse
    attempts: int
    url: str


def retry_after_s(response: Any) -> float | None:
    """Seconds the upstream asked us to wait (Retry-After-Ms, or Retry-After in seconds or as a date)."""
    headers: Mapping[str, str] = response.headers
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
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


def close_quietly(response: UpstreamResponse) -> None:
    """Close an upstream response; one not read to its end closes its connection, which cancels the upstream work."""
    response.close()


class UpstreamClient:
    """Pooled upstream connections shared by all calls (created in the serving loop, which owns them); an upstream
    with a transport of its own (served in-process) is reached through that instead, with the same retries."""

    def __init__(self, retry: RetryPolicy | None = None, *, keepalive_s: float = 5.0) -> None:
        self.retry = retry or RetryPolicy()
        self._keepalive_s = keepalive_s
        self._pool: H1Pool | None = None

    async def start(self) -> None:
        if self._pool is None:
            self._pool = H1Pool(keepalive_s=self._keepalive_s)

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()

    @property
    def connections_opened(self) -> int:
        return self._pool.opened if self._pool is not None else 0

    @property
    def pool(self) -> H1Pool:
        if self._pool is None:
            raise RuntimeError("the gateway's upstream client is not started (is the app running under a server?)")
        return self._pool

    async def open(self, route: Route, path: str, body: bytes, headers: dict[str, str]) -> Opened:
        """The upstream's response, its head in. The call's deadline (`timeout_s` from now) covers the retries and
        goes with the response, whose body must have ended by then too; `idle_timeout_s` bounds each silence."""
        upstream = route.upstream
        urls = upstream.base_urls
        idle = upstream.idle_timeout_s or upstream.timeout_s
        deadline = time.monotonic() + upstream.timeout_s
        connect_failures = 0
        attempt = 0
        transport: Transport = upstream.transport if upstream.transport is not None else self.pool
        while True:
            attempt += 1
            # Stay on the rollout's replica; move to the next only when this one cannot be reached at all.
            url = urls[(route.replica + connect_failures) % len(urls)].rstrip("/") + path
            left = deadline - time.monotonic()
            if left <= 0:
                raise UpstreamUnavailable(504, _late(upstream.name, upstream.timeout_s, url, attempt - 1))
            try:
                response = await transport.post(url, headers, body, timeout=idle, deadline=deadline,
                                                connect_timeout=min(self.retry.connect_timeout_s, idle, left))
            except DeadlinePassed as exc:
                raise UpstreamUnavailable(504, _late(upstream.name, upstream.timeout_s, url, attempt)) from exc
            except ReadTimeout as exc:
                raise UpstreamUnavailable(
                    504, f"upstream {upstream.name!r} sent nothing for {idle:g} s ({url})"
                ) from exc
            except _CONNECT_ERRORS as exc:
                connect_failures += 1
                if attempt >= self.retry.max_attempts:
                    raise UpstreamUnavailable(
                        502,
                        f"upstream {upstream.name!r} could not be reached at {url} after {attempt} attempts: "
                        f"{type(exc).__name__}: {exc}",
                    ) from exc
                await asyncio.sleep(min(self.retry.backoff(attempt), max(deadline - time.monotonic(), 0.0)))
                continue
            if response.status_code in RETRYABLE_STATUS and attempt < self.retry.max_attempts:
                delay = retry_after_s(response)
                if delay is None:
                    delay = self.retry.backoff(attempt)
                elif delay > min(self.retry.retry_after_cap_s, deadline - time.monotonic()):
                    return Opened(response, attempt, url)  # not waited out here: the agent gets the 429
                try:
                    await response.aread()  # read the small error body so the connection can be reused
                except HTTPError:
                    pass  # then close_quietly closes the connection instead
                finally:
                    close_quietly(response)
                await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
                continue
            return Opened(response, attempt, url)


def _late(name: str, timeout_s: float, url: str, attempts: int) -> str:
    tries = f" ({attempts} attempts)" if attempts > 1 else ""
    return f"upstream {name!r} did not answer within its timeout_s of {timeout_s:g} s{tries} ({url})"
