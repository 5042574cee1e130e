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
    price: Annotated[str | None, typer.Option(
        help="The default model's price in USD per 1M tokens: INPUT,OUTPUT[,CACHED_INPUT]. Asked for (on a "
             "terminal) when agl knows no price for the model and it is not embedded.")] = None,
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
    price_text = _price(model, price)
    text = render(
        "agl.yaml.j2",
        study_name=name or out.resolve().parent.name or "experiment",
        agent_command=agent,
        tasks_path=tasks,
        grader_command=grader,
        split_field=split_field,
        model=model,
        price=price_text,
        timeout_s=f"{timeout_s:g}",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if price_text is None and _needs_price(model):
        stderr_console().print(f"note: agl knows no price for {model}: its calls will show an unknown cost until "
                               f"you add it under `prices:` in {out} (or pass --price INPUT,OUTPUT)")
    stderr_console().print(f"wrote {out}; next: agl eval {out} --limit 10")


def _needs_price(model: str) -> bool:
    """A model on an upstream other than the starter's embedded one, with no shipped price."""
    from rl_backend.gateway.pricing import PriceTable

    upstream, _, name = model.partition("/")
    return upstream != "local" and PriceTable().lookup(name or upstream) is None


def _price(model: str, given: str | None) -> str | None:
    """The `prices:` entry for the default model, as YAML flow text: from --price, else asked for on a terminal
    when agl knows no price for the model; None when there is none to write."""
    import sys

    from agl_cli.errors import UsageError

    if given is None:
        if not (_needs_price(model) and sys.stdin.isatty()):
            return None
        given = ",".join(
            typer.prompt(f"{model}: USD per 1M {kind} tokens (empty: unknown)", default="", show_default=False)
            for kind in ("input", "output", "cached input")
        ).rstrip(",")
        if not given.replace(",", "").strip():
            return None
    parts = [p.strip() for p in given.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (2, 3) or any(v < 0 for v in values):
        raise UsageError(f"--price {given!r}: write INPUT,OUTPUT[,CACHED_INPUT] in USD per 1M tokens, e.g. 0.15,0.6")
    fields = dict(zip(("input", "output", "cached_input"), values, strict=False))
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in fields.items()) + "}"
