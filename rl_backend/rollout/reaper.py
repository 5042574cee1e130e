"""The watchdog that ends a run's agents when agl dies, however it dies (kill -9 included).

A small process of its own (`python -m rl_backend.rollout.reaper`, in a session of its own so Ctrl-C does not reach
it) reads `+PGID TAG` and `-PGID` lines on stdin: the agents agl started and those that ended. When its input ends,
agl has exited (the kernel closes the pipe with the process), and it kills every process group still listed and
every process carrying a listed tag (rl_backend/rollout/procs.py), then exits. The parent-death signal ends the
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

    def register(self, pgid: int, tag: str) -> None:
        self._send(f"+{pgid} {tag}")

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
    listed: dict[int, str] = {}
    for raw in sys.stdin.buffer:
        line = raw.decode(errors="replace").strip()
        with contextlib.suppress(ValueError):
            if line.startswith("+"):
                pgid, _, tag = line[1:].partition(" ")
                listed[int(pgid)] = tag
            elif line.startswith("-"):
                listed.pop(int(line[1:]), None)
    for pgid, tag in listed.items():
        procs.signal_group(pgid, signal.SIGKILL)
        if tag:
            procs.end_tagged(tag)


if __name__ == "__main__":
    main()
