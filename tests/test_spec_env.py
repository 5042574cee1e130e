"""`${VAR}` and `${VAR:-default}` in agl.yaml's string values: filled in from the environment when the spec is read,
with the file, line and key of a variable that is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from agl_cli.errors import ConfigError
from agl_cli.spec.schema import load_spec

SPEC = """\
name: "${STUDY:-triage}"
agent:
  command: "python agent.py --name '${AGENT_NAME}' --shell $HOME"
  env: {KEY: "${EMPTY:-fallback}", KEEP: "${EMPTY}", LITERAL: "$${NOT_A_VAR}"}
tasks: {path: tasks.jsonl}
grader: {command: "python grade.py {task_file} {output_file}"}
upstreams:
  triage: {kind: openai-compatible, base_url: "http://${HOST}:${PORT:-8000}/v1"}
model: triage/small-1
concurrency: "${CONCURRENCY:-3}"
knobs:
  ${NOT_EXPANDED}: {values: ["${AGENT_NAME}"], via: env, name: X}
"""


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    (tmp_path / "tasks.jsonl").write_text('{"id": "a"}\n')
    (tmp_path / "agl.yaml").write_text(SPEC)
    return tmp_path


def test_values_are_filled_in_from_the_environment(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"AGENT_NAME": "bot", "HOST": "10.0.0.7", "EMPTY": ""}.items():
        monkeypatch.setenv(name, value)
    for name in ("STUDY", "PORT", "CONCURRENCY", "NOT_A_VAR"):
        monkeypatch.delenv(name, raising=False)
    spec = load_spec(folder / "agl.yaml")
    assert spec.name == "triage"
    assert spec.agent.command == "python agent.py --name 'bot' --shell $HOME"
    # :- covers unset and empty; a plain ${} keeps an empty value; $${ is a literal ${
    assert spec.agent.env == {"KEY": "fallback", "KEEP": "", "LITERAL": "${NOT_A_VAR}"}
    assert spec.upstreams["triage"].base_url == "http://10.0.0.7:8000/v1"
    assert spec.concurrency == 3  # a number written as ${...} is still a number
    assert list(spec.knobs) == ["${NOT_EXPANDED}"] and spec.knobs["${NOT_EXPANDED}"].values == ["bot"]  # keys stay
    monkeypatch.setenv("PORT", "9001")
    monkeypatch.setenv("STUDY", "other")
    spec = load_spec(folder / "agl.yaml")
    assert spec.upstreams["triage"].base_url == "http://10.0.0.7:9001/v1" and spec.name == "other"


def test_a_missing_variable_names_file_line_and_key(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_NAME", "bot")
    monkeypatch.setenv("EMPTY", "")
    monkeypatch.delenv("HOST", raising=False)
    with pytest.raises(ConfigError) as missing:
        load_spec(folder / "agl.yaml")
    assert missing.value.exit_code == 2
    assert missing.value.message == f"{folder / 'agl.yaml'}:8: `upstreams.triage.base_url`: ${{HOST}} is not set in " \
                                    "the environment"
    assert "${NAME:-value}" in (missing.value.hint or "")
    (folder / "agl.yaml").write_text(SPEC.replace("${STUDY:-triage}", "${STUDY:=triage}"))
    with pytest.raises(ConfigError, match=r"agl.yaml:1: `name`: \$\{STUDY:=triage\} is not a variable reference"):
        load_spec(folder / "agl.yaml")
