"""The reference docs, generated from the code: `docs/agl-yaml.md` from the spec's pydantic models (every key, its
type, default and description) and `docs/cli.md` from the command tree (every command and flag).

    python -m agl_cli.docgen            # rewrite both files
    python -m agl_cli.docgen --check    # exit 1 when either file differs from what the code says

tests/test_docs.py runs the check, so a field or flag added without regenerating fails the suite.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import types
import typing
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

DOCS = Path(__file__).resolve().parent.parent / "docs"
REGENERATE = "python -m agl_cli.docgen"
NOTICE = f"<!-- Generated from agl's code by `{REGENERATE}`; edit the code, then run it again. -->"

EXAMPLE = """\
name: triage
agent:
  command: "python agent.py --task {task_file} --out {output_file}"
  timeout_s: 120
  env: {TRIAGE_LOG: "0"}
tasks:
  path: tasks.jsonl
  split: {fractions: {train: 0.6, val: 0.2, test: 0.2}, seed: 0}
grader:
  command: "python grade.py {task_file} {output_file}"
upstreams:
  local: {kind: embedded, model: smollm2-135m-instruct}
  triage: {kind: openai-compatible, base_url: "${TRIAGE_URL:-http://127.0.0.1:8000/v1}", api_key_env: TRIAGE_KEY}
  openai: {kind: openai, api_key_env: OPENAI_API_KEY}
model: triage/small-1
prices:                                 # USD per 1M tokens
  triage/small-1: {input: 0.10, cached_input: 0.05, output: 0.40}
  triage/large-1: {input: 2.00, cached_input: 1.00, output: 8.00}
knobs:                                  # the first option of each is the baseline; null: left alone
  model: {values: [triage/small-1, triage/large-1], via: gateway}
  reasoning_effort: {values: [null, low, high], via: gateway, models: [triage/large-1]}
  temperature: {values: [0.0, 0.7], via: gateway}
  max_turns: {values: [4, 8], via: env, name: AGENT_MAX_TURNS}
  vote: {values: {single: "a", vote3: "a,b,c"}, via: env, name: AGENT_PROMPTS}   # short names
  prompt_file: {files: [prompts/a.md, prompts/b.md], via: file, path: "{rollout_dir}/prompt.md"}
seeds: 1
pass_threshold: 0.5                     # a reward of at least this passes
concurrency: 4
budget: {usd: 5.0, rollouts: 2000}
volume: 40000/month                     # tasks in production: cost per month beside cost per task
runner: local
"""

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}
KEY_NAMES = {"prices": "upstream/model"}  # what the keys of a mapping of sections are, where "name" would mislead


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- agl.yaml -------------------------------------------------------------------------------------------------------


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (directly, in a union, or as the values of a mapping)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _section_path(path: str, annotation: Any) -> str:
    """Where the fields of the model(s) under this key are listed: `upstreams.<name>` for a mapping of models."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1:
            return _section_path(path, inner[0])
    if origin is dict:
        return f"{path}.<{KEY_NAMES.get(path, 'name')}>"
    return path


def _type_text(annotation: Any, path: str) -> str:
    origin = typing.get_origin(annotation)
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"mapping ([`{path}`](#{_anchor(path)}))"
    if origin is Literal:
        return " | ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        models = [a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) > 1:
            return " or ".join(f"mapping ([`{_variant_path(path, m)}`](#{_anchor(_variant_path(path, m))}))"
                               for m in models)
        return " or ".join(_type_text(a, path) for a in inner)
    if origin is list:
        (item,) = typing.get_args(annotation)
        return f"list of {_type_text(item, path)}"
    if origin is dict:
        _, value = typing.get_args(annotation)
        if _models_in(value):
            return f"mapping of {path.rsplit('<', 1)[-1].rstrip('>')} to [`{path}`](#{_anchor(path)})"
        return f"mapping of string to {_type_text(value, path)}"
    return getattr(annotation, "__name__", str(annotation))


def _variant_path(path: str, model: type[BaseModel]) -> str:
    """One form of a key that takes several (tasks.split: by field, or by fractions), named after its model."""
    words = re.sub(r"(?<!^)(?=[A-Z])", " ", model.__name__.removesuffix("Spec")).lower()
    return f"{path} ({words})"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a `### `heading`` line."""
    text = heading.lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def _default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined or value is None:
        return "—"
    if isinstance(value, BaseModel):
        return f"`{json.dumps(value.model_dump(mode='json'), separators=(', ', ': '))}`"
    return f"`{json.dumps(value)}`"


def _sections(model: type[BaseModel], path: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """(key path, model) for the model and every model under it, parents first."""
    yield path, model
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        child = f"{path}.{name}" if path else name
        models = _models_in(field.annotation)
        target = _section_path(child, field.annotation)
        for sub in models:
            yield from _sections(sub, _variant_path(target, sub) if len(models) > 1 else target)


def spec_reference() -> str:
    from agl_cli.spec.schema import ExperimentSpec

    out = [
        "# agl.yaml reference", "", NOTICE, "",
        "`agl.yaml` is the experiment spec: the agent, its tasks and grader, where model names are served, what "
        "models cost, the settings to compare and the budget. Paths in it are relative to its folder. Only "
        "`agent`, `tasks` and `grader` are required. `agl init` writes a commented starter file.", "",
        "## Example", "", "```yaml", EXAMPLE.rstrip("\n"), "```", "",
        "## Values from the environment", "",
        "Any string value may hold `${VAR}` or `${VAR:-default}`: agl fills it in from the environment when it reads "
        "the file (`${VAR:-default}` takes the default when `VAR` is unset or empty; the default may itself be a "
        "reference, `${A:-${B}}`). A missing variable is an error naming the file, line and key. `$${` writes a "
        "literal `${`: `$${HOME}` in a command reaches the shell as `${HOME}`. Keys are never expanded, and `$VAR` "
        "without braces stays as written.", "",
        "In `agent.command` and `grader.command` a filled-in value is quoted for the shell where it stands (bare, in "
        "'single' or in \"double\" quotes), like `{task_file}`: it reaches the program as one argument, exactly as "
        "written, and a value such as `x; rm -rf ~` runs nothing. For a value the shell should split into words or "
        "expand, write `$VAR` without braces: the shell reads it from the environment when the command runs. In a "
        "command, `{name}` is a placeholder and `{{`/`}}` write a literal brace; shell braces such as `${VAR}`, "
        "`{a,b}` or an awk `{print $1}` are left to the shell.", "",
        "## Prices and unknown cost", "",
        "A call's cost is its tokens times the price of its model per 1M tokens: the price under `prices:` "
        "(`upstream/model`, or a model name for every upstream), else agl's shipped table of hosted models (dated "
        "snapshots such as `gpt-4o-2024-08-06` take the price of `gpt-4o`). Embedded upstreams and upstreams on a "
        "loopback address are free unless `prices:` names them (an `upstream/...` entry: then their other models "
        "are paid too) or their model; `free: true` on an upstream makes it free "
        "whatever `prices:` says, `free: false` makes it paid. A paid call without a price has an unknown cost: "
        "summaries, reports and `agl compare` show it as `—` with the number of unpriced calls, and leave it out of "
        "cost intervals, plots and verdicts. `budget.usd` refuses to start when a model the spec names has no price "
        "and its upstream is not free.", "",
        "## Which model served a call", "",
        "A call naming `upstream/model` goes to that upstream; the `model` knob (`via: gateway`) overrides the "
        "agent's choice; any other name goes to the default `model`, so an agent that hard-codes a model name runs "
        "unchanged. Every call records the name the agent asked for and the model that served it; summaries, "
        "reports and `agl compare` show the served model per variant, and warn, with counts, when the names a "
        "variant asked for were served by the default model instead.", "",
        *_gateway_knobs(),
        "## Keys", "",
    ]
    for path, model in _sections(ExperimentSpec, ""):
        out += [f"### `{path}`" if path else "### Top level", ""]
        doc = (model.__doc__ or "").strip()
        if doc:
            out += [" ".join(doc.split()), ""]
        out += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            if field.exclude:
                continue
            child = f"{path}.{name}" if path else name
            target = _section_path(child, field.annotation)
            type_text = _type_text(field.annotation, target)
            out.append(f"| `{name}` | {_cell(type_text)} | {_cell(_default_text(field))} | "
                       f"{_cell(field.description or '')} |")
        out.append("")
    return "\n".join(out)


def _gateway_knobs() -> list[str]:
    """The gateway's knob table: what each `via: gateway` knob takes and where it goes in each API's request."""
    from rl_backend.gateway.knobs import KNOBS
    from rl_backend.store.records import Api

    out = ["## Knob options", "",
           "Each knob's first option is the baseline. An option `null` leaves the setting alone: a gateway knob does "
           "not touch the request (the agent's own value, or none, is sent), an env knob sets no variable, a file "
           "knob writes no file; put it first and the baseline is the agent as it runs, and adding the knob keeps "
           "the baseline's cached rollouts. `--variant knob=option` names an option by its label: its short name "
           "when `values:` or `files:` is a mapping (`{vote3: \"a,b,c\"}`), else a file's stem or a value as "
           "written (commas allowed), `unset` for `null`; labels name the variants in every table. "
           "`agl eval --no-knobs` measures the agent with every knob left alone.", "",
           "A variant's cache key is what it changes: each applied option (a file by its content), not the whole "
           "knob table.", "",
           "## Gateway knobs", "",
           "A knob `via: gateway` is written by the gateway into every request of the rollout, whatever the agent "
           "sent. Where an API has no place for a knob (—), it is left out of that call's record of applied knobs. "
           "`models:` limits a knob to the calls served by those models (`upstream/model`, or a model name; `*` "
           "matches anything), for a parameter some models refuse; the others keep what the agent sent.", "",
           "| knob | takes | " + " | ".join(f"`{api.value}`" for api in Api) + " |",
           "| --- | --- | " + " | ".join("---" for _ in Api) + " |"]
    for knob in KNOBS.values():
        places = [knob.placements[api].where if api in knob.placements else "—" for api in Api]
        out.append(f"| `{knob.name}` | {_cell(knob.takes)} | " + " | ".join(_cell(p) for p in places) + " |")
    return [*out, ""]


# -- the command line -------------------------------------------------------------------------------------------------


def _param_row(param: Any) -> list[str] | None:
    from typer.core import TyperArgument

    if getattr(param, "hidden", False) or param.name == "help":
        return None
    flag = bool(getattr(param, "is_flag", False))
    names = (f"`{param.name.upper()}`" if isinstance(param, TyperArgument)
             else ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts]))
    type_text = "flag" if flag else _param_type(param)
    if getattr(param, "multiple", False):
        type_text += ", repeatable"
    default = param.default
    if param.required:
        default_text = "required"
    elif default is None or default == [] or (flag and default is False and not param.secondary_opts):
        default_text = "—"
    elif flag and param.secondary_opts:
        default_text = f"`{param.opts[0] if default else param.secondary_opts[0]}`"
    else:
        default_text = f"`{getattr(default, 'value', default)}`"
    help_text = getattr(param, "help", None) or ""
    envvar = getattr(param, "envvar", None)
    if envvar and getattr(param, "show_envvar", False):
        help_text += f" (env: `{envvar}`)"
    return [names, type_text, default_text, help_text]


def _param_type(param: Any) -> str:
    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", str)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType) and args:
        annotation = args[0]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(f"`{member.value}`" for member in annotation)
    return {str: "text", int: "integer", float: "number", Path: "path", bool: "boolean"}.get(annotation, "text")


def _command_section(out: list[str], title: str, command: Any, ctx: Any, about: str | None = None) -> None:
    out += [f"## `{title}`", ""]
    text = about or (command.help or "").strip()
    if text:
        out += [" ".join(text.split()), ""]
    rows = [r for p in command.get_params(ctx) if (r := _param_row(p)) is not None]
    if rows:
        out += ["| argument / flag | type | default | description |", "| --- | --- | --- | --- |"]
        out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
        out.append("")


def cli_reference() -> str:
    import typer

    from agl_cli.commands.train_group import TrainGroup
    from agl_cli.main import app

    root = typer.main.get_command(app)
    ctx = typer.Context(root, info_name="agl")
    out = ["# Command-line reference", "", NOTICE, "",
           f"{(root.help or '').strip()} `agl --help` lists the commands and `agl COMMAND --help` shows the flags "
           "below. Results print on stdout (`--json`: one JSON document); progress and logs go to stderr. Exit codes: "
           "0 success, 1 failure, 2 usage or configuration error, 3 a quality gate failed. The experiment spec's keys "
           "are in [agl-yaml.md](agl-yaml.md).", ""]
    if any(_param_row(p) is not None for p in root.get_params(ctx)):
        _command_section(out, "agl", root, ctx)

    def walk(command: Any, parent: Any, path: str) -> None:
        sub_ctx = type(parent)(command, info_name=path.rsplit(" ", 1)[-1], parent=parent)
        commands = getattr(command, "commands", None)
        if commands is None:
            _command_section(out, path, command, sub_ctx)
            return
        if isinstance(command, TrainGroup):
            out.extend([f"## `{path}`", "", " ".join((command.help or "").split()), ""])
            for usage, about, form, form_ctx in command.forms(sub_ctx):
                _command_section(out, usage.replace(" [OPTIONS]", ""), form, form_ctx, about=about[0].upper()
                                 + about[1:] + ".")
        for name in sorted(commands):
            if not commands[name].hidden:
                walk(commands[name], sub_ctx, f"{path} {name}")

    for name in sorted(root.commands):  # type: ignore[attr-defined]
        if not root.commands[name].hidden:  # type: ignore[attr-defined]
            walk(root.commands[name], ctx, f"agl {name}")  # type: ignore[attr-defined]
    return "\n".join(out)


# -- writing ----------------------------------------------------------------------------------------------------------


def documents() -> dict[str, str]:
    return {"agl-yaml.md": spec_reference(), "cli.md": cli_reference()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description="Write (or --check) docs/agl-yaml.md and docs/cli.md.")
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs from what the code says")
    parser.add_argument("--out", type=Path, default=DOCS, help="the docs folder (default: the repository's)")
    args = parser.parse_args(argv)
    stale = []
    for name, text in documents().items():
        path = args.out / name
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; regenerate with `{REGENERATE}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
