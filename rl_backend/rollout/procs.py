"""An agent's processes on this machine: making them die with agl, finding all of them, and ending what a killed
agl left behind.

Every local agent starts in a session and process group of its own, with a tag in its environment
(`AGL_PROCESS_TAG`) that its descendants inherit wherever they go: into another process group, or a session they
start with `setsid`. A descendant that scrubs its environment loses the tag, but unless it starts a session of its
own it stays in the agent's session. Ending a rollout ends its group, every process carrying its tag and every
process of its session. The agent also gets a
parent-death signal (Linux `PR_SET_PDEATHSIG`), so it is killed when agl dies, even by kill -9; what it started
itself is found by its tag on the next resume. Linux only (`/proc`); elsewhere only the process group is ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not at run time: the reaper imports this module and must start fast
    from rl_backend.store.records import AgentProcess

TAG_ENV = "AGL_PROCESS_TAG"
_PROC = Path("/proc")
_PR_SET_PDEATHSIG = 1


def _fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None if the process is gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces and parentheses.
    return stat[stat.rindex(")") + 2 :].split()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot), or None if the process is gone."""
    fields = _fields(pid)
    try:
        return (fields[0], int(fields[19])) if fields is not None else None
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    found = _stat(pid)
    return found[1] if found is not None else None


def session_pids(sid: int, since_ticks: int | None) -> list[int]:
    """Live processes in session `sid` (the agent's: it leads a session of its own) that started at or after
    `since_ticks`, the agent's start: what it started, even in a process group of its own with a scrubbed environment
    (so without its tag). The start time keeps out an older session that a reused pid once led."""
    if not _PROC.is_dir() or since_ticks is None:
        return []
    me = os.getpid()
    found = []
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        fields = _fields(int(entry.name))
        try:
            if fields and fields[0] != "Z" and int(fields[3]) == sid and int(fields[19]) >= since_ticks:
                found.append(int(entry.name))
        except (IndexError, ValueError):
            continue
    return found


def end_session(sid: int, since_ticks: int | None, sig: int = signal.SIGKILL) -> int:
    """Send `sig` to every process of the agent's session (see session_pids); returns how many there were."""
    pids = session_pids(sid, since_ticks)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return len(pids)


def has_tag(pid: int, tag: str) -> bool:
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or another user's process
        return False
    return f"{TAG_ENV}={tag}".encode() in environ.split(b"\0")


def tagged_pids(tag: str) -> list[int]:
    """Processes (of this user) whose environment carries `tag`: a rollout's agent and all its descendants."""
    if not _PROC.is_dir():
        return []
    me = os.getpid()
    found = []
    for entry in os.scandir(_PROC):
        if entry.name.isdigit() and int(entry.name) != me and has_tag(int(entry.name), tag):
            found.append(int(entry.name))
    return found


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def end_tagged(tag: str, sig: int = signal.SIGKILL) -> int:
    """Send `sig` to every process carrying `tag` (and to its process group); returns how many there were."""
    pids = tagged_pids(tag)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return len(pids)


def is_alive(pid: int, ticks: int | None) -> bool:
    """The process `pid` that started at `ticks` still runs: a zombie, or a later process that reused the pid, does
    not count."""
    if not _PROC.is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    found = _stat(pid)
    return found is not None and found[0] != "Z" and (ticks is None or found[1] == ticks)


_SHELL_WORDS = {"cd", "exec", "export", "set", "unset", "if", "for", "while", "until", "case", "source", ".", "eval",
                "!", "{", "time", "trap", "wait", "read", "alias", "ulimit", "umask", "shift", "return", "exit"}


def exec_form(command: str) -> str:
    """`exec COMMAND` when COMMAND is one simple command, so the shell becomes the agent instead of waiting for it as
    its parent: the agent itself then carries the parent-death signal. Anything else is left as it is."""
    if "\n" in command:
        return command
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:
        return command
    if not words or "=" in words[0] or words[0] in _SHELL_WORDS:
        return command
    if any(word and all(c in "();<>|&" for c in word) for word in words):
        return command
    return "exec " + command


def parent_death_signal(parent_pid: int) -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGKILL the child when agl dies; None where Linux's prctl is missing.

    Runs in the forked child before exec, so it only calls prctl (no allocation, no locks)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # agl died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def identify(pid: int, *, command: str, tag: str, rollout_id: str) -> AgentProcess:
    """What a run records about a rollout's agent process, so a later resume can check the process is still ours."""
    from rl_backend.store.records import AgentProcess

    return AgentProcess(
        rollout_id=rollout_id, pid=pid, pgid=pid, start_ticks=start_ticks(pid), command=command, tag=tag,
        owner_pid=os.getpid(), owner_start_ticks=start_ticks(os.getpid()), started_at=time.time(),
    )


def end_leftover(process: AgentProcess) -> int:
    """End what is left of a rollout whose agl is gone: its group, if its leader is still the process recorded
    (same start time, same tag), and every process carrying its tag. Returns how many processes were signalled."""
    ended = 0
    if is_alive(process.pid, process.start_ticks) and (not _PROC.is_dir() or has_tag(process.pid, process.tag)):
        signal_group(process.pgid, signal.SIGKILL)
        ended += 1
    ended += end_tagged(process.tag)
    ended += end_session(process.pid, process.start_ticks)
    return ended


def owner_alive(process: AgentProcess) -> bool:
    return is_alive(process.owner_pid, process.owner_start_ticks)
