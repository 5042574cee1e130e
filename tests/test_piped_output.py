"""What a coding agent reads: `agl` with stdout piped (not a terminal) prints every table cell whole, however
narrow the terminal width it would otherwise assume, so long variant names and run ids can be told apart and
copied. Real `agl` processes with stdout=PIPE, not only `--json`."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO, run_agl, write_spec

LONG_KNOB = "system_prompt_variant"
LONG_OPTION = "fewshot_examples_from_the_train_split_v2"
MODEL_KNOB = "model_choice"
MODEL_OPTION = "deepseek/deepseek-chat-v3-0324"
CANDIDATE = f"{LONG_KNOB}={LONG_OPTION},{MODEL_KNOB}={MODEL_OPTION}"
NARROW = {"COLUMNS": "60"}  # what rich assumes without a terminal is 80 columns; narrower makes cutting certain


def _whole(text: str, *needles: str) -> None:
    for needle in needles:
        assert needle in text, f"{needle!r} is not printed whole in:\n{text}"
    assert "…" not in text, f"something was cut:\n{text}"


def test_eval_runs_and_compare_print_whole_names_through_a_pipe(tmp_path: Path) -> None:
    write_spec(tmp_path, [{"id": f"t{i}", "answer": "1"} for i in range(3)], knobs={
        LONG_KNOB: {"values": ["plain", LONG_OPTION], "via": "env", "name": "PROMPT_STYLE"},
        MODEL_KNOB: {"values": ["small", MODEL_OPTION], "via": "env", "name": "MODEL_CHOICE"},
    })
    evaluated = run_agl(["eval", "agl.yaml", "--no-report", "-v", "baseline", "-v", CANDIDATE], cwd=tmp_path,
                        env=NARROW, check=True)
    run_id = next((tmp_path / ".agl" / "runs").iterdir()).name
    _whole(evaluated.stdout, CANDIDATE, run_id)

    listed = run_agl(["runs"], cwd=tmp_path, env=NARROW, check=True)
    _whole(listed.stdout, run_id, CANDIDATE, str(tmp_path / "agl.yaml"))

    compared = run_agl(["compare", "baseline", CANDIDATE, "--run", run_id], cwd=tmp_path, env=NARROW, check=True)
    table = compared.stdout.split("\n" + CANDIDATE + ":")[0]  # the table, before the sentence that repeats the name
    _whole(table, CANDIDATE)
    _whole(compared.stdout, run_id)


def test_every_table_a_command_prints_goes_through_print_table() -> None:
    """A new `console.print(table)` would cut cells again when piped: every module that builds a rich Table must
    print it with agl_cli.console.print_table."""
    offenders = []
    for path in sorted((REPO / "agl_cli").rglob("*.py")):
        tree = ast.parse(path.read_text())
        builds = any(isinstance(n, ast.ImportFrom) and n.module == "rich.table" for n in ast.walk(tree))
        # display.py builds the eval table (eval_cmd prints it); train_group.py lays out `agl train --help` the way
        # typer's own rich help is laid out (help, not a result).
        if not builds or path.name in ("display.py", "train_group.py"):
            continue
        if "print_table(" not in path.read_text():
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"these build a rich Table but never call print_table: {offenders}"
