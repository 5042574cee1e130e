"""What SQLite's refusals mean to the person running agl: a store locked by another process, a disk (or a file size
limit) that is full, a folder that cannot be written. Each becomes a StoreError that says what happened, who holds
the store where that can be known, and what to do, instead of `sqlite3.OperationalError: database is locked`.
"""

from __future__ import annotations

import os
import resource
import shutil
import sqlite3
from pathlib import Path

from rl_backend.store.schema import StoreError

# How long a write waits for a store another process holds before it gives up (SQLite's busy timeout).
BUSY_TIMEOUT_ENV = "AGL_STORE_BUSY_TIMEOUT_S"
DEFAULT_BUSY_TIMEOUT_S = 30.0
# Below this much free space a failed write is put down to a full disk.
_LOW_SPACE_BYTES = 8 << 20


class StoreBusyError(StoreError):
    """Another process held the store's write lock for longer than the busy timeout."""

    exit_code = 1


class StoreFullError(StoreError):
    """The disk holding the store is full, or a file size limit (ulimit -f) stopped the write."""

    exit_code = 1


class StoreReadOnlyError(StoreError):
    """The store, or its folder, cannot be written (a read-only mount, another user's files)."""

    exit_code = 2


def busy_timeout_s() -> float:
    """The busy timeout from AGL_STORE_BUSY_TIMEOUT_S (seconds, default 30)."""
    raw = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_BUSY_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise StoreError(f"${BUSY_TIMEOUT_ENV} is {raw!r}: give a number of seconds, e.g. 30") from None
    if not 0 <= value <= 86_400:
        raise StoreError(f"${BUSY_TIMEOUT_ENV} is {raw!r}: give a number of seconds between 0 and 86400")
    return value


def store_holders(path: Path) -> list[tuple[int, str]]:
    """(pid, command line) of the other processes that have the store (or its WAL) open; empty where /proc is
    missing or nothing can be seen (another user's processes are not visible)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    targets = {str(Path(path).resolve()) + suffix for suffix in ("", "-wal", "-shm", "-journal")}
    me = os.getpid()
    found = []
    for entry in os.scandir(proc):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
            holds = any(os.readlink(fd.path) in targets for fd in fds)
        except OSError:
            continue
        if holds:
            try:
                cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmd = ""
            found.append((int(entry.name), cmd.strip()[:160]))
    return found


def _holders_text(path: Path) -> str:
    holders = store_holders(path)
    if not holders:
        return "another process"
    return ", ".join(f"process {pid}" + (f" ({cmd})" if cmd else "") for pid, cmd in holders[:3])


def _size_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _out_of_space(path: Path, exc: Exception) -> StoreFullError:
    limit = _size_limit()
    free = _free_bytes(path.parent)
    if limit is not None:
        why = f"a file size limit (ulimit -f: {limit:,} bytes) stopped agl writing {path}"
        fix = "raise the limit (ulimit -f unlimited)"
    else:
        why = f"the disk holding {path} is full" + (f" ({free:,} bytes free)" if free is not None else "")
        fix = "free some space (or move the runs with --runs-dir / AGL_HOME)"
    return StoreFullError(f"{why} ({exc})", hint=fix)


def explain(exc: sqlite3.Error, path: Path) -> StoreError | None:
    """The StoreError that says what `exc` means for the store at `path`, or None for an error that is not about
    the store's place on disk (a bug, damage: the caller's to handle)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in text:
        return StoreBusyError(
            f"the run store {path} is locked by {_holders_text(path)}: agl waited {busy_timeout_s():g} s for it",
            hint=f"let that process finish or stop it (or wait longer: ${BUSY_TIMEOUT_ENV}=SECONDS)",
        )
    if name.startswith("SQLITE_FULL") or "database or disk is full" in text:
        return _out_of_space(path, exc)
    if name.startswith("SQLITE_IOERR") or "disk I/O error" in text:
        free = _free_bytes(path.parent)
        if _size_limit() is not None or (free is not None and free < _LOW_SPACE_BYTES):
            return _out_of_space(path, exc)
        return StoreError(f"a disk I/O error while writing {path} ({exc})", hint="check the disk (dmesg)")
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM")) or "readonly" in text:
        return StoreReadOnlyError(
            f"cannot write the run store {path}: its folder or file is read-only ({exc})",
            hint="give agl a writable runs folder: --runs-dir DIR or AGL_HOME=DIR (reading commands work as they are)",
        )
    return None


def explain_os(exc: OSError, path: Path) -> StoreError | None:
    """The same for an OSError writing next to the store (the manifest, a rollout's files)."""
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return _out_of_space(path, exc)
    if exc.errno == errno.EROFS:
        return StoreReadOnlyError(
            f"cannot write {path}: {exc.strerror}",
            hint="give agl a writable runs folder: --runs-dir DIR or AGL_HOME=DIR (reading commands work as they are)",
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return StoreReadOnlyError(
            f"cannot use {path}: {exc.strerror}",
            hint="check that agl may read and write there; for a runs folder agl may only read, give it a writable "
            "one: --runs-dir DIR or AGL_HOME=DIR",
        )
    return None
