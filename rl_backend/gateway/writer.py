"""The store writer: one thread that owns every write the gateway makes, so the event loop never waits on SQLite.

Records queue up and are committed in batches (one transaction per batch); a coroutine that must know its record
is durable awaits `write()`, which resolves when the batch holding it has committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from rl_backend.store.db import RunStore
from rl_backend.store.records import CallRecord

log = logging.getLogger(__name__)

T = TypeVar("T")
Done = Callable[[Any, BaseException | None], None]


class _Job:
    __slots__ = ("fn", "done")

    def __init__(self, fn: Callable[[RunStore], Any], done: Done | None) -> None:
        self.fn = fn
        self.done = done


class _Record:
    __slots__ = ("record", "done")

    def __init__(self, record: CallRecord, done: Done | None) -> None:
        self.record = record
        self.done = done


_STOP = object()


def _resolver(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any]) -> Done:
    def resolve(result: Any, exc: BaseException | None) -> None:
        def settle() -> None:
            if fut.done():
                return
            if exc is None:
                fut.set_result(result)
            else:
                fut.set_exception(exc)

        # The loop may have closed while we committed; then nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle)

    return resolve


class RecordWriter:
    def __init__(self, store: RunStore, *, max_batch: int = 256) -> None:
        self.store = store
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.written = 0
        self.failed = 0

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="agl-gateway-writer", daemon=True)
                self._thread.start()

    # -- producers (any thread) ----------------------------------------------------------------------------------

    def submit(self, record: CallRecord, done: Done | None = None) -> None:
        """Queue a record; never blocks."""
        self.start()
        self._queue.put(_Record(record, done))

    async def write(self, record: CallRecord) -> None:
        """Queue a record and wait until it is committed (raises if the store refused it)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self.submit(record, _resolver(loop, fut))
        await fut

    async def call(self, fn: Callable[[RunStore], T]) -> T:
        """Run fn(store) on the writer thread, in order with the records queued before it."""
        self.start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.put(_Job(fn, _resolver(loop, fut)))
        result: T = await fut
        return result

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Block until everything queued before this call is committed; False on timeout."""
        if self._thread is None or not self._thread.is_alive():
            return True
        event = threading.Event()
        self._queue.put(_Job(lambda _store: None, lambda _r, _e: event.set()))
        return event.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        with self._lock:
            thread = self._thread
            self._thread = None
        if thread is not None and thread.is_alive():
            self._queue.put(_STOP)
            thread.join(timeout_s)

    # -- the writer thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, _Job):
                self._run_job(item)
                continue
            batch = [item]
            pending: Any = None
            # Drain what is already queued into the same transaction: under load one commit serves many calls.
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(nxt, _Record):
                    batch.append(nxt)
                else:
                    pending = nxt
                    break
            self._commit(batch)
            if pending is _STOP:
                return
            if pending is not None:
                self._run_job(pending)

    def _commit(self, batch: list[_Record]) -> None:
        try:
            self.store.insert_calls([r.record for r in batch])
        except Exception:
            # One bad row must not lose its neighbours: retry them one by one.
            log.exception("gateway: batch insert of %d calls failed; retrying one by one", len(batch))
            for item in batch:
                try:
                    self.store.insert_call(item.record)
                except Exception as exc:
                    self.failed += 1
                    log.exception("gateway: could not store call %s", item.record.call_id)
                    if item.done is not None:
                        item.done(None, exc)
                else:
                    self.written += 1
                    if item.done is not None:
                        item.done(None, None)
            return
        self.written += len(batch)
        for item in batch:
            if item.done is not None:
                item.done(None, None)

    def _run_job(self, job: _Job) -> None:
        try:
            result = job.fn(self.store)
        except Exception as exc:
            if job.done is not None:
                job.done(None, exc)
            else:
                log.exception("gateway: store job failed")
            return
        if job.done is not None:
            job.done(result, None)
