"""How an undecided comparison could still be decided with the tasks there are.

A change whose paired interval still includes zero is not better, and it is not worse either. When it leans
better (most of its 95% interval above zero) and fits every limit, dropping it in silence loses what may be a real
gain. This module says what would decide it: the splits holding tasks the change was not judged on, how many tasks
pooling them gives, and about how many would likely decide it. The test split is never offered: it confirms a
decision once, after it is made. A split is more evidence only for a lever that was not tuned on it (no few-shot
examples taken from it, no transcripts of it read while writing the change); agl cannot know that, so it says so.

Used by `agl compare` (each undecided comparison's `more_evidence`) and `agl advise` (pending journal entries).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

CONFIRMATION_SPLIT = "test"
LIKELY_LABEL = "likely better, unproven"


def likely_better(mean: float | None, ci95: Sequence[float] | None) -> bool:
    """Undecided but leaning better: a positive difference with at least two thirds of its interval above zero
    ([-0.7, +15.3] is; [-10, +11] is not)."""
    if mean is None or not ci95 or len(ci95) != 2 or mean <= 0:
        return False
    low, high = float(ci95[0]), float(ci95[1])
    return high > 0 and -low <= high / 2


def split_sizes(spec_path: str | None) -> dict[str, list[str]] | None:
    """Task ids by split, from the spec's task file as it is now; None when the spec or its tasks cannot be read
    (then nothing is suggested: a guess about tasks agl cannot see would mislead)."""
    if not spec_path or not Path(spec_path).is_file():
        return None
    from agl_cli.errors import AglError
    from agl_cli.spec.schema import load_spec
    from agl_cli.spec.tasks import load_tasks

    try:
        tasks = load_tasks(load_spec(Path(spec_path)))
    except AglError:
        return None
    by_split: dict[str, list[str]] = {}
    for task in tasks:
        if task.split is not None:
            by_split.setdefault(task.split, []).append(task.id)
    return by_split or None


def evidence(comparison: dict[str, Any], *, split: str | None, judged: Iterable[str],
             splits: dict[str, list[str]] | None, base_variant: str, candidate_variant: str,
             same_run: bool, spec_path: str | None) -> dict[str, Any] | None:
    """`more_evidence` of one comparison document (paired.Comparison.as_dict() plus the candidate): None unless the
    verdict is undecided with a positive difference."""
    from agl_cli.metrics.paired import NO_DIFFERENCE

    diff = comparison.get("difference") or {}
    mean, ci95 = diff.get("mean"), diff.get("ci95")
    if comparison.get("verdict") != NO_DIFFERENCE or not isinstance(mean, (int, float)) or mean <= 0:
        return None
    n = int(comparison.get("n_tasks") or 0)
    more = comparison.get("more_tasks")
    needed = n + int(more) if isinstance(more, int) else None
    doc: dict[str, Any] = {
        "likely_better_unproven": likely_better(mean, ci95),
        "tasks_judged": n,
        "tasks_likely_needed": needed,
        "splits": [],
        "pooled_tasks": n,
        "enough": None,
        "commands": [],
        "note": "a split is more evidence only if the change was not tuned on it: no few-shot examples from it, "
                "no transcripts of it read while writing the change",
    }
    if splits is None:
        doc["note"] = "the spec's task file could not be read: no other split is suggested"
        return doc
    from agl_cli.spec.tasks import split_names

    seen = set(judged)
    compared = split_names(split) if split else []
    extra = []
    # The compared split first, then the other evidence, the confirmation split last.
    for name, ids in sorted(splits.items(), key=lambda kv: (kv[0] not in compared, kv[0] == CONFIRMATION_SPLIT,
                                                            kv[0])):
        unjudged = [t for t in ids if t not in seen]
        if not unjudged:
            continue
        role = "confirmation" if name == CONFIRMATION_SPLIT else "evidence"
        doc["splits"].append({"split": name, "tasks": len(unjudged), "role": role})
        if role == "evidence" and name not in compared:
            extra.append(name)
    doc["pooled_tasks"] = n + sum(s["tasks"] for s in doc["splits"] if s["role"] == "evidence")
    doc["enough"] = None if needed is None else doc["pooled_tasks"] >= needed
    if split and same_run and spec_path and any(s["role"] == "evidence" for s in doc["splits"]):
        pooled = shlex.quote(",".join([*compared, *extra]))
        base, cand = shlex.quote(base_variant), shlex.quote(candidate_variant)
        doc["commands"] = [
            f"agl eval {shlex.quote(_shown(spec_path))} --split {pooled} --variant {base} --variant {cand}",
            f"agl compare {base} {cand} --run NEW_RUN --split {pooled}",
        ]
    return doc


def _shown(path: str) -> str:
    """The spec's path as a person would type it here: relative when it is under the current folder."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def sentence(more: dict[str, Any]) -> str:
    """The line `agl compare` prints under an undecided comparison that leans better."""
    head = LIKELY_LABEL + " (most of the 95% interval is above zero)" if more["likely_better_unproven"] \
        else "undecided, leaning better (but much of the 95% interval is below zero)"
    evidence_splits = [s for s in more["splits"] if s["role"] == "evidence"]
    needed = more["tasks_likely_needed"]
    wanted = f"about {needed} would likely decide it" if needed else "how many would decide it is unknown"
    if evidence_splits:
        named = ", ".join(f"{s['split']} ({s['tasks']} tasks)" for s in evidence_splits)
        text = (f"{head}. More evidence from tasks it was not judged on: {named}, if the change was not tuned on "
                f"them; pooled with the {more['tasks_judged']} judged: {more['pooled_tasks']} tasks ({wanted})")
        if more["commands"]:
            text += f". Run: {more['commands'][0]}; then: {more['commands'][1]} (the judged rollouts are reused)"
    else:
        text = (f"{head}. No other split has tasks it was not judged on ({wanted}): more tasks, or more seeds "
                "where repeats of a task vary")
    confirmation = [s for s in more["splits"] if s["role"] == "confirmation"]
    if confirmation:
        text += f". The {confirmation[0]['split']} split ({confirmation[0]['tasks']} tasks) stays for the confirmation"
    return text
