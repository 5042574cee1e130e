"""The reference docs are generated from the code and kept true: docs/agl-yaml.md (every key of agl.yaml) and
docs/cli.md (every command and flag). Error messages, the starter agl.yaml and the README point at them, and every
command's --help shows all of its flags, the forms of `agl train` included."""

from __future__ import annotations

import typing
from pathlib import Path

import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from agl_cli import docgen
from agl_cli.main import app
from agl_cli.spec.schema import ExperimentSpec
from tests.helpers import REPO


def test_the_reference_docs_match_the_code() -> None:
    for name, text in docgen.documents().items():
        path = REPO / "docs" / name
        assert path.is_file() and path.read_text(encoding="utf-8") == text, (
            f"docs/{name} is out of date with the code: regenerate it with `{docgen.REGENERATE}` and commit it")


def test_the_check_mode_fails_on_a_stale_file(tmp_path: Path) -> None:
    assert docgen.main(["--out", str(tmp_path)]) == 0  # writes both
    assert docgen.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "cli.md").write_text("stale\n")
    assert docgen.main(["--out", str(tmp_path), "--check"]) == 1


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.add(model)
    for field in model.model_fields.values():
        stack = [field.annotation]
        while stack:
            annotation = stack.pop()
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                _models(annotation, seen)
            stack += typing.get_args(annotation)


def test_every_key_has_a_description_and_is_in_the_reference() -> None:
    models: set[type[BaseModel]] = set()
    _models(ExperimentSpec, models)
    text = (REPO / "docs" / "agl-yaml.md").read_text()
    missing = [f"{m.__name__}.{name}" for m in models for name, f in m.model_fields.items()
               if not f.exclude and not f.description]
    assert not missing, f"give these fields a description= (it is their documentation): {missing}"
    for model in models:
        for name, field in model.model_fields.items():
            if not field.exclude:
                assert f"| `{name}` |" in text, name
    assert "### `prices.<upstream/model>`" in text and "### `upstreams.<name>`" in text


def test_the_example_is_a_valid_spec() -> None:
    data = yaml.safe_load(docgen.EXAMPLE)
    spec = ExperimentSpec.model_validate(data)
    assert spec.prices["triage/large-1"].output == 8.0 and "${TRIAGE_URL" in str(data["upstreams"]["triage"])


def test_every_flag_has_help_and_is_in_the_cli_reference() -> None:
    import typer

    text = (REPO / "docs" / "cli.md").read_text()
    root = typer.main.get_command(app)
    ctx = typer.Context(root, info_name="agl")
    unexplained: list[str] = []

    def walk(command: typing.Any, parent: typing.Any, path: str) -> None:
        sub = type(parent)(command, info_name=path.rsplit(" ", 1)[-1], parent=parent)
        for param in command.get_params(sub):
            if param.name == "help" or getattr(param, "hidden", False):
                continue
            if not getattr(param, "help", None):
                unexplained.append(f"{path} {param.name}")
            if getattr(param, "opts", None) and param.opts[0].startswith("-"):
                assert f"`{param.opts[0]}`" in text, f"{path} {param.opts[0]} is missing from docs/cli.md"
        for name, child in getattr(command, "commands", {}).items():
            walk(child, sub, f"{path} {name}")

    walk(root, ctx, "agl")
    assert not unexplained, f"give these a help text: {unexplained}"
    for form in ("## `agl train CONFIG`", "## `agl train CONFIG --backend verl`", "## `agl train CONFIG --on kubernetes`",
                 "## `agl eval`", "## `agl gateway serve`"):
        assert form in text


def test_agl_train_help_shows_every_forms_flags() -> None:
    runner = CliRunner()
    for args in (["train", "--help"], ["train", "agl.yaml", "--help"]):
        result = runner.invoke(app, args, env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert result.exit_code == 0, result.output
        for flag in ("--steps", "--loop", "--track", "--backend", "--tensor-parallel", "--on", "--gpus", "--image",
                     "--dry-run", "--namespace", "status", "stop"):
            assert flag in result.output, (args, flag)
        assert "agl train CONFIG --backend verl" in result.output and "agl train CONFIG --on kubernetes" in result.output
    verl = runner.invoke(app, ["train", "agl.yaml", "--backend", "verl", "--help"], env={"COLUMNS": "200"})
    assert verl.exit_code == 0 and "--lora-rank" in verl.output and "--gpus" not in verl.output


def test_errors_the_template_and_the_readme_point_at_the_reference(tmp_path: Path) -> None:
    (tmp_path / "agl.yaml").write_text("agent: {command: a}\ntasks: {path: t.jsonl}\ngrader: {command: g}\nbudgett: 1\n")
    result = CliRunner().invoke(app, ["eval", str(tmp_path / "agl.yaml")])
    assert result.exit_code == 2
    assert "`budgett` is not a key agl knows; check its spelling against docs/agl-yaml.md" in result.output
    assert "DESIGN" not in result.output
    starter = tmp_path / "starter.yaml"
    assert CliRunner().invoke(app, ["init", "--out", str(starter)]).exit_code == 0
    assert "docs/agl-yaml.md" in starter.read_text() and "DESIGN" not in starter.read_text()
    readme = (REPO / "README.md").read_text()
    assert "(docs/agl-yaml.md)" in readme and "(docs/cli.md)" in readme
    shipped = [p for p in (REPO / "agl_cli").rglob("*.py")] + [p for p in (REPO / "templates").rglob("*") if p.is_file()]
    assert not [p for p in shipped if "DESIGN.md" in p.read_text(errors="replace")]
