"""Hostile or broken configuration: each is refused before anything runs, with exit 2 and a message naming the file,
the line and what to do; never a traceback, never silently accepted."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agl_cli.errors import ConfigError
from agl_cli.main import app
from agl_cli.spec.schema import load_spec
from tests.helpers import write_spec

BASE = """\
agent: {command: "python agent.py {task_file} {output_file}", timeout_s: 5}
tasks: {path: tasks.jsonl}
grader: {command: "python grade.py {task_file} {output_file}"}
"""


def _folder(tmp_path: Path, spec_text: str | bytes, tasks: str = '{"id": "a"}\n') -> Path:
    (tmp_path / "tasks.jsonl").write_text(tasks)
    (tmp_path / "agent.py").write_text("")
    (tmp_path / "grade.py").write_text("")
    spec = tmp_path / "agl.yaml"
    spec.write_bytes(spec_text if isinstance(spec_text, bytes) else spec_text.encode())
    return spec


def _refused(spec: Path, *args: str) -> str:
    """`agl eval SPEC` exits 2 with a message, not an exception; returns what it printed."""
    result = CliRunner().invoke(app, ["eval", str(spec), "--runs-dir", str(spec.parent / "runs"), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert not (spec.parent / "runs").exists()  # refused before a run was created
    return " ".join(result.output.split())  # rich wraps long lines


def test_non_utf8_spec(tmp_path: Path) -> None:
    text = _refused(_folder(tmp_path, BASE.encode() + b"name: caf\xe9\n"))
    assert "agl.yaml:4: not UTF-8" in text and "0xe9" in text and "save the file as UTF-8" in text


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n"
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        bomb += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
    assert len(bomb) < 700
    started = time.monotonic()
    text = _refused(_folder(tmp_path, bomb + BASE))
    assert time.monotonic() - started < 10
    assert "expands to more than 100,000 values" in text


def test_oversized_spec(tmp_path: Path) -> None:
    text = _refused(_folder(tmp_path, BASE + "# " + "x" * (2 << 20) + "\n"))
    assert "larger than 1024 KiB" in text


@pytest.mark.parametrize("nested", ["[" * 5000 + "]" * 5000, "{a: " * 5000 + "1" + "}" * 5000])
def test_deeply_nested_yaml(tmp_path: Path, nested: str) -> None:
    text = _refused(_folder(tmp_path, BASE + "name: " + nested + "\n"))
    assert "agl.yaml:4: nested more than 64 levels deep" in text


def test_task_line_nested_100k_levels(tmp_path: Path) -> None:
    tasks = '{"id": "a"}\n{"id": "b", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    text = _refused(_folder(tmp_path, BASE, tasks))
    assert "tasks.jsonl:2: cannot be read (nested too deeply)" in text
    tasks = '{"id": "b", "x": ' + "[" * 500 + "]" * 500 + "}\n"  # readable, but deeper than agl passes on
    assert "tasks.jsonl:1: the task is nested more than 200 levels" in _refused(_folder(tmp_path, BASE, tasks))


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    text = _refused(_folder(tmp_path, BASE + "agent: {command: 'python agent.py'}\n"))
    assert "agl.yaml:4: `agent` is given twice (first on line 1)" in text
    nested = BASE.replace("timeout_s: 5}", "timeout_s: 5, timeout_s: 9}")
    assert "agl.yaml:1: `agent.timeout_s` is given twice" in _refused(_folder(tmp_path, nested))


def test_yaml_merge_keys_still_work(tmp_path: Path) -> None:
    spec = _folder(tmp_path, BASE + "knobs:\n  a: &k {values: [1, 2], via: env, name: A}\n  b: {<<: *k, name: B}\n")
    loaded = load_spec(spec)
    assert loaded.knobs["b"].name == "B" and loaded.knobs["b"].values == [1, 2]


def test_cross_field_errors_name_their_line_and_field(tmp_path: Path) -> None:
    upstream = BASE + "upstreams:\n  a: {kind: openai-compatible, base_url: 'http://127.0.0.1:9/v1'}\nmodel: b/x\n"
    text = _refused(_folder(tmp_path, upstream))
    assert "agl.yaml:6: `model`: `model: b/x` names upstream 'b'" in text and "(top level)" not in text
    knob = BASE + "knobs:\n  seed: {values: [1], via: gateway}\n"
    text = _refused(_folder(tmp_path, knob))
    assert "agl.yaml:5: `knobs.seed.via`: knob 'seed' is `via: gateway`" in text and "(top level)" not in text
    text = _refused(_folder(tmp_path, BASE + "17: x\n"))
    assert "agl.yaml:4: `17`" in text and "(top level)" not in text


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_infinite_timeout_is_refused(tmp_path: Path, value: str) -> None:
    text = _refused(_folder(tmp_path, BASE.replace("timeout_s: 5", f"timeout_s: {value}")))
    assert "agl.yaml:1: `agent.timeout_s`" in text
    upstream = BASE + f"upstreams:\n  a: {{kind: openai-compatible, base_url: 'http://127.0.0.1:9/v1', timeout_s: {value}}}\n"
    assert "`upstreams.a.timeout_s`" in _refused(_folder(tmp_path, upstream))


@pytest.mark.parametrize("task_id", [{"a": 1}, [1, 2], True, None, ""])
def test_task_id_must_be_a_string_or_an_integer(tmp_path: Path, task_id: object) -> None:
    tasks = '{"id": "ok"}\n' + json.dumps({"id": task_id}) + "\n"
    text = _refused(_folder(tmp_path, BASE, tasks))
    assert "tasks.jsonl:2: the task id (field 'id') must be a non-empty string or an integer" in text


def test_integer_task_ids_still_work(tmp_path: Path) -> None:
    write_spec(tmp_path, [{"id": 7}, {"id": "t8"}])
    from agl_cli.spec.tasks import load_tasks

    assert [t.id for t in load_tasks(load_spec(tmp_path / "agl.yaml"))] == ["7", "t8"]


def test_variables_in_a_command_reach_the_agent_as_text_never_as_shell(tmp_path: Path) -> None:
    """`${VAR}` in agent.command is quoted for the shell where it stands; `${A:-${B}}` nests; `$${HOME}` reaches the
    shell as `${HOME}`, for it to fill in at run time."""
    from tests.helpers import run_agl

    (tmp_path / "args_agent.py").write_text(
        "import json, sys\nopen(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))\n")
    (tmp_path / "grade.py").write_text("print(1)\n")
    command = ("python args_agent.py {output_file} --label ${LABEL} --quoted '${LABEL}' --double \"${LABEL}\" "
               "--who ${WHO:-${FALLBACK}} --home $${HOME}")
    write_spec(tmp_path, [{"id": "a"}], agent={"command": command}, grader={"command": "python grade.py"})
    env = {"LABEL": "x; touch PWNED'\"$(touch PWNED2)", "FALLBACK": "fb", "HOME": "/home/someone"}
    result = run_agl(["eval", "agl.yaml", "--json", "--no-report"], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()
    rollout = json.loads(run_agl(["runs", json.loads(result.stdout)["run_id"], "--json"], cwd=tmp_path).stdout)
    argv = json.loads(rollout["rollouts"][0]["output"])
    assert argv == ["--label", env["LABEL"], "--quoted", env["LABEL"], "--double", env["LABEL"], "--who", "fb",
                    "--home", "/home/someone"]


def test_nested_defaults_and_the_escape_in_every_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _folder(tmp_path, BASE.replace("{task_file} {output_file}\"", "{task_file} {output_file} $${HOME}\"", 1)
                   + 'name: "${A:-${B:-${C}}}"\nmodel: "x/${D:-${B:-plain}}"\n')
    for name in ("A", "B", "D"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("C", "deep")
    loaded = load_spec(spec)
    assert loaded.name == "deep" and loaded.model == "x/plain"
    assert loaded.agent.command == "python agent.py {task_file} {output_file} ${HOME}"
    monkeypatch.delenv("C")
    with pytest.raises(ConfigError, match=r"\$\{C\} is not set in the environment"):
        load_spec(spec)
