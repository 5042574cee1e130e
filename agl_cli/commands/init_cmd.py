"""`agl init`: write a starter agl.yaml, each key explained in a comment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agl_cli.cli_support import handle_errors


@handle_errors
def init_command(
    agent: Annotated[str, typer.Option(help="The agent's command; use {task_file} and {output_file}.")] = (
        "python agent.py --task {task_file} --out {output_file}"
    ),
    tasks: Annotated[str, typer.Option(help="The task file (JSONL).")] = "tasks.jsonl",
    grader: Annotated[str, typer.Option(help="The grader's command.")] = "python grade.py {task_file} {output_file}",
    name: Annotated[str | None, typer.Option(help="Study name (default: the folder's name).")] = None,
    split_field: Annotated[str | None, typer.Option(help="Task field holding the split.")] = None,
    model: Annotated[str, typer.Option(help="Default upstream/model.")] = "local/smollm2-135m-instruct",
    timeout_s: Annotated[float, typer.Option(help="Per-rollout timeout in seconds.")] = 120.0,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write it.")] = Path("agl.yaml"),
    force: Annotated[bool, typer.Option(help="Overwrite an existing file.")] = False,
) -> None:
    """Write a starter agl.yaml for an agent command."""
    from agl_cli.console import stderr_console
    from agl_cli.errors import UsageError
    from agl_cli.spec import AgentSpec, GraderSpec
    from agl_cli.templates import render

    if out.exists() and not force:
        raise UsageError(f"{out} already exists", hint="pass --force to overwrite it, or --out to write elsewhere")
    for label, check in (("--agent", lambda: AgentSpec(command=agent)), ("--grader", lambda: GraderSpec(command=grader))):
        try:
            check()
        except ValueError as exc:
            raise UsageError(f"{label}: {str(exc).splitlines()[-1].strip()}") from None
    text = render(
        "agl.yaml.j2",
        study_name=name or out.resolve().parent.name or "experiment",
        agent_command=agent,
        tasks_path=tasks,
        grader_command=grader,
        split_field=split_field,
        model=model,
        timeout_s=f"{timeout_s:g}",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    stderr_console().print(f"wrote {out}; next: agl eval {out} --limit 10")
