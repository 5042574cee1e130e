"""The result cache: a finished rollout is reused whenever (variant, task, seed, agent version) is the same.

The variant is its hash (file-valued options hash by content); the task must have the same content, checked
against the `task.json` the earlier rollout ran on; the agent version is:

    sha256 of the spec's `agent`, `grader`, `model` and `upstreams` sections, plus the state of the spec's folder:
    in git, the tree hash of that folder at HEAD, and when the folder has uncommitted changes also a hash of
    `git diff HEAD` and of the untracked files' contents (`.agl/` and `agl.best.yaml` excluded: agl writes them).
    Outside git only the spec sections count, so an edit to the agent's code is not seen: use --no-cache then.

Every run directory whose manifest records the same `agent_version` is a source. Only scored rollouts are reused:
a failure may have had a cause outside the agent (an upstream that was down, a full disk) and run differently
now. With `reuse_failures`, failures that are the variant's own doing are reused too (timed out, agent crashed, no
output); grader failures, infrastructure failures and interrupted attempts never are.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agl_cli.evaluation import PlannedRollout, rollout_id
from agl_cli.run_spend import IMPORTED_META, imported_ids
from agl_cli.rundir import RunDir, RunsIndex, read_stores
from agl_cli.spec import ExperimentSpec
from agl_cli.tasks import Task
from rl_backend.store.db import RunStore
from rl_backend.store.records import FailureKind, Rollout

REUSABLE_FAILURES = {FailureKind.agent_crashed, FailureKind.agent_timeout, FailureKind.no_output}
_EXCLUDE = (":(exclude).agl", ":(exclude)**/.agl/**", ":(exclude)agl.best.yaml")


def _git(folder: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode("utf-8", errors="replace") if out.returncode == 0 else None


def source_state(folder: Path) -> str:
    """`git:<tree>` for a clean folder, `git:<tree>+dirty:<hash>` with local changes, `nogit` outside git."""
    top = _git(folder, "rev-parse", "--show-toplevel")
    if top is None:
        return "nogit"
    relative = folder.resolve().relative_to(Path(top.strip()).resolve()).as_posix()
    tree = _git(folder, "rev-parse", f"HEAD:{relative}" if relative != "." else "HEAD^{tree}")
    if tree is None:
        tree = "uncommitted"
    state = f"git:{tree.strip()}"
    status = _git(folder, "status", "--porcelain", "--untracked-files=all", "--", ".", *_EXCLUDE)
    if not status or not status.strip():
        return state
    digest = hashlib.sha256()
    digest.update((_git(folder, "diff", "HEAD", "--", ".", *_EXCLUDE) or "").encode())
    untracked = _git(folder, "ls-files", "--others", "--exclude-standard", "--", ".", *_EXCLUDE) or ""
    for name in sorted(untracked.splitlines()):
        path = folder / name
        digest.update(name.encode())
        if path.is_file():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return f"{state}+dirty:{digest.hexdigest()[:16]}"


def agent_version(spec: ExperimentSpec) -> str:
    material = {
        "agent": spec.agent.model_dump(mode="json"),
        "grader": spec.grader.model_dump(mode="json"),
        "model": spec.model,
        "upstreams": {name: u.model_dump(mode="json") for name, u in sorted(spec.upstreams.items())},
        "source": source_state(spec.base_dir),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


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
        self.entries: dict[str, _Source] = {}
        runs = RunsIndex.scan(runs_root).select(agent_version=version, with_store=True, exclude=exclude)
        # A damaged run is no source; the run that uses the cache must not fail for it.
        for entry, store in read_stores(runs):
            for rollout in store.rollouts(latest_only=True):
                if reusable(rollout, reuse_failures=reuse_failures):
                    self.entries.setdefault(rollout.key, _Source(entry.run, rollout))

    def __len__(self) -> int:
        return len(self.entries)

    def _same_task(self, source: _Source, task: Task) -> bool:
        task_file = source.run.path / "rollouts" / source.rollout.id / "task.json"
        try:
            return task_hash(json.loads(task_file.read_text())) == task_hash(task.data)
        except (OSError, json.JSONDecodeError):
            return False

    def import_into(self, store: RunStore, plan: list[PlannedRollout]) -> int:
        """Copy the cached results of planned keys this store has not finished; returns how many were copied."""
        if not self.entries:
            return 0
        latest = {r.key: r for r in store.rollouts(latest_only=True)}
        imported: dict[str, str] = store.get_meta(IMPORTED_META, {})
        sources: dict[Path, RunStore] = {}
        try:
            return self._import(store, plan, latest, imported, sources)
        finally:
            for opened in sources.values():
                opened.close()

    def _import(self, store: RunStore, plan: list[PlannedRollout], latest: dict[str, Rollout],
                imported: dict[str, str], sources: dict[Path, RunStore]) -> int:
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
                "id": rollout_id(item.key, attempt), "attempt": attempt, "variant": item.variant.name,
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


__all__ = ["IMPORTED_META", "ResultCache", "agent_version", "imported_ids", "source_state", "task_hash"]

