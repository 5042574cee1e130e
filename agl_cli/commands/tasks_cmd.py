"""`agl tasks CONFIG`: the task set as agl splits it: how many tasks each split holds, and held-out tasks that
nearly repeat a task of another split (a shared subject line, nearly the same text), which flatter every
comparison made on them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors

FEW_VAL_TASKS = 100  # below this a val split sees only large effects (the skill's setup reference says what to do)


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
    from agl_cli.near_duplicates import find
    from agl_cli.spec import SplitByField, load_spec
    from agl_cli.tasks import load_tasks

    if not 0.0 < threshold <= 1.0:
        raise UsageError(f"--threshold must be in (0, 1], got {threshold:g}")
    if limit < 0:
        raise UsageError(f"--limit must be at least 0, got {limit}")
    spec = load_spec(config)
    tasks = load_tasks(spec)
    sizes = Counter(t.split or "(none)" for t in tasks)
    skip = {spec.tasks.id_field} | ({spec.tasks.split.field} if isinstance(spec.tasks.split, SplitByField) else set())
    found = find(tasks, skip=skip, threshold=threshold, fields=field) if any(t.split for t in tasks) else None
    document: dict[str, Any] = {
        "spec": str((config / "agl.yaml" if config.is_dir() else config).resolve()), "tasks": len(tasks),
        "splits": dict(sorted(sizes.items())),
        "near_duplicates": found.as_json(limit) if found else None,
    }
    if json_output:
        print_json(document)
        return
    typer.echo(f"{len(tasks)} tasks: " + ", ".join(f"{name} {n}" for name, n in sorted(sizes.items())))
    if found is None:
        typer.echo("no splits defined (tasks.split in agl.yaml): nothing to check across splits")
        return
    if sizes.get("val", 0) and sizes["val"] < FEW_VAL_TASKS:
        typer.echo(f"val has {sizes['val']} tasks: only large differences are detectable; with a small task set "
                   "give val and test a larger share (e.g. 20/40/40) and try fewer candidates")
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
    typer.echo("keep near-duplicates in one split (e.g. split by a field that groups them: tasks.split.field) "
               "before the baseline; moving tasks later changes what was measured")
