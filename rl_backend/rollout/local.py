"""Local rollout controller: each rollout is a process group on this machine, ended whole when the agent exits,
at its deadline, or when the run is cancelled. When agl dies, the agent dies with it (a parent-death signal) and a
watchdog ends what the agent started (rl_backend/rollout/procs.py, reaper.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from typing import Any

from rl_backend.rollout import procs
from rl_backend.rollout.base import ProcessResult, RolloutJob
from rl_backend.rollout.reaper import Reaper

# What we keep of an agent's stdout and stderr: the last bytes matter most (the traceback, the final answer).
TAIL_BYTES = 64 * 1024
KILL_GRACE_S = 2.0
PIPE_DRAIN_S = 5.0


class _Tail:
    """Keeps the last `limit` bytes of a stream and counts all of them, so 100 MB of output costs no memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.buffer += chunk
        if len(self.buffer) > 2 * self.limit:
            del self.buffer[: len(self.buffer) - self.limit]

    def text(self) -> str:
        data = bytes(self.buffer[-self.limit :])
        prefix = f"[... {self.total - len(data)} earlier bytes not kept ...]\n" if self.total > len(data) else ""
        return prefix + data.decode("utf-8", errors="replace")


async def _drain(stream: asyncio.StreamReader | None, tail: _Tail) -> None:
    if stream is None:
        return
    while chunk := await stream.read(65536):
        tail.feed(chunk)


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Until the agent process itself has exited. Not `proc.wait()`: that also waits for its pipes to close, which
    a child the agent left behind holding stdout would put off until the deadline."""
    delay = 0.005
    while proc.returncode is None:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)


class LocalController:
    """Runs each rollout as `sh -c COMMAND` in a new session, so the agent and all its children end together."""

    def __init__(self, tail_bytes: int = TAIL_BYTES) -> None:
        self.tail_bytes = tail_bytes
        self.reaper = Reaper()

    async def close(self) -> None:
        self.reaper.close()

    async def run(self, job: RolloutJob) -> ProcessResult:
        started = time.monotonic()
        tag = f"{job.rollout_id}.{secrets.token_hex(8)}"
        creating = asyncio.ensure_future(asyncio.create_subprocess_shell(
            procs.exec_form(job.command),
            cwd=str(job.cwd),
            env={**job.env, procs.TAG_ENV: tag},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=procs.parent_death_signal(os.getpid()),
        ))
        try:
            proc = await asyncio.shield(creating)
        except asyncio.CancelledError:
            # Cancelled while the process was starting (a run interrupted as a grader starts): it is forked by now,
            # so wait the moment it takes to have it, then end it like any cancelled rollout. Left to asyncio, the
            # half-made transport would be collected after the loop closed ("Event loop is closed" on stderr).
            await _settle(creating)
            if not creating.cancelled() and creating.exception() is None:
                started_proc = creating.result()
                await _settle(asyncio.ensure_future(self._stop(started_proc, tag, procs.start_ticks(started_proc.pid))))
                _close_pipes(started_proc)
            raise
        ticks = procs.start_ticks(proc.pid)
        self.reaper.register(proc.pid, tag, ticks)
        try:
            if job.on_spawn is not None:
                job.on_spawn(procs.identify(proc.pid, command=job.command, tag=tag, rollout_id=job.rollout_id))
        except BaseException:
            self._end_all(proc, tag, ticks)
            raise
        out, err = _Tail(self.tail_bytes), _Tail(self.tail_bytes)
        readers = asyncio.gather(_drain(proc.stdout, out), _drain(proc.stderr, err))
        # Cancelled readers end with an exception nobody awaits; asyncio would print it as "never retrieved".
        readers.add_done_callback(_consume)
        timed_out = False
        try:
            await asyncio.wait_for(_exited(proc), timeout=job.timeout_s)
        except TimeoutError:
            timed_out = True
            await self._stop(proc, tag, ticks)
        except asyncio.CancelledError:
            await asyncio.shield(self._stop(proc, tag, ticks))
            readers.cancel()
            _close_pipes(proc)
            raise
        # The agent is done: whatever it left running, in its group, its session or sessions of their own, goes too.
        self._end_all(proc, tag, ticks)
        try:
            await asyncio.wait_for(readers, timeout=PIPE_DRAIN_S)
        except (TimeoutError, asyncio.CancelledError):
            readers.cancel()
        _close_pipes(proc)
        return ProcessResult(
            exit_code=None if timed_out else proc.returncode,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            stdout_tail=out.text(),
            stderr_tail=err.text(),
            stdout_bytes=out.total,
            stderr_bytes=err.total,
        )

    def _end_all(self, proc: asyncio.subprocess.Process, tag: str, ticks: int | None) -> None:
        procs.signal_group(proc.pid, signal.SIGKILL)
        procs.end_tagged(tag)
        procs.end_session(proc.pid, ticks)
        self.reaper.unregister(proc.pid)

    async def _stop(self, proc: asyncio.subprocess.Process, tag: str, ticks: int | None) -> None:
        procs.signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_exited(proc), timeout=KILL_GRACE_S)
        self._end_all(proc, tag, ticks)
        await _exited(proc)


async def _settle(future: asyncio.Future[Any]) -> None:
    """Until `future` is done, through further cancellations of the caller (they are re-raised by the caller's own
    `raise`): what it waits for takes moments, and stopping half way would leave a process behind."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([future])


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close our ends of the agent's pipes now, on the running loop. A process that escaped every way of finding it
    (a session of its own and no tag) may still hold their other ends; left open, asyncio would close them when the
    process object is collected, after the loop is gone: `RuntimeError: Event loop is closed` on stderr."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()
