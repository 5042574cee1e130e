"""`agl skill install`: the skill lands where each coding agent (and `gh skill install`) looks, at both scopes,
identical to the source; re-installing is a no-op; a different copy is only replaced with --force."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agl_cli.main import app
from agl_cli.skill_files import same_tree, skill_source

REPO = Path(__file__).resolve().parent.parent
EXPECTED = {
    ("claude-code", "project"): "project/.claude/skills",
    ("codex", "project"): "project/.agents/skills",
    ("github-copilot", "project"): "project/.agents/skills",
    ("claude-code", "user"): "home/.claude/skills",
    ("codex", "user"): "home/.codex/skills",
    ("github-copilot", "user"): "home/.copilot/skills",
}


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    (project / "src" / "deep").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    monkeypatch.chdir(project / "src" / "deep")  # project scope means the repository's root, wherever agl runs
    return tmp_path


def _install(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(app, ["skill", "install", *args, "--json"])
    return result.exit_code, (json.loads(result.stdout) if result.exit_code == 0 else {"output": result.output})


@pytest.mark.parametrize(("agent", "scope"), sorted(EXPECTED))
def test_installs_where_the_agent_looks(places: Path, agent: str, scope: str) -> None:
    code, doc = _install("--agent", agent, "--scope", scope)
    assert code == 0, doc
    target = places / EXPECTED[(agent, scope)] / "agent-lightning"
    assert Path(doc["path"]) == target.resolve()
    assert doc["action"] == "installed"
    assert same_tree(skill_source(), target)
    assert "SKILL.md" in doc["files"] and "scripts/failures.py" in doc["files"]
    assert (target / "scripts" / "failures.py").stat().st_mode & 0o111, "scripts stay executable"
    assert _install("--agent", agent, "--scope", scope)[1]["action"] == "unchanged"


def test_a_different_copy_is_replaced_only_with_force(places: Path) -> None:
    code, doc = _install("--agent", "codex")
    target = Path(doc["path"])
    (target / "SKILL.md").write_text("edited by hand\n")
    (target / "extra.txt").write_text("left over\n")
    code, doc = _install("--agent", "codex")
    assert code == 2 and "--force" in doc["output"]
    assert (target / "SKILL.md").read_text() == "edited by hand\n"
    code, doc = _install("--agent", "codex", "--force")
    assert code == 0 and doc["action"] == "replaced"
    assert same_tree(skill_source(), target)
    assert not list(target.parent.glob(".agent-lightning-*")), "no staging folder left behind"


def test_dir_and_claude_config_dir(places: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, doc = _install("--dir", str(places / "elsewhere"))
    assert code == 0 and Path(doc["path"]) == (places / "elsewhere" / "agent-lightning").resolve()
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(places / "claude-config"))
    code, doc = _install("--agent", "claude-code", "--scope", "user")
    assert code == 0 and Path(doc["path"]) == (places / "claude-config" / "skills" / "agent-lightning").resolve()


def test_usage_errors_exit_2(places: Path) -> None:
    assert CliRunner().invoke(app, ["skill", "install"]).exit_code == 2
    assert CliRunner().invoke(app, ["skill", "install", "--agent", "cursor"]).exit_code == 2
    assert CliRunner().invoke(app, ["skill", "install", "--agent", "codex", "--scope", "global"]).exit_code == 2


def test_the_wheel_ships_the_skill() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert '"skills/agent-lightning" = "agl_cli/_skills/agent-lightning"' in text
    assert skill_source() == REPO / "skills" / "agent-lightning"  # an editable install reads the checkout


def test_real_command_line(places: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "agl_cli", "skill", "install", "--agent", "github-copilot"],
                            capture_output=True, text=True, cwd=places / "project", timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "installed:" in result.stdout and ".agents/skills/agent-lightning" in result.stdout
