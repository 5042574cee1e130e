"""Watching a run's Jobs, and pacing their creation.

One list+watch per controller (not one per rollout): a thousand rollouts cost one long-lived request. It runs on
its own thread because the official client is blocking, and hands every event to the event loop. The protocol is
the informer's: list (which gives a resourceVersion), watch from that version, resume from the last version seen
when the stream ends or drops, relist when the server answers 410 Gone (the version is too old) and, as a safety
net, every `resync_s`. Each list is reported whole, so the controller can notice Jobs that vanished unseen.

Selection is by the run's label, and checked again on each object: a server that ignores the label selector
(the in-memory test server does) must not mix runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 10.0
READ_SLACK_S = 30.0  # past the server-side watch timeout, before the client gives up on a silent stream


class TokenBucket:
    """At most `rate` acquisitions per second on average, `burst` at once; waiters are served in order."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.updated = clock()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = self.clock()
                self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.rate)
                self.updated = now
                if self.tokens >= 1.0:
                    self.tokens -= 1.0
                    return
                await asyncio.sleep((1.0 - self.tokens) / self.rate)


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): only a fresh list can continue."""


def labels_match(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return str(value) if value else None


class JobWatcher:
    """List+watch of the Jobs carrying `selector` in `namespace`, reporting to callbacks on `loop`:
    `on_event(type, job)` for ADDED/MODIFIED/DELETED, `on_list(jobs, started)` for each full list, where
    `started` is the monotonic time the list request began."""

    def __init__(
        self,
        batch: Any,
        namespace: str,
        selector: Mapping[str, str],
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[str, dict[str, Any]], None],
        on_list: Callable[[list[dict[str, Any]], float], None],
        *,
        watch_timeout_s: int = 300,
        resync_s: float = 300.0,
        read_slack_s: float = READ_SLACK_S,
        backoff_max_s: float = 10.0,
    ) -> None:
        self.batch, self.namespace, self.selector = batch, namespace, dict(selector)
        self.label_selector = ",".join(f"{k}={v}" for k, v in self.selector.items())
        self.loop, self.on_event, self.on_list = loop, on_event, on_list
        # A watch ends at its server-side timeout at the latest by the next resync, which then relists.
        self.watch_timeout_s = max(1, min(watch_timeout_s, math.ceil(resync_s)))
        self.resync_s, self.read_slack_s, self.backoff_max_s = resync_s, read_slack_s, backoff_max_s
        self.resource_version: str | None = None
        self.listed_at = 0.0
        # Counters, for diagnostics and tests.
        self.lists = self.watches = self.gone = self.errors = 0
        self._stopping = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agl-k8s-watch", daemon=True)
        self._thread.start()

    def stop(self, join_s: float = 5.0) -> None:
        self._stopping.set()
        response = self._response
        if response is not None:
            # Unblocks the thread's read from here (urllib3 >= 2.3 has shutdown() for exactly this).
            with contextlib.suppress(Exception):  # a half-closed socket is fine, we are leaving
                (getattr(response, "shutdown", None) or response.close)()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(join_s)

    # -- the thread ------------------------------------------------------------------------------------------------

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stopping.set()

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        failures = 0
        while not self._stopping.is_set():
            try:
                if self.resource_version is None or time.monotonic() - self.listed_at >= self.resync_s:
                    self._list()
                self._watch()
                failures = 0
            except _Gone:
                self.gone += 1
                self.resource_version = None
            except Exception as exc:  # noqa: BLE001 - any failure of the stream: back off, resume
                if self._stopping.is_set():
                    break
                if isinstance(exc, ApiException) and exc.status == 410:
                    self.gone += 1
                    self.resource_version = None
                    continue
                self.errors += 1
                failures += 1
                log.debug("job watch dropped (%s), resuming from %s", exc, self.resource_version)
                self._stopping.wait(min(self.backoff_max_s, 0.2 * 2 ** min(failures, 6)))

    def _list(self) -> None:
        started = time.monotonic()
        response = self.batch.list_namespaced_job(
            self.namespace, label_selector=self.label_selector, _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT_S, 60.0),
        )
        data = json.loads(response.data)
        self.lists += 1
        self.listed_at = started
        self.resource_version = _resource_version(data) or self.resource_version or ""
        jobs = [job for job in data.get("items") or [] if labels_match(job, self.selector)]
        self._post(self.on_list, jobs, started)

    def _watch(self) -> None:
        kwargs: dict[str, Any] = {
            "label_selector": self.label_selector, "watch": True, "allow_watch_bookmarks": True,
            "timeout_seconds": self.watch_timeout_s, "_preload_content": False,
            "_request_timeout": (CONNECT_TIMEOUT_S, self.watch_timeout_s + self.read_slack_s),
        }
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version
        response = self.batch.list_namespaced_job(self.namespace, **kwargs)
        self._response = response
        self.watches += 1
        try:
            pending = b""
            for chunk in response.stream(None, decode_content=True):
                if self._stopping.is_set():
                    return
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.strip():
                        self._event(json.loads(line))
            if pending.strip() and not self._stopping.is_set():  # a last event without its newline
                self._event(json.loads(pending))
        finally:
            self._response = None
            response.release_conn()

    def _event(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone(obj.get("message"))
            raise RuntimeError(f"watch error: {obj.get('message') or obj}")
        version = _resource_version(obj)
        if version:
            self.resource_version = version
        if kind in {"ADDED", "MODIFIED", "DELETED"} and labels_match(obj, self.selector):
            self._post(self.on_event, str(kind), obj)
