"""Like with like: a run records the content hash of every task it plans (in its store), so that a resume after the
task file changed, or a comparison of two runs whose task files share ids, is refused with the tasks that differ
named, instead of mixing or pairing answers to different questions.

A run made before agl recorded these hashes has only its manifest's `tasks_hash` (of the whole task set): that
still tells that the set changed, but not which tasks; with neither, nothing can be checked, and callers say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agl_cli.errors import UsageError
from agl_cli.runs.rundir import RunDir
from agl_cli.spec.tasks import Task, task_set_hash
from rl_backend.store.db import RunStore

SHOWN = 5  # task ids named in a message; the JSON lists more


def _named(ids: Sequence[str]) -> str:
    from agl_cli.console import safe_text

    shown = ", ".join(safe_text(i) for i in ids[:SHOWN])
    return shown + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")


def changed_tasks(recorded: Mapping[str, str], tasks: Iterable[Task]) -> list[str]:
    """The ids of `tasks` whose content is not what the run recorded for them."""
    return [t.id for t in tasks if t.id in recorded and recorded[t.id] != t.content_hash]


def check_and_record(store: RunStore, run: RunDir, manifest: Mapping[str, Any], tasks: Sequence[Task], *,
                     tasks_path: str, start_again: str) -> None:
    """Before a run (new or resumed) runs anything: refuse when its tasks' content changed since it started, else
    record each task's hash. `tasks` are the run's tasks in the manifest's order; `start_again` the command that
    starts a new run instead."""
    recorded = store.task_hashes()
    hint = (f"resuming would mix answers to the old and the new tasks in one run: restore {tasks_path} as it was, "
            f"or start a new run ({start_again})")
    if recorded:
        changed = changed_tasks(recorded, tasks)
        if changed:
            raise UsageError(f"run {run.run_id}: {len(changed)} of its {len(tasks)} tasks changed in {tasks_path} "
                             f"since it started: {_named(changed)}", hint=hint)
    else:
        old = manifest.get("tasks_hash")
        if isinstance(old, str) and old != task_set_hash(list(tasks)):
            raise UsageError(f"run {run.run_id}: its tasks changed in {tasks_path} since it started (the run is older "
                             "than agl's per-task hashes, so which tasks is not known)", hint=hint)
    store.put_task_hashes({t.id: t.content_hash for t in tasks})


@dataclass(frozen=True)
class Pairing:
    """What is known about the content of the task ids two runs share."""

    shared: int  # task ids both sides have
    differing: list[str]  # shared ids whose content differs (known from per-task hashes)
    set_differs: bool  # the runs' whole task sets differ, which ids unknown (runs without per-task hashes)
    unchecked: list[str]  # the labels of sides that record nothing to check against

    @property
    def mismatched(self) -> bool:
        return bool(self.differing) or self.set_differs

    def warnings(self, candidate: str) -> list[str]:
        """What a person must know about pairing `candidate` by id: unchecked sides, or differences let through."""
        lines = []
        if self.unchecked:
            lines.append(f"{', '.join(self.unchecked)} records no per-task content (made by an older agl): agl cannot "
                         "check that the tasks paired by id are the same tasks")
        if self.differing:
            lines.append(f"{candidate}: paired by id although {len(self.differing)} of the {self.shared} shared tasks "
                         f"differ in content ({_named(self.differing)})")
        elif self.set_differs:
            lines.append(f"{candidate}: paired by id although the two task sets differ")
        return lines

    def as_json(self) -> dict[str, Any]:
        return {"shared_task_ids": self.shared, "checked": not self.unchecked, "differing": len(self.differing),
                "differing_ids": self.differing[:50], "task_sets_differ": self.set_differs}


@dataclass(frozen=True)
class RunTasks:
    """One side of a pairing: its label, the task ids it has rollouts of, its recorded hashes and its manifest."""

    label: str
    task_ids: set[str]
    hashes: Mapping[str, str]
    manifest: Mapping[str, Any]


def run_tasks(run: RunDir, task_ids: set[str], label: str | None = None) -> RunTasks:
    """A run's side of a pairing, read from its store (read only) and manifest (a damaged one counts as empty)."""
    store = run.open_store(read_only=True)
    try:
        hashes = store.task_hashes()
    finally:
        store.close()
    try:
        manifest: Mapping[str, Any] = run.manifest()
    except UsageError:
        manifest = {}
    return RunTasks(label or run.run_id, task_ids, hashes, manifest)


def pairing(a: RunTasks, b: RunTasks) -> Pairing:
    shared = a.task_ids & b.task_ids
    if a.hashes and b.hashes:
        differing = sorted(t for t in shared if t in a.hashes and t in b.hashes and a.hashes[t] != b.hashes[t])
        return Pairing(len(shared), differing, False, [])
    unchecked = [s.label for s in (a, b) if not s.hashes]
    # Without per-task hashes, two manifests over the very same task ids can still tell their sets apart.
    ids_a, ids_b = a.manifest.get("task_ids"), b.manifest.get("task_ids")
    hash_a, hash_b = a.manifest.get("tasks_hash"), b.manifest.get("tasks_hash")
    set_differs = (isinstance(ids_a, list) and ids_a == ids_b and isinstance(hash_a, str) and isinstance(hash_b, str)
                   and hash_a != hash_b)
    return Pairing(len(shared), [], set_differs, [] if set_differs else unchecked)


def refuse_mismatch(a: RunTasks, b: RunTasks, found: Pairing, *, flag: str | None) -> None:
    """UsageError (exit 2) naming the differing tasks; `flag` is the option that pairs them anyway, if any."""
    if found.differing:
        what = (f"{b.label} and {a.label} share {found.shared} task ids, but {len(found.differing)} of them hold "
                f"different tasks: {_named(found.differing)}")
    else:
        what = (f"{b.label} and {a.label} ran the same task ids from different task files (their task sets' hashes "
                "differ; these runs are too old to say which tasks)")
    hint = "compare runs of the same task file"
    raise UsageError(what + ": pairing them would compare answers to different questions",
                     hint=hint + (f", or pass {flag} to pair them by id anyway" if flag else ""))
