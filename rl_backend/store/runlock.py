"""One process at a time holds a run: an OS file lock (flock) on `<run>/run.lock`, which the kernel releases when
its holder exits, however it exits (kill -9 included).

The lock file also says who holds it (pid and command line), so a second process can be told whom it waits for.
The descriptor is not inherited by agents (Python opens files close-on-exec), so an agent that outlives agl does not
keep the run locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from types import TracebackType

LOCK_FILE = "run.lock"


class RunLockedError(RuntimeError):
    """The run is held by another live process."""

    def __init__(self, folder: Path, pid: int | None, command: str | None) -> None:
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(f"{folder} is in use by {holder}" + (f" ({command})" if command else ""))
        self.folder = folder
        self.pid = pid
        self.command = command


def _read_holder(path: Path) -> tuple[int | None, str | None]:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    if not isinstance(info, dict):
        return None, None
    pid = info.get("pid")
    command = info.get("command")
    return (pid if isinstance(pid, int) else None), (command if isinstance(command, str) else None)


class RunLock:
    """`with RunLock(folder):` holds the run for the block; a second holder gets RunLockedError naming the first."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, *, command: str | None = None) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        # A moment's retry: lock_holder() below takes the lock briefly to test it, which must not look like a holder.
        for attempt in range(5):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 4:
                    os.close(fd)
                    pid, held_by = _read_holder(self.path)
                    raise RunLockedError(self.folder, pid, held_by) from None
                time.sleep(0.05)
        info = {"pid": os.getpid(), "command": command or " ".join(sys.argv), "since": time.time()}
        data = json.dumps(info).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # a stale pid in the file would only confuse someone reading it
        os.close(fd)  # closing the descriptor releases the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self if self.held else self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def lock_holder(folder: Path) -> int | None:
    """The pid of the live process holding `folder`'s run lock (possibly this one; 0 when it has not yet written
    its pid), or None when nobody holds it."""
    path = Path(folder) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, _ = _read_holder(path)
            return pid if pid is not None else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
