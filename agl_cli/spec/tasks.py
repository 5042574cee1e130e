"""Task sets: JSONL files of task objects, their ids, and their train/val/test splits."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

from agl_cli.errors import ConfigError
from agl_cli.spec.schema import NEAR_DUPLICATES, ExperimentSpec, SplitByField, SplitByFractions
from rl_backend.gateway.jsonfast import deeper_than


@dataclass(frozen=True)
class Task:
    id: str
    data: dict[str, Any]
    split: str | None
    line: int

    @property
    def content_hash(self) -> str:
        """The task's content (its JSON object, keys sorted): two tasks with one id and different content differ."""
        return hashlib.sha256(json.dumps(self.data, sort_keys=True).encode()).hexdigest()[:16]


def _split_by_fractions(ids: list[str], split: SplitByFractions) -> dict[str, str]:
    # Sort first so the assignment depends only on the set of ids and the seed, not the file's order.
    order = sorted(ids)
    random.Random(split.seed).shuffle(order)
    names = list(split.fractions)
    assignment: dict[str, str] = {}
    start = 0
    for i, name in enumerate(names):
        end = len(order) if i == len(names) - 1 else start + round(split.fractions[name] * len(order))
        for task_id in order[start:end]:
            assignment[task_id] = name
        start = end
    return assignment


def split_groups(groups: list[list[str]], split: SplitByFractions) -> dict[str, str]:
    """Whole groups of task ids to splits: the groups in a seeded order, each to the split whose share of the
    tasks its middle falls in, so the shares hold to within a group's size. Depends only on the groups (as sets)
    and the seed."""
    order = sorted((sorted(group) for group in groups if group), key=lambda group: group[0])
    random.Random(split.seed).shuffle(order)
    total = sum(len(group) for group in order)
    bounds, cumulative = [], 0.0
    for name, share in split.fractions.items():
        cumulative += share * total
        bounds.append((cumulative, name))
    assignment: dict[str, str] = {}
    seen = 0
    for group in order:
        middle = seen + len(group) / 2
        name = next((n for bound, n in bounds if middle < bound), bounds[-1][1])
        assignment.update((task_id, name) for task_id in group)
        seen += len(group)
    return assignment


def group_tasks(tasks: list[Task], spec: ExperimentSpec, group_by: str) -> list[list[str]]:
    """The groups `tasks.split.group_by` keeps together: by a field's value, or clusters of near-duplicates."""
    if group_by == NEAR_DUPLICATES:
        from agl_cli.spec.near_duplicates import clusters

        return clusters(tasks, skip={spec.tasks.id_field})
    path = spec.resolve(spec.tasks.path)
    groups: dict[str, list[str]] = {}
    for task in tasks:
        if group_by not in task.data:
            raise ConfigError(f"{path}:{task.line}: task {task.id!r} has no {group_by!r} field, which "
                              "`tasks.split.group_by` groups by",
                              hint=f"give every task that field, or group by `{NEAR_DUPLICATES}`")
        groups.setdefault(json.dumps(task.data[group_by], sort_keys=True), []).append(task.id)
    return list(groups.values())


MAX_TASK_DEPTH = 200  # far deeper than any task; shallow enough that every JSON encoder agl uses on it succeeds


def load_tasks(spec: ExperimentSpec) -> list[Task]:
    path = spec.resolve(spec.tasks.path)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})",
                hint="each line of a task file is one JSON object",
            ) from None
        except (ValueError, RecursionError) as exc:  # a number of over 4300 digits; nesting past Python's stack
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise ConfigError(f"{path}:{number}: cannot be read ({reason})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}:{number}: expected a JSON object, found {type(data).__name__}")
        if deeper_than(data, MAX_TASK_DEPTH):
            raise ConfigError(f"{path}:{number}: the task is nested more than {MAX_TASK_DEPTH} levels deep")
        raw_id = data.get(spec.tasks.id_field, number)
        if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or (isinstance(raw_id, str) and not raw_id):
            raise ConfigError(
                f"{path}:{number}: the task id (field {spec.tasks.id_field!r}) must be a non-empty string or an "
                f"integer, found {json.dumps(raw_id)[:80]}",
                hint="give every task a short id such as \"t17\"; leave the field out to use the line number",
            )
        task_id = str(raw_id)
        if task_id in seen:
            raise ConfigError(f"{path}:{number}: task id {task_id!r} already used on line {seen[task_id]}")
        seen[task_id] = number
        split: str | None = None
        if isinstance(spec.tasks.split, SplitByField):
            value = data.get(spec.tasks.split.field)
            if value is None:
                raise ConfigError(
                    f"{path}:{number}: task {task_id!r} has no {spec.tasks.split.field!r} field, "
                    "which `tasks.split.field` says holds its split"
                )
            split = str(value)
        tasks.append(Task(id=task_id, data=data, split=split, line=number))
    if not tasks:
        raise ConfigError(f"{path}: no tasks in the file")
    if isinstance(spec.tasks.split, SplitByFractions):
        group_by = spec.tasks.split.group_by
        assignment = split_groups(group_tasks(tasks, spec, group_by), spec.tasks.split) if group_by else \
            _split_by_fractions([t.id for t in tasks], spec.tasks.split)
        tasks = [Task(id=t.id, data=t.data, split=assignment[t.id], line=t.line) for t in tasks]
    return tasks


def split_names(split: str) -> list[str]:
    """`val` or several splits at once, `val,train` (to pool evidence from splits a change was not tuned on)."""
    return [name.strip() for name in split.split(",") if name.strip()]


def select_tasks(tasks: list[Task], *, split: str | None, limit: int | None) -> list[Task]:
    chosen = tasks
    if split is not None:
        available = sorted({t.split for t in tasks if t.split is not None})
        if not available:
            raise ConfigError(f"--split {split}: the spec defines no splits (add `tasks.split`)")
        wanted = split_names(split)
        unknown = [name for name in wanted if name not in available]
        if unknown or not wanted:
            raise ConfigError(f"--split {split}: no task is in split {', '.join(unknown) or '(none named)'}; the "
                              f"splits are {', '.join(available)}")
        chosen = [t for t in tasks if t.split in wanted]
    if limit is not None:
        chosen = chosen[:limit]
    return chosen


def task_set_hash(tasks: list[Task]) -> str:
    digest = hashlib.sha256()
    for task in tasks:
        digest.update(json.dumps(task.data, sort_keys=True).encode())
    return digest.hexdigest()[:16]
