"""How many CPU threads the engine computes with: the cores this process may use, less those other processes keep busy.

The embedded server shares the machine with the agents it serves, their graders and the gateway. Agents spend most
of a rollout waiting on the model, so the engine should use every core then; but while other processes compute, an
intra-op thread that shares a core with them stalls every parallel region of the step (OpenMP threads wait for the
slowest one), which made decode steps up to ten times slower on two busy cores. So the count follows the load:
every half second the policy reads, from /proc/stat, how much CPU time the cores spent on other processes, and sets
the thread count to the cores left (at least one). `AGL_TORCH_THREADS` or an explicit count fixes it instead.

Only the engine's own thread calls `apply`; torch's thread count is per calling thread once set, so this does not
change the threads of a trainer running in the same process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

THREADS_ENV = "AGL_TORCH_THREADS"
_WINDOW_S = 0.5
_PROC_STAT = Path("/proc/stat")
_SELF_STAT = Path("/proc/self/stat")


def usable_cores() -> list[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def fixed_threads(requested: int | None = None) -> int | None:
    """An explicit thread count: `requested`, else a valid $AGL_TORCH_THREADS; None means "follow the load"."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be at least 1, got {requested}")
        return requested
    env = os.environ.get(THREADS_ENV, "").strip()
    if not env or env == "auto":
        return None
    if not env.isdigit() or int(env) < 1:
        raise ValueError(f"${THREADS_ENV} must be a positive whole number or 'auto', got {env!r}")
    return int(env)


def _busy_ticks(cores: list[int]) -> tuple[int, int] | None:
    """(busy, total) clock ticks of `cores` since boot, or None where /proc/stat cannot be read."""
    try:
        lines = _PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cores}
    busy = total = 0
    for line in lines:
        parts = line.split()
        if parts and parts[0] in wanted:
            ticks = [int(p) for p in parts[1:9]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


def _own_ticks() -> int | None:
    """This process's CPU time in clock ticks (all its threads)."""
    try:
        fields = _SELF_STAT.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime


class ThreadPolicy:
    """Picks the engine's thread count; call `apply()` from the engine's thread before each step."""

    def __init__(self, requested: int | None = None) -> None:
        self.cores = usable_cores()
        self.fixed = fixed_threads(requested)
        self.threads = self.fixed or len(self.cores)
        self._applied = 0
        self._last: tuple[float, tuple[int, int] | None, int | None] | None = None
        self.changes = 0

    @property
    def adaptive(self) -> bool:
        return self.fixed is None and len(self.cores) > 1

    def apply(self) -> int:
        """Set torch's thread count for the calling thread to the current choice; returns it."""
        if self.adaptive:
            self._update(time.monotonic())
        if self.threads != self._applied:
            torch.set_num_threads(self.threads)
            self._applied = self.threads
        return self.threads

    def _update(self, now: float) -> None:
        if self._last is not None and now - self._last[0] < _WINDOW_S:
            return
        sample = (now, _busy_ticks(self.cores), _own_ticks())
        previous, self._last = self._last, sample
        if previous is None or sample[1] is None or previous[1] is None or sample[2] is None or previous[2] is None:
            return
        busy = sample[1][0] - previous[1][0]
        total = sample[1][1] - previous[1][1]
        own = sample[2] - previous[2]
        if total <= 0:
            return
        # Other processes' share of the cores, in cores. Own ticks are counted on any core, so this errs towards
        # more threads when this process also runs elsewhere.
        others = max(0, busy - own) / total * len(self.cores)
        free = len(self.cores) - others
        # A little hysteresis: a core counts as free once others leave it at least 70% idle.
        choice = max(1, min(len(self.cores), int(free + 0.3)))
        if choice != self.threads:
            self.threads = choice
            self.changes += 1
