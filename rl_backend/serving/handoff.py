"""Hands the engine thread's outputs to an event loop with one wake-up per decode step, not one per token.

Each streamed token used to cost the loop a wake-up of its own: `call_soon_threadsafe` writes to the loop's
self-pipe, and the loop thread takes the GIL back from the engine thread to run one callback. At 8 streams that is
8 pipe writes, 8 loop iterations and 8 GIL hand-overs per decode step, while the engine waits for the GIL between
its torch calls. A `LoopPost` queues items; the engine puts a whole step's items, then wakes each loop once.
(Waking on the first item is not enough: writing to the self-pipe releases the GIL, so the loop would drain that
item alone before the engine posted the next.)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any


class LoopPost:
    """Runs `fn(item)` on `loop` for items posted from any thread, in posting order, waking the loop once per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: list[tuple[Callable[[Any], None], Any]] = []
        self._lock = threading.Lock()
        self._scheduled = False
        self.wakeups = 0  # drains scheduled so far (what the batching saves is what this does not count)

    def put(self, fn: Callable[[Any], None], item: Any) -> None:
        """Queue `fn(item)` without waking the loop (call `wake` after the batch); raises RuntimeError once the loop
        is closed (nobody is listening any more)."""
        if self.loop.is_closed():
            raise RuntimeError("the event loop is closed")
        with self._lock:
            self._items.append((fn, item))

    def wake(self) -> None:
        """Have the loop run what is queued, unless a drain is already on its way."""
        with self._lock:
            if self._scheduled or not self._items:
                return
            self._scheduled = True
            self.wakeups += 1
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            with self._lock:
                self._scheduled = False
            raise

    def post(self, fn: Callable[[Any], None], item: Any) -> None:
        """`put` and `wake`."""
        self.put(fn, item)
        self.wake()

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for fn, item in items:
            fn(item)
