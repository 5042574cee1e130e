"""`agl init`: write a starter agl.yaml, each key explained in a comment.

What it cannot know it asks for on a terminal, and otherwise says it left unset: each paid model's price (every
model of `--models`, not only the default), and the budget in USD. The concurrency is this machine's cores. A hosted
API on a loopback address (a provider's dev API) is written `free: false`: a model the user named is their paid
model unless they say `--free`, and its cost stays unknown, never $0, until it is priced."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors

SMOKE_TASKS = 3  # the first run's size, as the skill says: enough to see every part work, cheap on a paid API
MAX_STARTER_CONCURRENCY = 16  # past this a hosted API's rate limits bite before the cores do
PRICE_FORMAT = "INPUT,OUTPUT[,CACHED_INPUT] in USD per 1M tokens, e.g. 0.15,0.6"


def machine_cores() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _interactive() -> bool:
    return sys.stdin.isatty()


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
    price: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045 - typer reads the annotation
        help="A model's price in USD per 1M tokens: MODEL=INPUT,OUTPUT[,CACHED_INPUT] (MODEL as in --models, or "
             "upstream/model), or INPUT,OUTPUT[,CACHED_INPUT] for the default model; repeat for each model. A paid "
             "model without one is asked for on a terminal, else named in a warning.")] = None,
    budget_usd: Annotated[float | None, typer.Option(
        "--budget-usd", help="The most model spend a run may reach, in USD (budget.usd). Asked for on a terminal "
                             "when a model is paid; otherwise left unset, and said so.")] = None,
    concurrency: Annotated[int | None, typer.Option(
        help=f"Rollouts at once (default: this machine's cores, at most {MAX_STARTER_CONCURRENCY}).")] = None,
    timeout_s: Annotated[float, typer.Option(help="Per-rollout timeout in seconds.")] = 120.0,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write it.")] = Path("agl.yaml"),
    force: Annotated[bool, typer.Option(help="Overwrite an existing file.")] = False,
    upstream: Annotated[str | None, typer.Option(help="The hosted API the agent calls (its base URL, e.g. "
                                                 "https://api.example.com/v1), instead of the embedded model.")] = None,
    models: Annotated[str | None, typer.Option(help="With --upstream: the models it serves, comma-separated; the "
                                               "first is the default, and two or more become a `model` knob.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="With --upstream: the variable holding its API key "
                                                    "(default OPENAI_API_KEY, or ANTHROPIC_API_KEY for Anthropic).")] = None,
    free: Annotated[bool, typer.Option(
        "--free", help="With --upstream: its calls cost nothing (a model you serve yourself). Without it the "
                       "upstream is paid, even on a loopback address, and each model needs a price.")] = False,
) -> None:
    """Write a starter agl.yaml for an agent command."""
    import yaml
    from pydantic import ValidationError

    from agl_cli.console import stderr_console
    from agl_cli.errors import UsageError
    from agl_cli.spec.prices import models_in_use, price_table, unpriced_models
    from agl_cli.spec.schema import AgentSpec, ExperimentSpec, GraderSpec
    from agl_cli.templates import render
    from rl_backend.gateway.resolver import describe

    if out.exists() and not force:
        raise UsageError(f"{out} already exists", hint="pass --force to overwrite it, or --out to write elsewhere")
    if free and upstream is None:
        raise UsageError("--free describes a hosted API's upstream: give its URL with --upstream")
    if budget_usd is not None and budget_usd < 0:
        raise UsageError(f"--budget-usd must be at least 0, got {budget_usd:g}")
    if concurrency is not None and concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1, got {concurrency}")
    hosted = _hosted_upstream(upstream, models, api_key_env, free=free)
    for label, check in (("--agent", lambda: AgentSpec(command=agent)), ("--grader", lambda: GraderSpec(command=grader))):
        try:
            check()
        except ValueError as exc:
            raise UsageError(f"{label}: {str(exc).splitlines()[-1].strip()}") from None
    model = model or (f"{hosted['name']}/{hosted['models'][0]}" if hosted else "local/smollm2-135m-instruct")
    listed = list(dict.fromkeys([model, *(hosted["model_values"] if hosted else [])]))
    prices = _given_prices(price or [], model, listed)
    cores = machine_cores()

    def starter(prices: dict[str, str], budget: float | None) -> str:
        return render(
            "agl.yaml.j2",
            study_name=name or out.resolve().parent.name or "experiment",
            agent_command=agent, tasks_path=tasks, grader_command=grader, split_field=split_field, model=model,
            prices=prices, timeout_s=f"{timeout_s:g}", hosted=hosted,
            concurrency=concurrency or min(cores, MAX_STARTER_CONCURRENCY),
            concurrency_note="" if concurrency else f"this machine's {cores} core{'s' if cores != 1 else ''}"
            + (f", at most {MAX_STARTER_CONCURRENCY}" if cores > MAX_STARTER_CONCURRENCY else ""),
            budget_usd=None if budget is None else f"{budget:g}", hosted_loopback=bool(hosted and hosted["loopback"]),
        ).rstrip("\n") + "\n"

    def costs(prices: dict[str, str]) -> tuple[list[str], bool]:
        """The models that cost money but have no price, and whether any model costs money: by the rule every run
        prices calls by (a model agl ships a price for needs none; an embedded or `free: true` upstream is free)."""
        try:
            spec = ExperimentSpec.model_validate(yaml.safe_load(starter(prices, None)))
        except ValidationError:  # --model names an upstream the file does not declare (said below): no rule to apply
            remote = [m for m in listed if m.partition("/")[0] != "local"]
            return [m for m in remote if m not in prices and _no_shipped_price(m)], bool(remote)
        table = price_table(spec)
        paid = any(not table.is_free(describe(up, spec.upstreams[up]), [name]) for up, name in models_in_use(spec))
        return [f"{up}/{name}" for up, name in unpriced_models(spec)], paid

    missing, paid = costs(prices)
    if _interactive():
        for full in missing:
            asked = _ask_price(full)
            if asked is not None:
                prices[full] = asked
        if budget_usd is None and paid:
            budget_usd = _ask_budget()
        missing, _ = costs(prices)
    text = starter(prices, budget_usd)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    console = stderr_console()
    declared = {hosted["name"]} if hosted else {"local"}
    if "/" in model and model.partition("/")[0] not in declared:
        console.print(f"note: the default model {model} names upstream {model.partition('/')[0]!r}, which {out} does "
                      f"not declare yet: add it under `upstreams:` (see its comments)", markup=False)
    if missing:
        example = " ".join(f"--price {m.partition('/')[2] if hosted else m}=INPUT,OUTPUT" for m in missing)
        console.print(f"warning: no price for {', '.join(missing)}: {'its' if len(missing) == 1 else 'their'} calls "
                      f"will show an unknown cost (never $0), and a budget in USD refuses to start until each is "
                      f"priced; add {'it' if len(missing) == 1 else 'them'} under `prices:` in {out}, or run agl init "
                      f"again with {example}" + (" (or --free for a model you serve yourself)" if hosted and not free
                                                 else ""), markup=False)
    if budget_usd is None and paid:
        console.print(f"note: budget.usd is unset, so nothing caps what a run spends on models; set it in {out} "
                      "(budget: {usd: 5.0}) or with agl init --budget-usd", markup=False)
    console.print(f"wrote {out}; next, a smoke test: agl eval {out} --limit {SMOKE_TASKS}", markup=False)


def parse_price(text: str, label: str = "--price") -> str:
    """A price as agl.yaml's flow text, `{input: 0.1, output: 0.4}`, from INPUT,OUTPUT[,CACHED_INPUT]."""
    from agl_cli.errors import UsageError

    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (2, 3) or any(v < 0 or v != v or v == float("inf") for v in values):
        raise UsageError(f"{label} {text!r}: write {PRICE_FORMAT}")
    fields = dict(zip(("input", "output", "cached_input"), values, strict=False))
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in fields.items()) + "}"


def _given_prices(given: list[str], default: str, listed: list[str]) -> dict[str, str]:
    """`--price` values by the upstream/model they price: MODEL=... for a listed model, a bare price for the
    default one."""
    from agl_cli.errors import UsageError

    prices: dict[str, str] = {}
    for item in given:
        head, sep, tail = item.partition("=")
        if not sep:
            target, text = default, item
        else:
            head = head.strip()
            matches = [m for m in listed if head in (m, m.partition("/")[2])]
            if len(matches) != 1:
                raise UsageError(f"--price {item!r}: {head!r} is not one of the models agl init writes",
                                 hint="name one of: " + ", ".join(listed))
            target, text = matches[0], tail
        if target in prices:
            raise UsageError(f"--price: {target} is priced twice", hint="give one --price per model")
        prices[target] = parse_price(text, f"--price {item!r}:" if sep else "--price")
    return prices


def _ask_price(model: str) -> str | None:
    """A model's price from the person at the terminal; None when they leave it unknown."""
    answers = [typer.prompt(f"{model}: USD per 1M {kind} tokens (empty: unknown)", default="", show_default=False)
               for kind in ("input", "output", "cached input")]
    text = ",".join(answers).rstrip(",")
    if not text.replace(",", "").strip():
        return None
    from agl_cli.errors import UsageError

    try:
        return parse_price(text, f"{model}:")
    except UsageError as exc:  # a typo at a prompt: leave this model unknown, say why, go on
        typer.echo(f"{exc.message}; left unknown", err=True)
        return None


def _no_shipped_price(model: str) -> bool:
    from rl_backend.gateway.pricing import PriceTable

    upstream, _, name = model.partition("/")
    return upstream != "local" and PriceTable().lookup(name or upstream) is None


def _ask_budget() -> float | None:
    while True:
        text = typer.prompt("Budget for model spend per run, in USD (empty: none)", default="", show_default=False)
        if not text.strip():
            return None
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if value >= 0 and value != float("inf"):
            return value
        typer.echo(f"{text!r} is not an amount in USD, e.g. 5 or 0.50", err=True)


def _hosted_upstream(url: str | None, models: str | None, api_key_env: str | None, *,
                     free: bool) -> dict[str, Any] | None:
    """The `upstreams:` entry for a hosted API: its kind from the URL, its name, key variable and models; on a
    loopback address `free: false` unless --free (a bare loopback URL would count as free)."""
    import json
    from urllib.parse import urlparse

    from agl_cli.errors import UsageError
    from rl_backend.netaddr import is_loopback_url

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
    loopback = is_loopback_url(url)
    cost = ", free: true" if free else ", free: false" if loopback else ""
    return {"name": name, "kind": kind, "entry": f"{{kind: {kind}, base_url: {json.dumps(url)}, api_key_env: {key}{cost}}}",
            "models": names, "model_values": [f"{name}/{m}" for m in names], "loopback": loopback, "free": free}
