"""`agl init`: write a starter agl.yaml, each key explained in a comment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from agl_cli.cli_support import handle_errors

SMOKE_TASKS = 3  # the first run's size, as the skill says: enough to see every part work, cheap on a paid API


@handle_errors
def init_command(
    agent: Annotated[str, typer.Option(help="The agent's command; use {task_file} and {output_file}.")] = (
        "python agent.py --task {task_file} --out {output_file}"
    ),
    tasks: Annotated[str, typer.Option(help="The task file (JSONL).")] = "tasks.jsonl",
    grader: Annotated[str, typer.Option(help="The grader's command.")] = "python grade.py {task_file} {output_file}",
    name: Annotated[str | None, typer.Option(help="Study name (default: the folder's name).")] = None,
    split_field: Annotated[str | None, typer.Option(help="Task field holding the split.")] = None,
    model: Annotated[str | None, typer.Option(help="Default upstream/model (default: the first of --models, else "
                                              "local/smollm2-135m-instruct).")] = None,
    price: Annotated[str | None, typer.Option(
        help="The default model's price in USD per 1M tokens: INPUT,OUTPUT[,CACHED_INPUT]. Asked for (on a "
             "terminal) when agl knows no price for the model and it is not embedded.")] = None,
    timeout_s: Annotated[float, typer.Option(help="Per-rollout timeout in seconds.")] = 120.0,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write it.")] = Path("agl.yaml"),
    force: Annotated[bool, typer.Option(help="Overwrite an existing file.")] = False,
    upstream: Annotated[str | None, typer.Option(help="The hosted API the agent calls (its base URL, e.g. "
                                                 "https://api.example.com/v1), instead of the embedded model.")] = None,
    models: Annotated[str | None, typer.Option(help="With --upstream: the models it serves, comma-separated; the "
                                               "first is the default, and two or more become a `model` knob.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="With --upstream: the variable holding its API key "
                                                    "(default OPENAI_API_KEY, or ANTHROPIC_API_KEY for Anthropic).")] = None,
) -> None:
    """Write a starter agl.yaml for an agent command."""
    from agl_cli.console import stderr_console
    from agl_cli.errors import UsageError
    from agl_cli.spec import AgentSpec, GraderSpec
    from agl_cli.templates import render

    if out.exists() and not force:
        raise UsageError(f"{out} already exists", hint="pass --force to overwrite it, or --out to write elsewhere")
    hosted = _hosted_upstream(upstream, models, api_key_env)
    for label, check in (("--agent", lambda: AgentSpec(command=agent)), ("--grader", lambda: GraderSpec(command=grader))):
        try:
            check()
        except ValueError as exc:
            raise UsageError(f"{label}: {str(exc).splitlines()[-1].strip()}") from None
    model = model or (f"{hosted['name']}/{hosted['models'][0]}" if hosted else "local/smollm2-135m-instruct")
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
        hosted=hosted,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text.rstrip("\n") + "\n")
    if price_text is None and _needs_price(model):
        stderr_console().print(f"note: agl knows no price for {model}: its calls will show an unknown cost until "
                               f"you add it under `prices:` in {out} (or pass --price INPUT,OUTPUT)", markup=False)
    stderr_console().print(f"wrote {out}; next, a smoke test: agl eval {out} --limit {SMOKE_TASKS}", markup=False)


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


def _hosted_upstream(url: str | None, models: str | None, api_key_env: str | None) -> dict[str, Any] | None:
    """The `upstreams:` entry for a hosted API: its kind from the URL, its name, key variable and models."""
    import json
    from urllib.parse import urlparse

    from agl_cli.errors import UsageError

    names = [m.strip() for m in (models or "").split(",") if m.strip()]
    if url is None:
        if names or api_key_env:
            raise UsageError("--models and --api-key-env describe a hosted API: give its URL with --upstream")
        return None
    host = urlparse(url).hostname or ""
    if urlparse(url).scheme not in ("http", "https") or not host:
        raise UsageError(f"--upstream {url!r}: give the API's base URL, e.g. https://api.example.com/v1")
    if not names:
        raise UsageError("--upstream needs the models it serves: --models MODEL[,MODEL...] (the first is the default)")
    kind, name = ("anthropic", "anthropic") if host.endswith("anthropic.com") else \
        ("openai", "openai") if host == "api.openai.com" else ("openai-compatible", "hosted")
    key = api_key_env or ("ANTHROPIC_API_KEY" if kind == "anthropic" else "OPENAI_API_KEY")
    if not key.isidentifier():
        raise UsageError(f"--api-key-env {key!r}: give an environment variable's name, e.g. OPENAI_API_KEY")
    return {"name": name, "kind": kind, "entry": f"{{kind: {kind}, base_url: {json.dumps(url)}, api_key_env: {key}}}",
            "models": names, "model_values": [f"{name}/{m}" for m in names]}
