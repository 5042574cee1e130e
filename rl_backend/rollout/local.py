"""Local rollout controller: each rollout is a process group on this machine, killed whole at its deadline."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from rl_backend.rollout.base import ProcessResult, RolloutJob

# What we keep of an agent's stdout and stderr: the last bytes matter most (the traceback, the final answer).
TAIL_BYTES = 64 * 1024
KILL_GRACE_S = 2.0


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


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class LocalController:
    """Runs each rollout as `sh -c COMMAND` in a new session, so a timeout kills the agent and all its children."""

    def __init__(self, tail_bytes: int = TAIL_BYTES) -> None:
        self.tail_bytes = tail_bytes

    async def run(self, job: RolloutJob) -> ProcessResult:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_shell(
            job.command,
            cwd=str(job.cwd),
            env=job.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        out, err = _Tail(self.tail_bytes), _Tail(self.tail_bytes)
        readers = asyncio.gather(_drain(proc.stdout, out), _drain(proc.stderr, err))
        timed_out = cancelled = False
        try:
            await asyncio.wait_for(proc.wait(), timeout=job.timeout_s)
        except TimeoutError:
            timed_out = True
            await self._stop(proc)
        except asyncio.CancelledError:
            cancelled = True
            await asyncio.shield(self._stop(proc))
            readers.cancel()
            raise
        finally:
            if not cancelled:
                # A grandchild may still hold the pipes open; the group is ours to end once the agent is done.
                _kill_group(proc.pid, signal.SIGKILL)
                try:
                    await asyncio.wait_for(readers, timeout=5.0)
                except (TimeoutError, asyncio.CancelledError):
                    readers.cancel()
        return ProcessResult(
            exit_code=None if timed_out else proc.returncode,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            stdout_tail=out.text(),
            stderr_tail=err.text(),
            stdout_bytes=out.total,
            stderr_bytes=err.total,
        )

    @staticmethod
    async def _stop(proc: asyncio.subprocess.Process) -> None:
        _kill_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=KILL_GRACE_S)
        _kill_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()
