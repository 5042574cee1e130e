"""The README's main job, examples/quickstart: its tasks are what calc's generator makes, every one a two-operand
product its grader accepts, its spec loads with the two prompts as the knob's options, the worked example in the
second prompt is the only difference between them; and the command itself ends with `better` on val and on test."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from agl_cli.spec.schema import load_spec
from agl_cli.spec.tasks import load_tasks
from tests.helpers import REPO, run_agl

QUICKSTART = REPO / "examples" / "quickstart"
CALC = REPO / "examples" / "calc"


def _module(path: Path):  # the examples are scripts, not packages
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tasks_are_the_generators_two_operand_products() -> None:
    make_tasks = _module(CALC / "make_tasks.py")
    grade = _module(CALC / "grade.py")
    written = [json.loads(line) for line in (QUICKSTART / "tasks.jsonl").read_text().splitlines()]
    assert written == make_tasks.make_tasks(120, 7, ["mul"])  # the comment in agl.yaml says how it was made
    assert {t["kind"] for t in written} == {"mul"} and all(t["operands"] == 2 for t in written)
    assert {s: sum(t["split"] == s for t in written) for s in ("train", "val", "test")} == {"train": 60, "val": 30,
                                                                                           "test": 30}
    for task in written:
        a, b = (int(x) for x in re.findall(r"\d+", task["expression"]))
        assert task["answer"] == a * b and grade.grade(task, f"ANSWER: {a * b}")["score"] == 1.0
    # calc's own tasks (kept for training) are untouched by the new options
    assert [json.loads(line) for line in (CALC / "tasks.jsonl").read_text().splitlines()] == make_tasks.make_tasks(360)


def test_spec_loads_and_the_prompts_differ_by_the_worked_example_only() -> None:
    spec = load_spec(QUICKSTART / "agl.yaml")
    knob = spec.knobs["prompt_file"]
    assert knob.files == ["prompts/contract.md", "prompts/worked_example.md"]
    assert {t.split for t in load_tasks(spec)} == {"train", "val", "test"}
    contract = (QUICKSTART / "prompts" / "contract.md").read_text()
    example = (QUICKSTART / "prompts" / "worked_example.md").read_text()
    assert example.startswith(contract) and "User:" not in contract
    assert [line.split(":")[0] for line in example[len(contract):].strip().splitlines()] == [
        "User", "Assistant", "User", "Assistant"]
    assert (QUICKSTART / spec.agent.command.split()[1]).resolve() == CALC / "agent.py"


@pytest.mark.usefixtures("smollm2")
@pytest.mark.slow
def test_the_readme_main_command_is_decisive(tmp_path: Path) -> None:
    """The README's main job as a user runs it: `better` on val, confirmed on test, agl.best.yaml, the report."""
    shutil.copytree(REPO / "examples" / "quickstart", tmp_path / "examples" / "quickstart")
    shutil.copytree(CALC, tmp_path / "examples" / "calc", ignore=shutil.ignore_patterns("agl.best*", "__pycache__"))
    result = run_agl(["optimize", "examples/quickstart/agl.yaml", "--limit", "12", "--confirm-limit", "12", "--json"],
                     cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert doc["winner"]["name"] == "prompt_file=worked_example"
    assert doc["validation"]["verdict"] == "better" and doc["confirmation"]["verdict"] == "better", doc
    assert doc["recommendation"] == "adopt"
    best = tmp_path / "examples" / "quickstart" / "agl.best.yaml"
    assert "prompts/worked_example.md" in best.read_text().split("prompt_file:")[1].split(",")[0]
    assert list((tmp_path / ".agl" / "runs").glob("*/report/report.html"))
    # The first report a new user reads opens on its verdict, with no warning above it.
    (report,) = (tmp_path / ".agl" / "runs").glob("*/report/report.md")
    assert "**Note:**" not in report.read_text() and "warning" not in result.stderr, result.stderr[-3000:]
