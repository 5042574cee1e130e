"""The result cache: a finished rollout is reused whenever (variant, task, seed, agent version) is the same.

The variant is its hash (what it changes: agl_cli/spec/variants.py); the task must have the same content, checked against
the `task.json` the earlier rollout ran on; the agent version is the spec's agent, grader, model and upstreams plus
the files of the spec's folder (agl_cli/evaluation/agent_version.py).

Every run directory whose manifest records the same `agent_version` is a source. Only scored rollouts are reused:
a failure may have had a cause outside the agent (an upstream that was down, a full disk) and run differently
now. With `reuse_failures`, failures that are the variant's own doing are reused too (timed out, agent crashed, no
output); grader failures, infrastructure failures and interrupted attempts never are. A planned rollout that is not
reused gets its reason (`explain`, agl_cli/evaluation/reuse.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from agl_cli.evaluation.agent_version import AgentVersion, describe_agent
from agl_cli.evaluation.reuse import History, ReuseReport, why_not
from agl_cli.evaluation.runner import PlannedRollout, rollout_id
from agl_cli.runs.run_spend import IMPORTED_META, imported_ids
from agl_cli.runs.rundir import RunDir, RunsIndex, read_stores
from agl_cli.spec.schema import ExperimentSpec
from agl_cli.spec.tasks import Task
from rl_backend.store.db import RunStore
from rl_backend.store.records import FailureKind, Rollout

REUSABLE_FAILURES = {FailureKind.agent_crashed, FailureKind.agent_timeout, FailureKind.no_output}


def agent_version(spec: ExperimentSpec, spec_file: Path | None = None) -> str:
    """The agent version's digest (see agl_cli.evaluation.agent_version)."""
    return describe_agent(spec, spec_file).digest


def task_hash(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def reusable(rollout: Rollout, *, reuse_failures: bool = False) -> bool:
    """A scored rollout; with `reuse_failures`, also one that failed by the agent's own doing."""
    if not rollout.status.terminal:
        return False
    if rollout.reward is not None and rollout.failure is None:
        return True
    return reuse_failures and rollout.failure in REUSABLE_FAILURES


@dataclass
class _Source:
    run: RunDir
    rollout: Rollout


class ResultCache:
    """Finished rollouts of other runs with the same agent version, by rollout key (variant hash/task/seed)."""

    def __init__(self, runs_root: Path, version: str, *, exclude: Path | None = None,
                 reuse_failures: bool = False) -> None:
        self.version = version
        self.runs_root, self.exclude, self.reuse_failures = runs_root, exclude, reuse_failures
        self.entries: dict[str, _Source] = {}
        self.unusable: dict[str, _Source] = {}  # same agent, but failed or never finished: the newest of each key
        self._history: History | None = None
        runs = RunsIndex.scan(runs_root).select(agent_version=version, with_store=True, exclude=exclude)
        # A damaged run is no source; the run that uses the cache must not fail for it.
        for entry, store in read_stores(runs):
            for rollout in store.rollouts(latest_only=True):
                if reusable(rollout, reuse_failures=reuse_failures):
                    self.entries.setdefault(rollout.key, _Source(entry.run, rollout))
                else:
                    self.unusable[rollout.key] = _Source(entry.run, rollout)

    def __len__(self) -> int:
        return len(self.entries)

    def _same_task(self, source: _Source, task: Task) -> bool:
        task_file = source.run.path / "rollouts" / source.rollout.id / "task.json"
        try:
            return task_hash(json.loads(task_file.read_text())) == task_hash(task.data)
        except (OSError, json.JSONDecodeError):
            return False

    def import_into(self, store: RunStore, plan: list[PlannedRollout], *, run_id: str) -> int:
        """Copy the cached results of planned keys this store (of run `run_id`) has not finished; returns how many
        were copied."""
        if not self.entries:
            return 0
        latest = {r.key: r for r in store.rollouts(latest_only=True)}
        imported: dict[str, str] = store.get_meta(IMPORTED_META, {})
        sources: dict[Path, RunStore] = {}
        try:
            return self._import(store, plan, latest, imported, sources, run_id)
        finally:
            for opened in sources.values():
                opened.close()

    def _import(self, store: RunStore, plan: list[PlannedRollout], latest: dict[str, Rollout],
                imported: dict[str, str], sources: dict[Path, RunStore], run_id: str) -> int:
        count = 0
        for item in plan:
            source = self.entries.get(item.key)
            previous = latest.get(item.key)
            if source is None or (previous is not None and previous.status.terminal):
                continue
            if not self._same_task(source, item.task):
                continue
            attempt = previous.attempt + 1 if previous is not None else 1
            copy = source.rollout.model_copy(update={
                "id": rollout_id(run_id, item.key, attempt), "attempt": attempt, "variant": item.variant.name,
                "split": item.task.split,
            })
            if source.run.path not in sources:
                sources[source.run.path] = source.run.open_store(read_only=True)
            calls = [c.model_copy(update={"rollout_id": copy.id}) for c in sources[source.run.path].calls(source.rollout.id)]
            # Marked before the row lands: a crash in between leaves a mark without a row (harmless), never a
            # copied row that the budget would count as paid for by this study.
            imported[copy.id] = source.run.run_id
            store.set_meta(IMPORTED_META, imported)
            store.insert_calls(calls)
            store.put_rollout(copy)
            latest[item.key] = copy
            count += 1
        return count

    def explain(self, spec: ExperimentSpec, store: RunStore, plan: list[PlannedRollout], *,
                current: AgentVersion | None) -> ReuseReport:
        """After `import_into`: how many planned rollouts were copied from earlier runs, and why each one this
        store still has to run was not."""
        latest = {r.key: r for r in store.rollouts(latest_only=True)}
        sources = store.get_meta(IMPORTED_META, {})
        report = ReuseReport(enabled=True)
        report.reused = sum(1 for item in plan if (r := latest.get(item.key)) is not None and r.id in sources)
        pending = [item for item in plan if not ((r := latest.get(item.key)) is not None and r.status.terminal)]
        if not pending:
            return report
        if self._history is None:
            self._history = History(self.runs_root, exclude=self.exclude)
        report.earlier_runs = self._history.runs
        for item in pending:
            same: tuple[str, Rollout, bool] | None = None
            if item.key in self.entries:
                same = (self.entries[item.key].run.run_id, self.entries[item.key].rollout, True)
            elif item.key in self.unusable:
                same = (self.unusable[item.key].run.run_id, self.unusable[item.key].rollout, False)
            miss = why_not(spec=spec, variant=item.variant.name, settings=item.variant.settings, key=item.key,
                           task_id=item.task.id, seed=item.seed, same_version=same, history=self._history,
                           current=current,
                           failure_reusable=not self.reuse_failures and same is not None
                           and reusable(same[1], reuse_failures=True))
            report.misses[item.key] = (item.variant.name, miss)
        return report


__all__ = ["IMPORTED_META", "AgentVersion", "ResultCache", "agent_version", "describe_agent", "imported_ids",
           "task_hash"]

