"""The experiment spec: a good one loads; each kind of bad one is refused with file, line, field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from agl_cli.errors import ConfigError
from agl_cli.spec.schema import SplitByFractions, load_spec
from agl_cli.spec.tasks import load_tasks, select_tasks
from agl_cli.spec.variants import baseline, grid, parse_variant
from tests.helpers import invoke_agl, write_tasks

GOOD = """\
name: calc
agent:
  command: "python agent.py --task {task_file} --out {output_file}"
  timeout_s: 30
  env: {A: "1"}
tasks:
  path: tasks.jsonl
  split: {fractions: {train: 0.5, val: 0.25, test: 0.25}, seed: 3}
grader:
  command: "python grade.py {task_file} {output_file}"
upstreams:
  local: {kind: embedded, model: smollm2-135m-instruct}
model: local/smollm2-135m-instruct
knobs:
  temperature: {values: [0.0, 0.7], via: gateway}
  max_turns: {values: [4, 8], via: env, name: AGENT_MAX_TURNS}
  prompt: {files: [a.md, b.md], via: file, path: "{rollout_dir}/prompt.md"}
seeds: 2
concurrency: 3
budget: {usd: 1.5, rollouts: 100}
"""


def _folder(tmp_path: Path, text: str, n_tasks: int = 20) -> Path:
    write_tasks(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "q": i} for i in range(n_tasks)])
    (tmp_path / "a.md").write_text("prompt A")
    (tmp_path / "b.md").write_text("prompt B")
    path = tmp_path / "agl.yaml"
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_spec(_folder(tmp_path, text))
    assert info.value.exit_code == 2
    return str(info.value)


def test_good_spec_loads_with_every_key(tmp_path: Path) -> None:
    spec = load_spec(_folder(tmp_path, GOOD))
    assert spec.agent.timeout_s == 30 and spec.agent.env == {"A": "1"}
    assert isinstance(spec.tasks.split, SplitByFractions) and spec.tasks.split.seed == 3
    assert spec.upstreams["local"].kind == "embedded"
    assert spec.knobs["max_turns"].name == "AGENT_MAX_TURNS"
    assert spec.seeds == 2 and spec.concurrency == 3 and spec.budget.usd == 1.5
    assert spec.base_dir == tmp_path.resolve()
    tasks = load_tasks(spec)
    splits = [t.split for t in tasks]
    assert splits.count("train") == 10 and splits.count("val") == 5 and splits.count("test") == 5
    # The same seed gives the same split; it does not depend on file order.
    again = load_tasks(spec)
    assert [t.split for t in again] == splits
    assert len(select_tasks(tasks, split="val", limit=3)) == 3


def test_variants_are_named_and_hashed_by_content(tmp_path: Path) -> None:
    spec = load_spec(_folder(tmp_path, GOOD))
    base = baseline(spec)
    assert base.name == "baseline"
    assert len(grid(spec)) == 8
    other = parse_variant(spec, "temperature=0.7,prompt=b")
    assert other.name == "temperature=0.7,prompt=b" and other.hash != base.hash
    (tmp_path / "a.md").write_text("prompt A, edited")
    assert baseline(spec).hash != base.hash  # editing a prompt file makes a new variant


@pytest.mark.parametrize(
    ("needle", "replacement", "expected"),
    [
        ("  timeout_s: 30", "  timeout_s: soon", ["agl.yaml:4", "agent.timeout_s", "'soon'"]),
        ("concurrency: 3", "concurency: 3", ["agl.yaml:19", "`concurency` is not a key agl knows"]),
        ("  command: \"python agent.py", "  entry: \"x:y\"\n  command: \"python agent.py", ["exactly one of `command`"]),
        ("--out {output_file}", "--out {outfile}", ["unknown placeholder {outfile}", "{output_file}"]),
        ("test: 0.25}", "test: 0.5}", ["add up to 1", "1.25"]),
        ("via: env, name: AGENT_MAX_TURNS", "via: env", ["needs `name`"]),
        ("max_turns: {values", "max_tokns: {values", []),  # env knob with a free name is fine
        ("temperature: {values: [0.0, 0.7], via: gateway}", "turns: {values: [1, 2], via: gateway}",
         ["can only set", "via: env"]),
        ("model: local/smollm2-135m-instruct\n", "model: remote/gpt\n", ["names upstream 'remote'"]),
        # a gateway knob's options are checked against the gateway's knob table when the spec loads, not at the
        # first rollout
        ("temperature: {values: [0.0, 0.7], via: gateway}", "temperature: {values: [0.0, hot], via: gateway}",
         ["agl.yaml:15", "`knobs.temperature.values.1`", "knob 'temperature' must be a finite number, got 'hot'"]),
        ("temperature: {values: [0.0, 0.7], via: gateway}", "model: {values: [gpt-4o], via: gateway}",
         ["`knobs.model.values.0`", "'upstream/model'"]),
        ("temperature: {values: [0.0, 0.7], via: gateway}", "temperature: {files: [a.md], via: gateway}",
         ["`knobs.temperature`", "takes `values:`"]),
        ("temperature: {values: [0.0, 0.7], via: gateway}", "system_prompt: {values: [be brief], via: gateway}",
         ["`knobs.system_prompt`", "takes `files:`"]),
        ("seeds: 2", "seeds: 0", ["agl.yaml:18", "seeds", "greater than or equal to 1"]),
        ("  local: {kind: embedded, model: smollm2-135m-instruct}", "  local: {kind: embedded}", ["needs `model`"]),
        ("  local: {kind: embedded,", "  local: {kind: ollama,", ["upstreams.local.kind", "'ollama'"]),
    ],
)
def test_bad_specs_name_line_field_and_fix(tmp_path: Path, needle: str, replacement: str, expected: list[str]) -> None:
    assert needle in GOOD
    text = GOOD.replace(needle, replacement)
    if not expected:
        load_spec(_folder(tmp_path, text))
        return
    message = _error(tmp_path, text)
    for fragment in expected:
        assert fragment in message, message


PROPOSER = "proposer:\n  model: local/smollm2-135m-instruct\n  rounds: 3\n"


def test_proposer_is_typed_and_its_knob_defaults_to_the_only_file_knob(tmp_path: Path) -> None:
    spec = load_spec(_folder(tmp_path, GOOD + PROPOSER))
    assert spec.proposer is not None and spec.proposer.rounds == 3 and spec.proposer.minibatch == 8
    assert spec.proposer.temperature is None and spec.proposer_knob() == "prompt"


@pytest.mark.parametrize(
    ("addition", "expected"),
    [
        ("proposer:\n  model: remote/gpt-4.1-mini\n",
         ["agl.yaml:22", "`proposer.model`", "names upstream 'remote'", "declared: local", "hint: declare it"]),
        ("proposer:\n  model: gpt-4.1-mini\n", ["agl.yaml:22", "proposer.model", "upstream/model"]),
        ("proposer:\n  model: local/m\n  knob: temperature\n",
         ["agl.yaml:23", "`proposer.knob`", "'temperature' is not a file-valued knob", "one of: prompt"]),
        ("proposer:\n  model: local/m\n  round: 3\n", ["agl.yaml:23", "`proposer.round` is not a key agl knows"]),
        ("proposer:\n  model: local/m\n  rounds: 0\n", ["agl.yaml:23", "proposer.rounds", "greater than or equal"]),
        ("proposer:\n  model: local/m\n  temperature: hot\n", ["agl.yaml:23", "proposer.temperature", "'hot'"]),
        ("proposer: {}\n", ["agl.yaml:21", "`proposer.model` is required"]),
    ],
)
def test_bad_proposer_names_line_field_and_fix(tmp_path: Path, addition: str, expected: list[str]) -> None:
    message = _error(tmp_path, GOOD + addition)
    for fragment in expected:
        assert fragment in message, message


def test_proposer_knob_must_be_named_when_ambiguous_or_missing(tmp_path: Path) -> None:
    two = GOOD.replace("  max_turns: {values: [4, 8], via: env, name: AGENT_MAX_TURNS}",
                       "  system_prompt: {files: [a.md], via: gateway}")
    message = _error(tmp_path, two + PROPOSER)
    assert "agl.yaml:21: `proposer`: the spec has 2 file-valued knobs" in message
    assert "`proposer.knob`, one of: system_prompt, prompt" in message
    assert load_spec(_folder(tmp_path, two + PROPOSER + "  knob: system_prompt\n")).proposer_knob() == "system_prompt"
    none = GOOD.replace('  prompt: {files: [a.md, b.md], via: file, path: "{rollout_dir}/prompt.md"}\n', "")
    assert "the spec has 0 file-valued knobs" in _error(tmp_path, none + PROPOSER)


def test_missing_required_sections(tmp_path: Path) -> None:
    message = _error(tmp_path, "name: x\n")
    for field in ("`agent` is required", "`tasks` is required", "`grader` is required"):
        assert field in message


def test_not_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    message = _error(tmp_path, "name: x\nagent: [unclosed\n")
    assert "agl.yaml:3" in message and "line 2" in message
    assert "expected a mapping" in _error(tmp_path, "- just\n- a list\n")
    assert "found an empty file" in _error(tmp_path, "")


def test_missing_files_are_named(tmp_path: Path) -> None:
    assert "does not exist" in _error(tmp_path, GOOD.replace("path: tasks.jsonl", "path: nope.jsonl"))
    assert "b2.md does not exist" in _error(tmp_path, GOOD.replace("files: [a.md, b.md]", "files: [a.md, b2.md]"))
    with pytest.raises(ConfigError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")


def test_broken_task_line_is_named(tmp_path: Path) -> None:
    spec = load_spec(_folder(tmp_path, GOOD))
    lines = (tmp_path / "tasks.jsonl").read_text().splitlines()
    lines[6] = '{"id": "t6", "q": '
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"tasks.jsonl:7: not valid JSON"):
        load_tasks(spec)
    lines[6] = '{"id": "t1"}'
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"tasks.jsonl:7: task id 't1' already used on line 2"):
        load_tasks(spec)


def test_cli_reports_bad_spec_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    path = _folder(tmp_path, GOOD.replace("  timeout_s: 30", "  timeout_s: -1"))
    result = invoke_agl(["eval", str(path)], cwd=tmp_path)
    assert result.returncode == 2
    assert "agl.yaml:4" in result.stderr and "agent.timeout_s" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    result = invoke_agl(["eval", str(path), "--split", "nosuch"], cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
