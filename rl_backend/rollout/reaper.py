"""The watchdog that ends a run's agents when agl dies, however it dies (kill -9 included).

A small process of its own (`python -m rl_backend.rollout.reaper`, in a session of its own so Ctrl-C does not reach
it) reads `+PGID START_TICKS TAG` and `-PGID` lines on stdin: the agents agl started and those that ended. When its
input ends, agl has exited (the kernel closes the pipe with the process), and it kills every process group still
listed, every process carrying a listed tag and every process of a listed agent's session
(rl_backend/rollout/procs.py), then exits. The parent-death signal ends the
agent itself; this ends what the agent started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import weakref

from rl_backend.rollout import procs


class Reaper:
    """agl's end of the pipe; the watchdog starts with the first agent registered."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._broken = False

    def _send(self, line: str) -> None:
        if self._broken:
            return
        if self._proc is None:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "rl_backend.rollout.reaper"], stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                    env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
                )
            except OSError:
                self._broken = True  # the resume-time cleanup still ends what is left
                return
            weakref.finalize(self, _close, self._proc)
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            self._broken = True

    def register(self, pgid: int, tag: str, start_ticks: int | None = None) -> None:
        """An agent started: `pgid` leads its group and session, `tag` marks its descendants, `start_ticks` is when
        it started (only processes of its session started since then are its own)."""
        self._send(f"+{pgid} {-1 if start_ticks is None else start_ticks} {tag}")

    def unregister(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Nothing is left to end: the watchdog exits."""
        if self._proc is not None:
            _close(self._proc)


def _close(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin is not None:
            proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        proc.wait(timeout=5)


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    listed: dict[int, tuple[int | None, str]] = {}
    for raw in sys.stdin.buffer:
        line = raw.decode(errors="replace").strip()
        with contextlib.suppress(ValueError):
            if line.startswith("+"):
                pgid, ticks, tag = line[1:].split(" ", 2)
                listed[int(pgid)] = (None if int(ticks) < 0 else int(ticks), tag)
            elif line.startswith("-"):
                listed.pop(int(line[1:]), None)
    for pgid, (ticks, tag) in listed.items():
        procs.signal_group(pgid, signal.SIGKILL)
        if tag:
            procs.end_tagged(tag)
        procs.end_session(pgid, ticks)


if __name__ == "__main__":
    main()
