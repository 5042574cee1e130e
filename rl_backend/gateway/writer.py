"""The store writer: one thread that owns every write the gateway makes, so the event loop never waits on SQLite.

Group commit: records submitted during one turn of the event loop travel to the writer thread together (one queue
hand-off, not one per record), the thread commits whatever has queued up in one transaction, and wakes the loop
once per batch to resolve every `write()` in it. A coroutine that must know its record is durable awaits
`write()`, which resolves when the transaction holding it has committed.

One exception, for latency: a call that is alone in the gateway (nothing else in flight, the writer idle) commits
its record right on the event loop, through a second connection that never waits for SQLite's lock (busy means:
queue it as usual). That saves the two thread hand-offs, a few hundred microseconds on a busy machine, when nobody
else would have used the loop meanwhile; under concurrency, group commit is cheaper and is what happens.

Rows are encoded here, off the event loop, by the store's own codec (rl_backend.store.codec, the one the store reads
them back with), and secrets (upstream keys, rollout tokens) an agent echoed into a request or an upstream into a
response are redacted from that text before it reaches the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from rl_backend.store.codec import INSERT_CALL, encode_call
from rl_backend.store.db import RunStore
from rl_backend.store.records import CallRecord

log = logging.getLogger(__name__)

T = TypeVar("T")
_STOP = object()


class _Item:
    """One record to store; `fut` (on `loop`) learns when it is committed."""

    __slots__ = ("record", "secrets", "loop", "fut")

    def __init__(self, record: CallRecord, secrets: Sequence[str], loop: asyncio.AbstractEventLoop | None,
                 fut: asyncio.Future[None] | None) -> None:
        self.record = record
        self.secrets = secrets
        self.loop = loop
        self.fut = fut


class _Job:
    __slots__ = ("fn", "done")

    def __init__(self, fn: Callable[[RunStore], Any], done: Callable[[Any, BaseException | None], None]) -> None:
        self.fn = fn
        self.done = done


def _settle(futures: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    for fut in futures:
        if not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)


class RecordWriter:
    def __init__(self, store: RunStore, *, max_batch: int = 512) -> None:
        self.store = store
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending: list[_Item] = []  # gathered on the event loop during one turn of it
        self._pending_loop: asyncio.AbstractEventLoop | None = None
        self._busy = False  # the writer thread is committing
        self._inline: sqlite3.Connection | None = None  # the event loop's own connection, for calls alone
        # A second connection only sees the same data in a database file.
        self._inline_broken = str(store.path) in ("", ":memory:") or str(store.path).startswith("file:")
        self._written_thread = 0
        self._written_inline = 0
        self.failed = 0

    @property
    def written(self) -> int:
        """Records committed so far."""
        return self._written_thread + self._written_inline

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="agl-gateway-writer", daemon=True)
                self._thread.start()

    # -- producers ------------------------------------------------------------------------------------------------

    def submit(self, record: CallRecord, secrets: Sequence[str] = ()) -> None:
        """Queue a record without waiting for it (from any thread; never blocks)."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        item = _Item(record, secrets, loop, None)
        if loop is None:
            self.start()
            self._queue.put([item])
        else:
            self._gather(loop, item)

    async def write(self, record: CallRecord, secrets: Sequence[str] = (), *, alone: bool = False) -> None:
        """Queue a record and wait until it is committed (raises if the store refused it). `alone`: no other call
        is in flight, so committing right here, on the event loop, costs nobody anything (see the module doc)."""
        if alone and self._commit_inline(record, secrets):
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._gather(loop, _Item(record, secrets, loop, fut))
        await fut

    def _gather(self, loop: asyncio.AbstractEventLoop, item: _Item) -> None:
        if not self._pending:
            if self._thread is None:
                self.start()
            self._pending_loop = loop
            loop.call_soon(self._hand_over)
        elif loop is not self._pending_loop:  # a second loop (tests): hand over what we have, start anew
            self._hand_over()
            self._pending_loop = loop
            loop.call_soon(self._hand_over)
        self._pending.append(item)

    def _commit_inline(self, record: CallRecord, secrets: Sequence[str]) -> bool:
        if self._pending or self._busy or self._inline_broken or not self._queue.empty():
            return False
        conn = self._inline
        try:
            if conn is None:
                # timeout=0: never wait on the loop for a lock another connection holds.
                conn = sqlite3.connect(self.store.path, timeout=0, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA synchronous=NORMAL")  # as RunStore: committed rows survive a kill -9
                self._inline = conn
            row = encode_call(record, secrets)
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return False  # busy (another writer holds the lock) or no second connection: queue it instead
        try:
            conn.execute(INSERT_CALL, row)
            conn.execute("COMMIT")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._inline_broken = True  # something other than a lock: let the writer thread log it, always
            return False
        self._written_inline += 1
        return True

    def _hand_over(self) -> None:
        if self._pending:
            batch, self._pending = self._pending, []
            self._queue.put(batch)

    async def call(self, fn: Callable[[RunStore], T]) -> T:
        """Run fn(store) on the writer thread, in order with the records queued before it."""
        self.start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._hand_over()

        def done(result: Any, exc: BaseException | None) -> None:
            def settle() -> None:
                if not fut.done():
                    fut.set_result(result) if exc is None else fut.set_exception(exc)

            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(settle)

        self._queue.put(_Job(fn, done))
        result: T = await fut
        return result

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Block until everything queued before this call is committed; False on timeout. Not on the loop."""
        if self._thread is None or not self._thread.is_alive():
            return True
        event = threading.Event()
        job = _Job(lambda _store: None, lambda _r, _e: event.set())
        loop = self._pending_loop
        try:
            if loop is None or not loop.is_running() or asyncio._get_running_loop() is loop:
                self._hand_over()
                raise RuntimeError
            # Records gathered on the loop but not yet handed over must go first: queue the marker from the loop.
            def behind_pending() -> None:
                self._hand_over()
                self._queue.put(job)

            loop.call_soon_threadsafe(behind_pending)
        except RuntimeError:
            self._queue.put(job)
        return event.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        self._hand_over()
        with self._lock:
            thread = self._thread
            self._thread = None
        if thread is not None and thread.is_alive():
            self._queue.put(_STOP)
            thread.join(timeout_s)
        inline, self._inline = self._inline, None
        if inline is not None:
            inline.close()

    # -- the writer thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, _Job):
                self._run_job(item)
                continue
            self._busy = True
            batch: list[_Item] = list(item)
            pending: Any = None
            # Take what else has queued meanwhile into the same transaction: under load one commit serves many calls.
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(nxt, list):
                    batch.extend(nxt)
                else:
                    pending = nxt
                    break
            self._commit(batch)
            self._busy = False
            if pending is _STOP:
                return
            if pending is not None:
                self._run_job(pending)

    def _commit(self, batch: list[_Item]) -> None:
        errors: list[BaseException | None] = []
        try:
            self.store.insert_call_rows([encode_call(i.record, i.secrets) for i in batch])
            errors = [None] * len(batch)
            self._written_thread += len(batch)
        except Exception:
            # One bad row must not lose its neighbours: retry them one by one.
            log.exception("gateway: batch insert of %d calls failed; retrying one by one", len(batch))
            for item in batch:
                try:
                    self.store.insert_call_rows([encode_call(item.record, item.secrets)])
                except Exception as exc:
                    self.failed += 1
                    log.exception("gateway: could not store call %s", item.record.call_id)
                    errors.append(exc)
                else:
                    self._written_thread += 1
                    errors.append(None)
        self._notify(batch, errors)

    @staticmethod
    def _notify(batch: list[_Item], errors: list[BaseException | None]) -> None:
        """One wake-up per event loop per outcome, however many records the batch held."""
        by_loop: dict[tuple[asyncio.AbstractEventLoop, BaseException | None], list[asyncio.Future[None]]] = {}
        for item, exc in zip(batch, errors, strict=True):
            if item.fut is not None and item.loop is not None:
                by_loop.setdefault((item.loop, exc), []).append(item.fut)
        for (loop, exc), futures in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop closed while we committed: nobody waits
                loop.call_soon_threadsafe(_settle, futures, exc)

    def _run_job(self, job: _Job) -> None:
        try:
            result = job.fn(self.store)
        except Exception as exc:
            job.done(None, exc)
            return
        job.done(result, None)
