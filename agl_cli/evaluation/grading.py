"""Scoring a finished rollout: a grader command, a `module:function`, or the reward the agent reported.

A grader that crashes, hangs or prints something that is not a score leaves the rollout without a reward and
with the reason: a missing reward is never counted as 0.

In a cluster (a pod: $KUBERNETES_SERVICE_HOST is set) agl's process holds the controller's credentials, so no
grader runs inside it. In the trainer's pod of `agl train --on kubernetes` ($AGL_GRADER_DIR set) every grader,
`command:` or `entry:`, runs in the pod's `grader` container: another uid, no ServiceAccount token, no credential in
its environment or volumes, no view of the controller's processes (agl_cli/evaluation/grade_channel.py sends it the
request, agl_cli/evaluation/grade_server.py runs it there). In any other pod an `entry:` grader runs in a child process
(agl_cli/evaluation/grade_entry.py) like a `command:` one, with the graders' environment (agl's credentials removed),
and agl's process is made non-dumpable (Linux PR_SET_DUMPABLE), so a grader under the same uid cannot read its
/proc/PID/environ or memory either (the admin token is also kept out of the processes agl starts:
agl_cli/evaluation/services.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_cli.evaluation.entry_agent import import_entry
from agl_cli.evaluation.grade_channel import GRADER_DIR_ENV, GraderChannel, GraderChannelError
from agl_cli.spec.command_template import fill
from agl_cli.spec.schema import ExperimentSpec
from rl_backend.gateway.jsonfast import deeper_than
from rl_backend.rollout.base import ProcessResult, RolloutJob
from rl_backend.rollout.local import LocalController
from rl_backend.store.db import RunStore
from rl_backend.store.records import FailureKind, RewardSource, check_reward

MAX_DETAIL_DEPTH = 64  # a grader's JSON detail is stored and shown: it must stay writable and readable


@dataclass
class Grade:
    reward: float | None
    source: RewardSource
    detail: dict[str, Any] | None = None
    failure: FailureKind | None = None
    error: str | None = None


class _Reading:
    """What one parse of a grader's output noticed: keys given twice in an object, numbers too small for a float."""

    def __init__(self) -> None:
        self.repeated: list[str] = []
        self.underflowed: list[str] = []

    def object(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                self.repeated.append(key)
            result[key] = value
        return result

    def number(self, text: str) -> float:
        value = float(text)
        mantissa = text.lower().partition("e")[0]
        if value == 0.0 and any(c in "123456789" for c in mantissa):
            self.underflowed.append(text)
        return value


def parse_score(text: str) -> tuple[float, dict[str, Any] | None]:
    """A grader prints a number, or a JSON object with `score` (or `reward`). Raises ValueError otherwise, and for
    a `score` or `reward` key given twice (which one was meant is unknown). A score too small for a float (1e-400)
    counts as 0, and the grader detail says so (`agl_note`)."""
    stripped = text.strip()
    if not stripped:
        raise ValueError("the grader printed nothing")
    last_line = stripped.splitlines()[-1].strip()
    for candidate in (stripped, last_line):
        reading = _Reading()
        try:
            value = json.loads(candidate, object_pairs_hook=reading.object, parse_float=reading.number)
        except json.JSONDecodeError:
            continue
        except (ValueError, RecursionError) as exc:  # a number of over 4300 digits; JSON nested past Python's stack
            raise ValueError(f"the grader's output is unusable: {_clip(str(exc) or type(exc).__name__)}") from None
        twice = sorted({k for k in reading.repeated if k in ("score", "reward")})
        if twice:
            raise ValueError(f"the grader's JSON gives `{twice[0]}` more than once: which value is meant is unknown")
        score, detail = _score_from(value)
        if score == 0.0 and reading.underflowed:
            note = f"the score {_clip(reading.underflowed[0], 40)} is below the smallest float: counted as 0"
            detail = {**(detail or {}), "agl_note": note}
        return score, detail
    raise ValueError(f"the grader printed {_clip(last_line)!r}, which is neither a number nor a JSON object")


def _score_from(value: Any) -> tuple[float, dict[str, Any] | None]:
    detail: dict[str, Any] | None = None
    if isinstance(value, dict):
        if deeper_than(value, MAX_DETAIL_DEPTH):
            raise ValueError(f"the grader's JSON is nested more than {MAX_DETAIL_DEPTH} levels deep")
        detail = value
        key = "score" if "score" in value else "reward" if "reward" in value else None
        if key is None:
            raise ValueError(f"the grader's JSON has no `score` or `reward` field (keys: {_clip(', '.join(map(str, value)))})")
        value = value[key]
    try:
        score = check_reward(value)
    except ValueError as exc:
        raise ValueError(f"the grader's output is unusable: {exc}") from None
    return score, detail


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_entry(spec: ExperimentSpec, entry: str) -> Callable[..., Any]:
    return import_entry(entry, spec.base_dir)


PR_SET_DUMPABLE = 4  # linux/prctl.h


def in_cluster(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """A pod: Kubernetes sets this in every container."""
    return bool(environ.get("KUBERNETES_SERVICE_HOST"))


def protect_process() -> bool:
    """Make this process non-dumpable: its /proc/PID/environ, mem and maps become root's, and ptrace is refused, to
    every process of the same uid (children are dumpable again once they exec). False where Linux says no."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class Grader:
    def __init__(self, spec: ExperimentSpec, store: RunStore, env: dict[str, str], *,
                 isolate: bool | None = None) -> None:
        self.spec = spec
        self.store = store
        self.env = env
        self.controller = LocalController(tail_bytes=256 * 1024)
        # Graders out of reach of agl's credentials: by default where those are worth taking, in a cluster.
        self.isolate = in_cluster() if isolate is None else isolate
        if self.isolate:
            protect_process()
        # The trainer's pod on a cluster: graders run in its grader container, out of this container's reach.
        channel_dir = os.environ.get(GRADER_DIR_ENV)
        self.channel = GraderChannel(Path(channel_dir)) if channel_dir else None

    async def grade(self, rollout_id: str, task: dict[str, Any], task_file: Path, output_file: Path) -> Grade:
        grader = self.spec.grader
        if grader.reported:
            reported = self.store.reported_reward(rollout_id)
            if reported is None:
                return Grade(
                    None, RewardSource.none, failure=FailureKind.no_reward_reported,
                    error="the agent exited without POSTing a reward to AGL_REWARD_URL",
                )
            return Grade(reported[0], RewardSource.agent, detail=reported[1])
        if not output_file.is_file():
            return Grade(
                None, RewardSource.none, failure=FailureKind.no_output,
                error=f"the agent exited without writing its output file ({output_file.name})",
            )
        if self.channel is not None:
            # An entry grader too: the container's python runs it (grade_entry), with the container's imports.
            command = grader.command or ("{python} -m agl_cli.evaluation.grade_entry "
                                         f"{shlex.quote(str(grader.entry))} {{task_file}} {{output_file}}")
            return await self._grade_remote(command, rollout_id, task_file, output_file)
        if grader.entry and self.isolate:
            run = shlex.join([sys.executable, "-m", "agl_cli.evaluation.grade_entry", grader.entry])
            return await self._grade_command(run + " {task_file} {output_file}", rollout_id, task_file, output_file)
        if grader.entry:
            return await self._grade_entry(grader.entry, task, output_file)
        assert grader.command is not None
        return await self._grade_command(grader.command, rollout_id, task_file, output_file)

    async def _grade_entry(self, entry: str, task: dict[str, Any], output_file: Path) -> Grade:
        output = output_file.read_text(encoding="utf-8", errors="replace")
        try:
            function = load_entry(self.spec, entry)
            result = await asyncio.wait_for(asyncio.to_thread(function, task, output), self.spec.grader.timeout_s)
        except TimeoutError:
            return Grade(None, RewardSource.none, failure=FailureKind.grader_crashed,
                         error=f"grader {entry} did not return within {self.spec.grader.timeout_s:g} s")
        except Exception as exc:  # the user's grader: any failure is a reason, not a crash of agl
            return Grade(None, RewardSource.none, failure=FailureKind.grader_crashed,
                         error=f"grader {entry} raised {type(exc).__name__}: {exc}")
        try:
            score, detail = _score_from(result)
        except ValueError as exc:
            return Grade(None, RewardSource.none, failure=FailureKind.grader_garbage, error=f"grader {entry}: {exc}")
        return Grade(score, RewardSource.grader, detail=detail)

    async def _grade_command(self, command: str, rollout_id: str, task_file: Path, output_file: Path) -> Grade:
        line = fill(command, {
            "task_file": shlex.quote(str(task_file)),
            "output_file": shlex.quote(str(output_file)),
            "rollout_dir": shlex.quote(str(task_file.parent)),
            "python": shlex.quote(sys.executable),
        })
        job = RolloutJob(
            rollout_id=rollout_id, command=line, env=self.env, cwd=self.spec.base_dir,
            rollout_dir=task_file.parent, timeout_s=self.spec.grader.timeout_s,
        )
        return _judge(await self.controller.run(job), self.spec.grader.timeout_s)

    async def _grade_remote(self, command: str, rollout_id: str, task_file: Path, output_file: Path) -> Grade:
        assert self.channel is not None
        try:
            result = await self.channel.run(command, rollout_id=rollout_id, task_file=task_file,
                                            output_file=output_file, timeout_s=self.spec.grader.timeout_s)
        except (TimeoutError, GraderChannelError) as exc:
            return Grade(None, RewardSource.none, failure=FailureKind.grader_crashed, error=str(exc))
        return _judge(result, self.spec.grader.timeout_s)


def _judge(result: ProcessResult, timeout_s: float) -> Grade:
    """A grader process's end as a grade: its score, or why there is none."""
    if result.timed_out:
        return Grade(None, RewardSource.none, failure=FailureKind.grader_crashed,
                     error=f"the grader did not finish within {timeout_s:g} s")
    if result.exit_code != 0:
        last = (result.stderr_tail.strip().splitlines() or ["(no stderr)"])[-1]
        return Grade(None, RewardSource.none, failure=FailureKind.grader_crashed,
                     error=f"the grader exited with code {result.exit_code}: {_clip(last, 300)}")
    try:
        score, detail = parse_score(result.stdout_tail)
    except ValueError as exc:
        return Grade(None, RewardSource.none, failure=FailureKind.grader_garbage, error=str(exc))
    return Grade(score, RewardSource.grader, detail=detail)
