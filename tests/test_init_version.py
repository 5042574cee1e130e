"""`agl --version`, and `agl init`: a starter file for a hosted agent (`--upstream URL --models ...`) that loads as a
valid spec and does not point at the embedded model, a file that ends with one newline, and the smoke-test size
that `init` suggests being the one the skill uses."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agl_cli.commands.init_cmd import SMOKE_TASKS
from agl_cli.main import app
from agl_cli.spec.schema import load_spec
from tests.helpers import REPO

SKILL = REPO / "skills" / "agent-lightning"


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"agl {version('agl')}"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks.jsonl").write_text('{"id": "t1"}\n')
    return tmp_path


def test_init_for_a_hosted_agent_with_two_models(folder: Path) -> None:
    result = CliRunner().invoke(app, ["init", "--upstream", "https://api.example.com/v1",
                                      "--models", "small-model, large-model"])
    assert result.exit_code == 0, result.output
    text = (folder / "agl.yaml").read_text()
    assert text.endswith("\n") and not text.endswith("\n\n")
    spec = load_spec(folder / "agl.yaml")
    assert spec.model == "hosted/small-model"
    assert list(spec.upstreams) == ["hosted"], "no embedded model for a hosted agent: it would be started for nothing"
    hosted = spec.upstreams["hosted"]
    assert (hosted.kind, hosted.base_url, hosted.api_key_env) == ("openai-compatible", "https://api.example.com/v1",
                                                                  "OPENAI_API_KEY")
    assert spec.knobs["model"].values == ["hosted/small-model", "hosted/large-model"]
    assert f"--limit {SMOKE_TASKS}" in result.stderr


def test_init_for_anthropic_and_the_default_file(folder: Path) -> None:
    result = CliRunner().invoke(app, ["init", "--upstream", "https://api.anthropic.com", "--models", "claude-haiku-4-5"])
    assert result.exit_code == 0, result.output
    spec = load_spec(folder / "agl.yaml")
    assert spec.model == "anthropic/claude-haiku-4-5" and spec.upstreams["anthropic"].kind == "anthropic"
    assert spec.upstreams["anthropic"].api_key_env == "ANTHROPIC_API_KEY" and not spec.knobs
    assert CliRunner().invoke(app, ["init", "--force", "--split-field", "split"]).exit_code == 0
    text = (folder / "agl.yaml").read_text()
    assert text.endswith("runner: local\n")
    assert load_spec(folder / "agl.yaml").model == "local/smollm2-135m-instruct"


@pytest.mark.parametrize(("args", "says"), [
    (["--upstream", "https://api.example.com/v1"], "--models"),
    (["--models", "a,b"], "--upstream"),
    (["--upstream", "api.example.com", "--models", "a"], "base URL"),
    (["--upstream", "https://api.example.com/v1", "--models", "a", "--api-key-env", "my key"], "variable"),
])
def test_init_usage_errors(folder: Path, args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["init", *args])
    assert result.exit_code == 2 and says in result.output
    assert not (folder / "agl.yaml").exists()


def test_init_and_the_skill_agree_on_the_smoke_test_size() -> None:
    texts = [(SKILL / "SKILL.md").read_text(), (SKILL / "references" / "setup.md").read_text()]
    sizes = {int(n) for text in texts for n in re.findall(r"agl eval agl\.yaml --limit (\d+)`", text)}
    assert sizes == {SMOKE_TASKS}
