"""The rollout controller interface: start one rollout's agent process, watch it, stop it, collect what it left.

`agl eval`, `optimize` and `train` only talk to this interface; local processes and Kubernetes Jobs implement it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rl_backend.store.records import AgentProcess


@dataclass(frozen=True)
class RolloutJob:
    rollout_id: str
    command: str  # a shell command line, placeholders already filled in
    env: dict[str, str]  # the complete environment of the agent process
    cwd: Path
    rollout_dir: Path
    timeout_s: float
    labels: dict[str, str] = field(default_factory=dict)
    # Called as soon as a local agent process runs, with what identifies it: a run records it, so that a resume
    # after agl was killed can end what was left running. Controllers without local processes never call it.
    on_spawn: Callable[[AgentProcess], None] | None = None


@dataclass
class ProcessResult:
    exit_code: int | None  # None when it was killed (timeout or cancel)
    timed_out: bool
    duration_s: float
    stdout_tail: str
    stderr_tail: str
    stdout_bytes: int
    stderr_bytes: int
    cancelled: bool = False


class RolloutController(Protocol):
    async def run(self, job: RolloutJob) -> ProcessResult:
        """Run the job to its end (or its deadline). Cancelling the awaiting task stops the rollout."""
        ...
