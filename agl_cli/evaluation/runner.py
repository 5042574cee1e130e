"""Running a plan of rollouts: for each (variant, task, seed) start the agent through the controller, with the
gateway in front of its model calls, grade what it leaves, and record everything in the run store.

Resumable: a key whose latest attempt finished is never run again; an attempt that a dead process left
`running` is marked cancelled and a new attempt starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_cli.evaluation.grading import Grader
from agl_cli.evaluation.services import RunServices
from agl_cli.runs.run_spend import own_usd, run_spend
from agl_cli.runs.rundir import RunDir
from agl_cli.spec.command_template import fill
from agl_cli.spec.schema import ExperimentSpec
from agl_cli.spec.secret_env import secret_names, secret_values
from agl_cli.spec.tasks import Task
from agl_cli.spec.variants import Variant
from rl_backend.gateway.knobs import scoped
from rl_backend.rollout import procs
from rl_backend.rollout.base import ProcessResult, RolloutController, RolloutJob
from rl_backend.store.db import RunStore, StoreError
from rl_backend.store.records import FailureKind, RewardSource, Rollout, RolloutStatus
from rl_backend.store.redact import Redactor

OUTPUT_KEEP_BYTES = 64 * 1024
# agl's own credentials (in a trainer's pod: the deployed gateway's admin token, the policy servers' key): no agent
# or grader process gets them, gateway or not.
# ...and the token a trainer Job's own Ray requires (rl_backend/trainer/verl_backend/ray_head.py).
AGL_CREDENTIALS = ("AGL_GATEWAY_ADMIN_TOKEN", "AGL_POLICY_API_KEY", "RAY_AUTH_TOKEN")


@dataclass(frozen=True)
class PlannedRollout:
    variant: Variant
    task: Task
    seed: int

    @property
    def key(self) -> str:
        return f"{self.variant.hash}/{self.task.id}/{self.seed}"


def rollout_id(run_id: str, key: str, attempt: int) -> str:
    """URL-safe and short (it appears in every gateway path the agent calls), and unique to its run: the same
    variant, task and seed in two runs are two rollouts, and a rollout id alone names one transcript. Ids of stores
    written before (the key alone was hashed) stay as they are: nothing derives an existing rollout's id again."""
    return "r" + hashlib.sha1(f"{run_id}/{key}".encode()).hexdigest()[:12] + f"-{attempt}"


def make_plan(variants: list[Variant], tasks: list[Task], seeds: int) -> list[PlannedRollout]:
    # Task-major order: every variant sees task 1 before any sees task 2, so a partial run stays paired.
    return [PlannedRollout(v, t, s) for t in tasks for s in range(seeds) for v in variants]


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(nothing on stderr)"


class EvalRunner:
    """Executes a plan with bounded concurrency. `on_event(kind, rollout)` reports progress to the CLI."""

    def __init__(
        self,
        spec: ExperimentSpec,
        run: RunDir,
        store: RunStore,
        services: RunServices,
        controller: RolloutController,
        *,
        on_event: Callable[[str, Rollout], None] | None = None,
        gateway_overrides: dict[str, Any] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.run_dir = run
        self.store = store
        self.services = services
        self.controller = controller
        self.on_event = on_event or (lambda kind, rollout: None)
        # Request settings forced on every call of these rollouts, over the variant's (training samples at T=1).
        self.gateway_overrides = dict(gateway_overrides or {})
        self.log = log or (lambda message: None)
        self.base_env = self._base_env()
        self.grader = Grader(spec, store, self.base_env)
        self.stopped_for_budget = False
        # The values of the key variables: whatever an agent or upstream echoes of them is not written anywhere.
        self.redactor = Redactor(secret_values(spec).values())

    def _base_env(self) -> dict[str, str]:
        secret = secret_names(self.spec)
        env = {k: v for k, v in os.environ.items()
               if (k not in secret or not self.services.gateway) and k not in AGL_CREDENTIALS}
        # The agent finds the Python agl runs on first, so `python agent.py` works without activating a venv.
        bin_dir = str(Path(sys.executable).parent)
        path = env.get("PATH", "")
        if bin_dir not in path.split(os.pathsep):
            env["PATH"] = bin_dir + os.pathsep + path if path else bin_dir
        env["PYTHONUNBUFFERED"] = "1"
        return env

    # -- planning and resume -------------------------------------------------------------------------------------

    def recover(self) -> None:
        """Before anything runs: end what an agl killed mid-run left of its agents (their process groups, and any
        descendant that moved to a group or session of its own), then mark its unfinished attempts interrupted."""
        for process in self.store.agent_processes():
            if procs.owner_alive(process):
                continue  # this process's own rollout, or another live agl's (the run lock keeps those out)
            ended = procs.end_leftover(process)
            if ended:
                self.log(f"ended {ended} process(es) of rollout {process.rollout_id} that an earlier, killed agl left "
                         f"running ({process.command[:120]})")
            self.store.forget_process(process.rollout_id)
        self.store.mark_interrupted()

    def pending(self, plan: list[PlannedRollout]) -> list[tuple[PlannedRollout, int]]:
        """The planned keys still to run, each with the attempt number it gets."""
        self.recover()
        latest = {r.key: r for r in self.store.rollouts(latest_only=True)}
        todo = []
        for item in plan:
            previous = latest.get(item.key)
            if previous is not None and previous.status.terminal:
                continue
            todo.append((item, 1 if previous is None else previous.attempt + 1))
        return todo

    def _budget_left(self, started: int) -> bool:
        # This run's own ceilings: the spec's, or with `budget.scope: experiment` what the spec's other runs left.
        max_rollouts, max_usd = self.spec.budget.run_rollouts(), self.spec.budget.run_usd()
        if max_rollouts is not None and started >= max_rollouts:
            return False
        # Rollouts reused from earlier runs cost this run nothing: only its own calls count against budget.usd (their
        # priced cost: a budget in USD starts only when every model it can call has a price, see agl_cli.spec.prices).
        return max_usd is None or own_usd(self.store) < max_usd

    async def run(self, plan: list[PlannedRollout]) -> None:
        todo = self.pending(plan)
        semaphore = asyncio.Semaphore(self.spec.concurrency)
        already = run_spend(self.store).launched
        started = 0

        async def one(item: PlannedRollout, attempt: int) -> None:
            nonlocal started
            async with semaphore:
                if not self._budget_left(already + started):
                    self.stopped_for_budget = True
                    return
                started += 1
                await self.run_one(item, attempt)

        tasks = [asyncio.create_task(one(item, attempt)) for item, attempt in todo]
        try:
            # Not gather: cancelled (Ctrl-C, SIGTERM), its future would end with an exception nobody retrieves,
            # which asyncio prints as a traceback on the way out.
            if tasks:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- one rollout ---------------------------------------------------------------------------------------------

    def _agent_command(self, task_file: Path, output_file: Path, folder: Path, rid: str) -> str:
        agent = self.spec.agent
        values = {
            "task_file": shlex.quote(str(task_file)),
            "output_file": shlex.quote(str(output_file)),
            "rollout_dir": shlex.quote(str(folder)),
            "rollout_id": rid,
            "python": shlex.quote(sys.executable),
        }
        if agent.command:
            return fill(agent.command, values)
        return (
            f"{values['python']} -m agl_cli.evaluation.entry_agent {shlex.quote(str(agent.entry))} "
            f"{values['task_file']} {values['output_file']}"
        )

    def _knob_settings(self, variant: Variant, folder: Path) -> tuple[dict[str, str], dict[str, Any]]:
        """Apply a variant: env knobs become variables, file knobs are rendered, gateway knobs go to the gateway
        (limited to their `models` when they have some). A knob set to None is left alone."""
        env: dict[str, str] = {}
        gateway: dict[str, Any] = {}
        for name, option in variant.settings.items():
            knob = self.spec.knobs[name]
            if option is None:
                continue
            if knob.via == "env":
                assert knob.name is not None
                value = str(self.spec.resolve(str(option))) if knob.files is not None else option
                env[knob.name] = value if isinstance(value, str) else json.dumps(value)
            elif knob.via == "file":
                assert knob.path is not None
                target = Path(knob.path.format(rollout_dir=str(folder)))
                if not target.is_absolute():
                    target = self.spec.base_dir / target
                target.parent.mkdir(parents=True, exist_ok=True)
                if knob.files is not None:
                    target.write_bytes(self.spec.resolve(str(option)).read_bytes())
                else:
                    target.write_text(option if isinstance(option, str) else json.dumps(option))
            else:
                value = {"text": self.spec.resolve(str(option)).read_text(), "mode": knob.mode} \
                    if name == "system_prompt" else option
                gateway[name] = value if knob.models is None else scoped(value, knob.models)
        return env, gateway

    async def run_one(self, item: PlannedRollout, attempt: int) -> Rollout:
        rid = rollout_id(self.run_dir.run_id, item.key, attempt)
        folder = self.run_dir.rollout_dir(rid)
        task_file = folder / "task.json"
        task_file.write_text(json.dumps(item.task.data))
        output_file = folder / "output.txt"
        output_file.unlink(missing_ok=True)
        rollout = Rollout(
            id=rid, key=item.key, variant=item.variant.name, task_id=item.task.id, split=item.task.split,
            seed=item.seed, attempt=attempt, status=RolloutStatus.running, started_at=time.time(),
        )
        knob_env, gateway_knobs = self._knob_settings(item.variant, folder)
        gateway_knobs.update(self.gateway_overrides)
        env = dict(self.base_env)
        env.update(self.spec.agent.env)
        env.update(knob_env)
        env.update({
            "AGL_ROLLOUT_ID": rid, "AGL_TASK_FILE": str(task_file), "AGL_OUTPUT_FILE": str(output_file),
            "AGL_ROLLOUT_DIR": str(folder), "AGL_SEED": str(item.seed), "AGL_VARIANT": item.variant.name,
        })
        gateway = self.services.gateway
        token: str | None = None
        if gateway is not None and self.services.gateway_url:
            token = gateway.register_rollout(rid, gateway_knobs)
            base = f"{self.services.gateway_url}/rollouts/{rid}"
            env.update({
                "OPENAI_BASE_URL": f"{base}/openai/v1", "ANTHROPIC_BASE_URL": f"{base}/anthropic",
                "OPENAI_API_KEY": token, "ANTHROPIC_API_KEY": token, "AGL_REWARD_URL": f"{base}/reward",
            })
        self.store.put_rollout(rollout)
        self.on_event("started", rollout)
        job = RolloutJob(
            rollout_id=rid, command=self._agent_command(task_file, output_file, folder, rid), env=env,
            cwd=self.spec.base_dir, rollout_dir=folder, timeout_s=self.spec.agent.timeout_s,
            labels={"variant": item.variant.name, "task": item.task.id}, on_spawn=self.store.record_process,
        )
        try:
            result = await self.controller.run(job)
        except asyncio.CancelledError:
            rollout.status, rollout.failure = RolloutStatus.cancelled, FailureKind.interrupted
            rollout.error, rollout.ended_at = "the run was interrupted while this rollout ran", time.time()
            with contextlib.suppress(StoreError):  # a store that refuses writes stopped the run: the resume fixes it
                self.store.put_rollout(rollout)
            raise
        finally:
            with contextlib.suppress(StoreError):  # a row left behind is cleared by the resume's recover()
                self.store.forget_process(rid)
            if gateway is not None:
                gateway.unregister_rollout(rid)
                self.services.collect_rollout(rid, self.store)  # a remote gateway's records, before grading reads them
        redactor = self.redactor.with_secret(token)
        try:
            await self._conclude(rollout, item, result, task_file, output_file, redactor)
        except Exception as exc:  # noqa: BLE001 - one rollout's trouble must not end the run that holds the others
            rollout.status, rollout.failure, rollout.reward = RolloutStatus.failed, FailureKind.infra, None
            rollout.reward_source, rollout.grader_detail = RewardSource.none, None
            rollout.error = redactor.text(f"agl could not finish this rollout: {type(exc).__name__}: {exc}"[:1000])
        try:
            self.store.put_rollout(rollout)
        except (ValueError, TypeError, RecursionError) as exc:  # a grader detail that cannot be stored as JSON
            rollout.status, rollout.failure, rollout.reward = RolloutStatus.failed, FailureKind.grader_garbage, None
            rollout.reward_source, rollout.grader_detail = RewardSource.none, None
            rollout.error = f"the grader's detail cannot be stored as JSON ({type(exc).__name__}: {str(exc)[:200]})"
            self.store.put_rollout(rollout)
        self.on_event("finished", rollout)
        return rollout

    async def _conclude(self, rollout: Rollout, item: PlannedRollout, result: ProcessResult, task_file: Path,
                        output_file: Path, redactor: Redactor) -> None:
        """The rollout's outcome from what its agent left: status, reward or the reason there is none."""
        gateway = self.services.gateway
        rid = rollout.id
        rollout.exit_code, rollout.ended_at = result.exit_code, time.time()
        rollout.stdout_tail, rollout.stderr_tail = redactor.text(result.stdout_tail), redactor.text(result.stderr_tail)
        if output_file.is_file():
            redactor.file(output_file)
            rollout.output = read_head(output_file, OUTPUT_KEEP_BYTES)
        limit = gateway.spend_limit if gateway is not None else None
        if limit is not None and limit.was_refused(rid):
            # Whatever the agent made of a refused call is not its answer: no grade, and (not terminal) a resume
            # with a higher budget runs it again.
            rollout.status, rollout.failure = RolloutStatus.cancelled, FailureKind.budget_exhausted
            rollout.error = f"the gateway refused this rollout's model calls: the budget of ${limit.limit_usd:g} is spent"
            self.stopped_for_budget = True
        elif result.timed_out:
            rollout.status, rollout.failure = RolloutStatus.timed_out, FailureKind.agent_timeout
            rollout.error = f"the agent did not finish within {self.spec.agent.timeout_s:g} s; its process group was killed"
        elif result.exit_code != 0:
            rollout.status, rollout.failure = RolloutStatus.failed, FailureKind.agent_crashed
            rollout.error = f"the agent exited with code {result.exit_code}: {_last_line(result.stderr_tail)}"
        else:
            grade = await self.grader.grade(rid, item.task.data, task_file, output_file)
            rollout.reward, rollout.reward_source = grade.reward, grade.source
            rollout.grader_detail = redactor.value(grade.detail)
            rollout.failure, rollout.error = grade.failure, grade.error
            rollout.status = RolloutStatus.succeeded if grade.reward is not None else RolloutStatus.failed
        rollout.error = redactor.text(rollout.error)


def read_head(path: Path, limit: int) -> str:
    """The first `limit` bytes of a file as text: an output of hundreds of MB is never read whole."""
    with path.open("rb") as fh:
        return fh.read(limit).decode("utf-8", errors="replace")
