"""`agl tasks CONFIG`: the task set as agl splits it: how many tasks each split holds, and held-out tasks that
nearly repeat a task of another split (a shared subject line, nearly the same text), which flatter every
comparison made on them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors

if TYPE_CHECKING:
    from agl_cli.spec.schema import ExperimentSpec
    from agl_cli.spec.tasks import Task

FEW_VAL_TASKS = 100  # below this a val split sees only large effects (the skill's setup reference says what to do)
LARGE_HELD_OUT_SHARE = 0.4  # val and test at 40% each (20/40/40): no larger share to advise


@handle_errors
def tasks_command(
    config: Annotated[Path, typer.Argument(help="The experiment spec (agl.yaml or its folder).", show_default=False)],
    threshold: Annotated[float, typer.Option(help="Text similarity (Jaccard of word trigrams, 0-1) from which two "
                                             "tasks count as near-duplicates.")] = 0.8,
    field: Annotated[Optional[list[str]], typer.Option("--field", help="Check only this field for shared values; "  # noqa: UP045
                                                       "repeatable (default: every text field that is no category).")] = None,  # noqa: E501
    limit: Annotated[int, typer.Option(help="Examples of each kind to list.")] = 10,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Check the task set: split sizes, and near-duplicate tasks across splits."""
    from agl_cli.console import print_json
    from agl_cli.errors import UsageError
    from agl_cli.spec.near_duplicates import find
    from agl_cli.spec.schema import SplitByField, load_spec
    from agl_cli.spec.tasks import load_tasks

    if not 0.0 < threshold <= 1.0:
        raise UsageError(f"--threshold must be in (0, 1], got {threshold:g}")
    if limit < 0:
        raise UsageError(f"--limit must be at least 0, got {limit}")
    spec = load_spec(config)
    tasks = load_tasks(spec)
    sizes = Counter(t.split or "(none)" for t in tasks)
    skip = {spec.tasks.id_field} | ({spec.tasks.split.field} if isinstance(spec.tasks.split, SplitByField) else set())
    found = find(tasks, skip=skip, threshold=threshold, fields=field) if any(t.split for t in tasks) else None
    offer = _grouped_split(spec, tasks, sizes, skip, threshold, field) if found and found.affected else None
    document: dict[str, Any] = {
        "spec": str((config / "agl.yaml" if config.is_dir() else config).resolve()), "tasks": len(tasks),
        "splits": dict(sorted(sizes.items())),
        "near_duplicates": found.as_json(limit) if found else None,
        "advice": _size_advice(sizes, len(tasks)),
        "grouped_split": offer,
    }
    if json_output:
        print_json(document)
        return
    typer.echo(f"{len(tasks)} tasks: " + ", ".join(f"{name} {n}" for name, n in sorted(sizes.items())))
    if found is None:
        typer.echo("no splits defined (tasks.split in agl.yaml): nothing to check across splits")
        return
    if document["advice"]:
        typer.echo(document["advice"])
    checked = ", ".join(found.fields_checked) or "none"
    if not found.affected:
        typer.echo(f"no near-duplicates across splits (fields compared: {checked}; text similarity >= {threshold:g})")
        return
    for split, ids in sorted(found.affected.items()):
        where = ", ".join(f"{len(found.across[split][o])} one of {o}" for o in sorted(found.across[split]))
        typer.echo(f"{split}: {len(ids)} of {sizes[split]} tasks nearly repeat a task of another split ({where})")
    for shared in found.shared[:limit]:
        where = "; ".join(f"{s}: {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}"
                          for s, ids in shared.task_ids.items())
        typer.echo(f"  same {shared.field} {shared.value[:80]!r}: {where}")
    for pair in found.similar[:limit]:
        typer.echo(f"  similar {pair.field} ({pair.similarity:.2f}): {pair.a_split} {pair.a} ~ {pair.b_split} {pair.b}")
    if offer is None:
        typer.echo("the split already keeps each cluster of near-duplicates together (at text similarity 0.8); these "
                   "remain at the threshold and fields asked for")
        return
    typer.echo("keep near-duplicates in one split before the baseline (moving tasks later changes what was "
               "measured): in agl.yaml,")
    typer.echo(offer["yaml"].rstrip("\n"))
    after = offer["near_duplicates_across_splits"]
    typer.echo("  with it: " + ", ".join(f"{name} {n}" for name, n in offer["splits"].items()) + "; "
               + ("no task nearly repeats a task of another split" if not after else
                  f"{after} tasks still nearly repeat one of another split at this threshold"))


def _size_advice(sizes: Counter[str], total: int) -> str | None:
    """What a small val split means, and the larger share to give it only when it does not have one already."""
    val, test = sizes.get("val", 0), sizes.get("test", 0)
    if not val or val >= FEW_VAL_TASKS:
        return None
    held_out = min(val, test) if test else val
    text = f"val has {val} tasks: only large differences are detectable"
    if held_out / total < LARGE_HELD_OUT_SHARE - 0.02:
        return (text + "; with a small task set give val and test a larger share (e.g. 20/40/40: split: {fractions: "
                "{train: 0.2, val: 0.4, test: 0.4}, seed: 0}) and try fewer candidates")
    return (text + f"; val and test already hold {round(100 * val / total)}% and {round(100 * test / total)}% of "
            "the tasks, so more tasks (not a larger share) would let smaller differences show; meanwhile try fewer "
            "candidates")


def _grouped_split(spec: ExperimentSpec, tasks: list[Task], sizes: Counter[str], skip: set[str], threshold: float,
                   fields: list[str] | None) -> dict[str, Any] | None:
    """The `tasks.split` that keeps each near-duplicate cluster in one split, as agl.yaml lines, and what it gives:
    the split sizes and the near-duplicates left across splits. None when the spec already groups that way."""
    import json

    from agl_cli.spec.near_duplicates import find
    from agl_cli.spec.schema import NEAR_DUPLICATES, SplitByFractions
    from agl_cli.spec.tasks import Task, group_tasks, split_groups

    current = spec.tasks.split
    if isinstance(current, SplitByFractions):
        if current.group_by == NEAR_DUPLICATES:
            return None
        fractions, seed = dict(current.fractions), current.seed
    else:  # a split field: the same shares, now drawn by cluster
        named = {name: n for name, n in sizes.items() if name != "(none)"}
        fractions = {name: round(n / sum(named.values()), 2) for name, n in named.items()}
        largest = max(fractions, key=lambda name: fractions[name])
        fractions[largest] = round(fractions[largest] + 1 - sum(fractions.values()), 2)
        seed = 0
    split = SplitByFractions(fractions=fractions, seed=seed, group_by=NEAR_DUPLICATES)
    assignment = split_groups(group_tasks(tasks, spec, NEAR_DUPLICATES), split)
    regrouped = [Task(id=t.id, data=t.data, split=assignment[t.id], line=t.line) for t in tasks]
    left = find(regrouped, skip=skip, threshold=threshold, fields=fields)
    shares = ", ".join(f"{name}: {share:g}" for name, share in fractions.items())
    lines = ["tasks:", f"  path: {json.dumps(spec.tasks.path)}"]
    if spec.tasks.id_field != "id":
        lines.append(f"  id_field: {json.dumps(spec.tasks.id_field)}")
    lines.append(f"  split: {{fractions: {{{shares}}}, seed: {seed}, group_by: {NEAR_DUPLICATES}}}")
    return {
        "split": split.model_dump(), "yaml": "".join(f"  {line}\n" for line in lines),
        "splits": dict(sorted(Counter(assignment.values()).items())),
        "near_duplicates_across_splits": sum(len(ids) for ids in left.affected.values()),
    }
