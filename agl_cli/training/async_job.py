"""`agl train --loop collocated-async`: the rollout side of the collocated-async loop (rl_backend/trainer/async_loop.py).

`AsyncRollouts` runs the unchanged agent through the same EvalRunner as the sync loop, on an event loop of its own
thread: `concurrency` rollouts in flight at all times, launched group by group (group g: training task g mod n,
`group_size` seeds of its own, so every rollout has a key no earlier attempt used, across resumes too). A group is
handed to the trainer once all its rollouts have finished; groups still running carry over to a later update. No new
group opens while enough finished groups for the next update are waiting, so rollouts never run far ahead of the
policy (that would only make them stale).

`GatewayGate` pauses the gateway around each update: new calls are held until the resume (up to `hold_s`, then 429 +
Retry-After), calls in flight drain first, so the trainer has the device to itself and the weight swap splits no call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agl_cli.evaluation.controllers import run_then_close
from agl_cli.evaluation.runner import EvalRunner, PlannedRollout
from agl_cli.spec.tasks import Task
from agl_cli.spec.variants import Variant
from rl_backend.store.db import RunStore
from rl_backend.store.records import Rollout
from rl_backend.trainer.interfaces import RolloutGroup

log = logging.getLogger(__name__)


def group_number(seed: int | None, group_size: int) -> int:
    return (seed or 0) // group_size


def next_group_number(store: RunStore, variant: str, group_size: int) -> int:
    """The first group number no rollout of `variant` has used: a resumed run never reuses a key."""
    seeds = [r.seed for r in store.rollouts() if r.variant == variant and r.seed is not None]
    return group_number(max(seeds), group_size) + 1 if seeds else 0


def launch_group_of(group_size: int) -> Callable[[Rollout], str]:
    """GRPO groups of the async loop: one launched group (task, seeds g*G..g*G+G-1), not all rollouts of a task,
    so two groups of one task sampled by different model versions keep their own baselines."""
    return lambda r: f"{r.variant}/{r.task_id}/g{group_number(r.seed, group_size)}"


@dataclass
class _Group:
    number: int
    task: Task
    unlaunched: deque[int]
    running: int = 0
    rollout_ids: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.unlaunched and self.running == 0


class AsyncRollouts:
    """A RolloutSource (rl_backend.trainer.interfaces) over an EvalRunner; see the module docstring."""

    def __init__(self, runner: EvalRunner, tasks: list[Task], variant: Variant, *, group_size: int,
                 concurrency: int, groups_per_step: int, first_group: int = 0) -> None:
        if not tasks:
            raise ValueError("no training tasks")
        self.runner, self.tasks, self.variant = runner, tasks, variant
        self.group_size, self.concurrency, self.groups_per_step = group_size, max(1, concurrency), groups_per_step
        self._next_number = first_group
        self._open: deque[_Group] = deque()  # launched, not finished, oldest first
        self._ready: deque[_Group] = deque()  # finished, not handed over
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    # -- the trainer's side (another thread) ------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="agl-async-rollouts", daemon=True)
        self._thread.start()
        self._started.wait(30)

    def next_groups(self, count: int, timeout_s: float | None) -> list[RolloutGroup]:
        with self._cv:
            self._cv.wait_for(lambda: len(self._ready) >= count or self._error is not None, timeout=timeout_s)
            if self._error is not None:
                raise RuntimeError(f"the rollouts stopped: {self._error}") from self._error
            out = [self._ready.popleft() for _ in range(min(count, len(self._ready)))]
        return [RolloutGroup(f"g{g.number}/{g.task.id}", tuple(g.rollout_ids)) for g in out]

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(120)

    # -- the rollouts' side (its own event loop) --------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(run_then_close(self.runner.controller, self._produce))
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread, which raises it
            log.exception("async rollouts failed")
            with self._cv:
                self._error = exc
                self._cv.notify_all()
        finally:
            self._started.set()

    async def _produce(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.runner.recover()  # processes and attempts a killed agl left running
        self._started.set()
        workers = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        try:
            await self._stop.wait()
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    def _take(self) -> tuple[_Group, PlannedRollout] | None:
        """The next rollout to launch: the oldest open group's next seed, or a new group when there is room."""
        with self._cv:
            group = next((g for g in self._open if g.unlaunched), None)
            if group is None:
                if len(self._ready) >= self.groups_per_step:
                    return None  # the next update has its groups: running ahead would only make them stale
                number = self._next_number
                self._next_number += 1
                seeds = range(number * self.group_size, (number + 1) * self.group_size)
                group = _Group(number, self.tasks[number % len(self.tasks)], deque(seeds))
                self._open.append(group)
            seed = group.unlaunched.popleft()
            group.running += 1
        return group, PlannedRollout(self.variant, group.task, seed)

    async def _worker(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                await asyncio.sleep(0.05)
                continue
            group, item = taken
            try:
                rollout = await self.runner.run_one(item, 1)
                rid = rollout.id
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one broken rollout is a dropped group member, not a stop
                log.warning("rollout %s failed to run: %s", item.key, exc)
                rid = None
            self._finished(group, rid)

    def _finished(self, group: _Group, rid: str | None) -> None:
        with self._cv:
            group.running -= 1
            if rid is not None:
                group.rollout_ids.append(rid)
            if group.done:
                # In the order groups finish: a straggler holds up no younger group (staleness bounds it instead).
                self._open.remove(group)
                self._ready.append(group)
                self._cv.notify_all()


class GatewayGate:
    """A Gate (rl_backend.trainer.interfaces) over the in-process gateway."""

    def __init__(self, gateway: Any, *, hold_s: float = 600.0, drain_timeout_s: float = 120.0) -> None:
        self.gateway, self.hold_s, self.drain_timeout_s = gateway, hold_s, drain_timeout_s
        self._paused_at = 0.0
        self._held_before = 0

    def pause(self) -> dict[str, Any]:
        self._paused_at = time.perf_counter()
        self._held_before = self.gateway.calls_held
        in_flight = self.gateway.in_flight
        self.gateway.pause(hold_s=self.hold_s)
        drained = self.gateway.wait_idle(self.drain_timeout_s)
        if not drained:
            log.warning("%d model calls still in flight after %g s: training alongside them", self.gateway.in_flight,
                        self.drain_timeout_s)
        return {"drained": drained, "in_flight_at_pause": in_flight,
                "drain_s": round(time.perf_counter() - self._paused_at, 4)}

    def resume(self, model_version: str) -> dict[str, Any]:
        self.gateway.resume(model_version)
        return {"paused_s": round(time.perf_counter() - self._paused_at, 4),
                "calls_held": self.gateway.calls_held - self._held_before}


def train_collocated_async(loop: Any, *, runner: EvalRunner, gateway: Any, tasks: list[Task], variant: Variant,
                           group_size: int, groups_per_step: int, max_staleness: int, iterations: int,
                           concurrency: int) -> list[Any]:
    """Run `iterations` updates of `loop` (a TrainingLoop) with rollouts running alongside; see the module docstring."""
    from rl_backend.trainer.async_loop import AsyncConfig, AsyncTrainingLoop

    if gateway is None:
        raise RuntimeError("the collocated-async loop needs the gateway (it pauses it around each update)")
    loop.group_of = launch_group_of(group_size)
    source = AsyncRollouts(runner, tasks, variant, group_size=group_size, concurrency=concurrency,
                           groups_per_step=groups_per_step,
                           first_group=next_group_number(runner.store, variant.name, group_size))
    config = AsyncConfig(iterations=iterations, groups_per_step=groups_per_step, max_staleness=max_staleness)
    return AsyncTrainingLoop(loop, source, GatewayGate(gateway), config).run()
