"""Near-duplicate tasks across splits: a held-out task that repeats a task of another split (the same subject
line, or nearly the same text) measures recall of that task, not generalisation, and flatters every confirmation.

Two checks, both across splits only:
- a shared value: a text field (a subject, a title, a question) whose normalised value is the same in tasks of
  different splits. Fields with few distinct values (labels, categories, expected answers) are left out: sharing
  those is what a task set is made of.
- similar text: each such field, and all of a task's text, as word trigrams; pairs at or above a Jaccard
  similarity threshold (texts of at least MIN_SIMILAR_WORDS words: short ones are the shared-value check's).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from agl_cli.tasks import Task

MIN_VALUE_CHARS = 8  # shorter shared values ("yes", "refund") say little
CATEGORICAL_MAX_DISTINCT = 10  # a field with at most this many distinct values (or 5% of the tasks) is a category
MIN_SIMILAR_WORDS = 6
COMMON_SHINGLE_SHARE = 0.05  # a trigram in more tasks than this is boilerplate, no sign of a duplicate
WHOLE_TASK = "(all of its text)"
_WORDS = re.compile(r"\w+")


def normalise(text: str) -> str:
    return " ".join(_WORDS.findall(text.casefold()))


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


def _text_fields(tasks: list[Task], skip: set[str]) -> list[str]:
    values: dict[str, set[str]] = defaultdict(set)
    for task in tasks:
        for key, value in task.data.items():
            if key not in skip and isinstance(value, str) and len(normalise(value)) >= MIN_VALUE_CHARS:
                values[key].add(normalise(value))
    categorical = max(CATEGORICAL_MAX_DISTINCT, round(0.05 * len(tasks)))
    return sorted(k for k, distinct in values.items() if len(distinct) > categorical)


def _text(task: Task, skip: set[str]) -> str:
    return normalise(" ".join(str(v) for k, v in sorted(task.data.items()) if k not in skip and isinstance(v, str)))


def _shingles(text: str) -> set[str]:
    words = text.split()
    return {" ".join(words[i:i + 3]) for i in range(len(words) - 2)} if len(words) >= MIN_SIMILAR_WORDS else set()


def _similar(texts: dict[str, str], split_of: dict[str, str], threshold: float) -> dict[tuple[str, str], float]:
    """Pairs of tasks in different splits whose texts' trigram sets overlap at least `threshold` (Jaccard). Only
    pairs that share a trigram few tasks have are compared, so the cost grows with the duplicates, not n²."""
    shingles = {task_id: grams for task_id, text in texts.items() if (grams := _shingles(text))}
    postings: dict[str, list[str]] = defaultdict(list)
    for task_id, grams in shingles.items():
        for gram in grams:
            postings[gram].append(task_id)
    common = max(2, round(COMMON_SHINGLE_SHARE * len(split_of)))
    candidates: set[tuple[str, str]] = set()
    for ids in postings.values():
        if len(ids) <= common:
            candidates.update(p for p in combinations(sorted(ids), 2) if split_of[p[0]] != split_of[p[1]])
    found = {}
    for a, b in candidates:
        similarity = len(shingles[a] & shingles[b]) / len(shingles[a] | shingles[b])
        if similarity >= threshold:
            found[(a, b)] = round(similarity, 3)
    return found


def find(tasks: list[Task], *, skip: set[str], threshold: float = 0.8, fields: list[str] | None = None) -> NearDuplicates:
    """Near-duplicates across splits; `skip`: fields that never count (the id and the split field)."""
    split_tasks = [t for t in tasks if t.split is not None]
    checked = fields if fields is not None else _text_fields(split_tasks, skip)
    result = NearDuplicates(fields_checked=checked)
    across: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    # The whole text first: a task repeated many times is caught here even when all its trigrams are common.
    for name in [WHOLE_TASK, *checked]:
        holders: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for task in split_tasks:
            value = _text(task, skip) if name == WHOLE_TASK else task.data.get(name)
            if isinstance(value, str) and len(normalise(value)) >= MIN_VALUE_CHARS:
                holders[normalise(value)][str(task.split)].append(task.id)
        for value, by_split in holders.items():
            if len(by_split) > 1:
                result.shared.append(SharedValue(name, value, {s: ids for s, ids in sorted(by_split.items())}))
                for s, ids in by_split.items():
                    for other in by_split.keys() - {s}:
                        across[s][other].update(ids)
    result.shared.sort(key=lambda s: -sum(len(ids) for ids in s.task_ids.values()))

    split_of = {t.id: str(t.split) for t in split_tasks}
    best: dict[tuple[str, str], tuple[float, str]] = {}
    for name in [WHOLE_TASK, *checked]:
        texts = {t.id: _text(t, skip) if name == WHOLE_TASK else normalise(str(t.data.get(name) or ""))
                 for t in split_tasks}
        for pair, similarity in _similar(texts, split_of, threshold).items():
            if similarity > best.get(pair, (-1.0, ""))[0]:
                best[pair] = (similarity, name)
    for (a, b), (similarity, name) in sorted(best.items()):
        result.similar.append(SimilarPair(name, a, split_of[a], b, split_of[b], similarity))
        across[split_of[a]][split_of[b]].add(a)
        across[split_of[b]][split_of[a]].add(b)
    result.similar.sort(key=lambda p: -p.similarity)
    result.across = {s: dict(others) for s, others in across.items()}
    result.affected = {s: set().union(*others.values()) for s, others in result.across.items()}
    return result
