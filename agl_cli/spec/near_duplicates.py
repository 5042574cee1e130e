"""Near-duplicate tasks: a held-out task that repeats a task of another split (the same subject line, or nearly the
same text) measures recall of that task, not generalisation, and flatters every confirmation.

Two checks:
- a shared value: a text field (a subject, a title, a question) whose normalised value is the same in two tasks.
  Fields with few distinct values (labels, categories, expected answers) are left out: sharing those is what a
  task set is made of.
- similar text: each such field, and all of a task's text, as word trigrams; pairs at or above a Jaccard
  similarity threshold (texts of at least MIN_SIMILAR_WORDS words: short ones are the shared-value check's).

Dates, ids and numbers never make two tasks alike: a whitespace-separated chunk holding a digit (a date, a time,
an id such as TCK-1042, an amount) can tell two tasks apart but never match between them, and a value counts only
for the words it has besides such chunks and the names of months and weekdays. Two tickets filed on the same day
are not alike for it; a date field is no text field.

`find` looks across splits (what `agl tasks` reports); `clusters` groups all tasks, whatever their split, into
sets joined by chains of near-duplicate pairs (what `split: {group_by: near_duplicates}` keeps together).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Protocol


class Task(Protocol):
    """A task as agl_cli.spec.tasks loads it (only what these checks read; agl_cli.spec.tasks groups its split by them)."""

    @property
    def id(self) -> str: ...

    @property
    def data(self) -> dict[str, Any]: ...

    @property
    def split(self) -> str | None: ...

MIN_VALUE_CHARS = 8  # shorter shared values ("yes", "refund") say little
CATEGORICAL_MAX_DISTINCT = 10  # a field with at most this many distinct values (or 5% of the tasks) is a category
MIN_SIMILAR_WORDS = 6
COMMON_SHINGLE_SHARE = 0.05  # a trigram in more tasks than this is boilerplate, no sign of a duplicate
WHOLE_TASK = "(all of its text)"
_WORDS = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")
_DATE_WORDS = frozenset({
    "january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november",
    "december", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "monday",
    "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "mon", "tue", "tues", "wed", "thu", "thur",
    "thurs", "fri", "sat", "sun", "am", "pm", "utc", "gmt",
})


def normalise(text: str) -> str:
    """Lower-case words, the form values are compared in."""
    return " ".join(_WORDS.findall(text.casefold()))


def _says_something(text: str) -> bool:
    """Whether a value has words enough to count, besides chunks with digits and date words."""
    words = (w for chunk in text.casefold().split() if not _DIGIT.search(chunk) for w in _WORDS.findall(chunk))
    return len(" ".join(w for w in words if w not in _DATE_WORDS)) >= MIN_VALUE_CHARS


def _tokens(text: str, owner: str) -> list[str]:
    """The words of `text`, each chunk holding a digit made a token of `owner`'s alone: it never matches another
    task's, whatever its value."""
    out: list[str] = []
    for chunk in text.casefold().split():
        out += [f"\x00{owner}"] if _DIGIT.search(chunk) else _WORDS.findall(chunk)
    return out


@dataclass
class SharedValue:
    field: str
    value: str
    task_ids: dict[str, list[str]]  # split -> ids of the tasks holding that value


@dataclass
class SimilarPair:
    field: str
    a: str
    a_split: str
    b: str
    b_split: str
    similarity: float


@dataclass
class NearDuplicates:
    fields_checked: list[str]
    shared: list[SharedValue] = field(default_factory=list)
    similar: list[SimilarPair] = field(default_factory=list)
    affected: dict[str, set[str]] = field(default_factory=dict)  # split -> its tasks with a near-duplicate elsewhere
    # split -> other split -> its tasks with a near-duplicate in that other split
    across: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def as_json(self, limit: int) -> dict[str, Any]:
        return {
            "fields_checked": self.fields_checked,
            "tasks_with_a_near_duplicate": {s: len(ids) for s, ids in sorted(self.affected.items())},
            "in_each_other_split": {s: {o: len(ids) for o, ids in sorted(others.items())}
                                    for s, others in sorted(self.across.items())},
            "shared_values": [{"field": s.field, "value": s.value, "tasks": s.task_ids} for s in self.shared[:limit]],
            "shared_values_total": len(self.shared),
            "similar_text": [vars(p) for p in self.similar[:limit]],
            "similar_text_total": len(self.similar),
        }


def _text_fields(tasks: Sequence[Task], skip: set[str]) -> list[str]:
    values: dict[str, set[str]] = defaultdict(set)
    for task in tasks:
        for key, value in task.data.items():
            if key not in skip and isinstance(value, str) and _says_something(value):
                values[key].add(normalise(value))
    categorical = max(CATEGORICAL_MAX_DISTINCT, round(0.05 * len(tasks)))
    return sorted(k for k, distinct in values.items() if len(distinct) > categorical)


def _text(task: Task, skip: set[str]) -> str:
    return " ".join(str(v) for k, v in sorted(task.data.items()) if k not in skip and isinstance(v, str))


def _shingles(words: list[str]) -> set[str]:
    return {" ".join(words[i:i + 3]) for i in range(len(words) - 2)} if len(words) >= MIN_SIMILAR_WORDS else set()


def _similar(texts: dict[str, str], side_of: dict[str, str], threshold: float) -> dict[tuple[str, str], float]:
    """Pairs of tasks on different sides (splits) whose texts' trigram sets overlap at least `threshold`
    (Jaccard). Only pairs that share a trigram few tasks have are compared, so the cost grows with the duplicates,
    not n²."""
    shingles = {task_id: grams for task_id, text in texts.items() if (grams := _shingles(_tokens(text, task_id)))}
    postings: dict[str, list[str]] = defaultdict(list)
    for task_id, grams in shingles.items():
        for gram in grams:
            postings[gram].append(task_id)
    common = max(2, round(COMMON_SHINGLE_SHARE * len(side_of)))
    candidates: set[tuple[str, str]] = set()
    for ids in postings.values():
        if len(ids) <= common:
            candidates.update(p for p in combinations(sorted(ids), 2) if side_of[p[0]] != side_of[p[1]])
    found = {}
    for a, b in candidates:
        similarity = len(shingles[a] & shingles[b]) / len(shingles[a] | shingles[b])
        if similarity >= threshold:
            found[(a, b)] = round(similarity, 3)
    return found


def _checks(tasks: Sequence[Task], side_of: Callable[[Task], str], *, skip: set[str], threshold: float,
            fields: list[str] | None) -> tuple[list[str], list[SharedValue], dict[tuple[str, str], tuple[float, str]]]:
    """The fields checked, the values shared across sides, and the similar pairs across sides (with the field)."""
    checked = fields if fields is not None else _text_fields(tasks, skip)
    shared: list[SharedValue] = []
    # The whole text first: a task repeated many times is caught here even when all its trigrams are common.
    for name in [WHOLE_TASK, *checked]:
        holders: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for task in tasks:
            value = _text(task, skip) if name == WHOLE_TASK else task.data.get(name)
            if isinstance(value, str) and _says_something(value):
                holders[normalise(value)][side_of(task)].append(task.id)
        shared += [SharedValue(name, value, {s: ids for s, ids in sorted(by_side.items())})
                   for value, by_side in holders.items() if len(by_side) > 1]
    shared.sort(key=lambda s: -sum(len(ids) for ids in s.task_ids.values()))
    sides = {t.id: side_of(t) for t in tasks}
    best: dict[tuple[str, str], tuple[float, str]] = {}
    for name in [WHOLE_TASK, *checked]:
        texts = {t.id: _text(t, skip) if name == WHOLE_TASK else str(t.data.get(name) or "") for t in tasks}
        for pair, similarity in _similar(texts, sides, threshold).items():
            if similarity > best.get(pair, (-1.0, ""))[0]:
                best[pair] = (similarity, name)
    return checked, shared, best


def find(tasks: Sequence[Task], *, skip: set[str], threshold: float = 0.8, fields: list[str] | None = None) -> NearDuplicates:
    """Near-duplicates across splits; `skip`: fields that never count (the id and the split field)."""
    split_tasks = [t for t in tasks if t.split is not None]
    checked, shared, best = _checks(split_tasks, lambda t: str(t.split), skip=skip, threshold=threshold, fields=fields)
    result = NearDuplicates(fields_checked=checked, shared=shared)
    across: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for value in shared:
        for s, ids in value.task_ids.items():
            for other in value.task_ids.keys() - {s}:
                across[s][other].update(ids)
    split_of = {t.id: str(t.split) for t in split_tasks}
    for (a, b), (similarity, name) in sorted(best.items()):
        result.similar.append(SimilarPair(name, a, split_of[a], b, split_of[b], similarity))
        across[split_of[a]][split_of[b]].add(a)
        across[split_of[b]][split_of[a]].add(b)
    result.similar.sort(key=lambda p: -p.similarity)
    result.across = {s: dict(others) for s, others in across.items()}
    result.affected = {s: set().union(*others.values()) for s, others in result.across.items()}
    return result


def clusters(tasks: Sequence[Task], *, skip: set[str], threshold: float = 0.8) -> list[list[str]]:
    """All tasks in groups, whatever their split: two tasks share a group when a chain of near-duplicate pairs
    (a shared value, similar text) joins them. Each group's ids in file order; a task alone is a group of one."""
    parent = {t.id: t.id for t in tasks}

    def root(task_id: str) -> str:
        while parent[task_id] != task_id:
            parent[task_id] = parent[parent[task_id]]
            task_id = parent[task_id]
        return task_id

    def join(a: str, b: str) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    _, shared, best = _checks(tasks, lambda t: t.id, skip=skip, threshold=threshold, fields=None)
    for value in shared:
        ids = [i for group in value.task_ids.values() for i in group]
        for other in ids[1:]:
            join(ids[0], other)
    for a, b in best:
        join(a, b)
    groups: dict[str, list[str]] = defaultdict(list)
    for task in tasks:
        groups[root(task.id)].append(task.id)
    return list(groups.values())
