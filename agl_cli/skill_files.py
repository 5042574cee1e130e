"""The agent-lightning skill's files and where each coding agent looks for them.

The skill lives at `skills/agent-lightning/` in a checkout (the only place `gh skill install` finds it) and ships
inside the wheel as `agl_cli/_skills/agent-lightning`. The install locations mirror gh's registry for the three
agents agl supports, so `agl skill install` and `gh skill install` put the skill in the same place.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agl_cli.errors import AglError, UsageError

SKILL_NAME = "agent-lightning"


@dataclass(frozen=True)
class AgentHost:
    id: str
    name: str
    project_dir: str  # relative to the project root
    user_dir: str  # relative to the home directory


# The same directories as gh's registry (cli/cli internal/skills/registry): Codex and Copilot share the
# cross-agent `.agents/skills` folder at project scope, Claude Code keeps its own.
AGENTS: dict[str, AgentHost] = {
    "claude-code": AgentHost("claude-code", "Claude Code", ".claude/skills", ".claude/skills"),
    "codex": AgentHost("codex", "Codex", ".agents/skills", ".codex/skills"),
    "github-copilot": AgentHost("github-copilot", "GitHub Copilot", ".agents/skills", ".copilot/skills"),
}
SCOPES = ("project", "user")


def skill_source() -> Path:
    """The skill folder: packaged in the wheel, else the checkout's `skills/agent-lightning` (editable installs)."""
    packaged = Path(__file__).parent / "_skills" / SKILL_NAME
    if (packaged / "SKILL.md").is_file():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / "skills" / SKILL_NAME
    if (checkout / "SKILL.md").is_file():
        return checkout
    raise AglError(
        f"the {SKILL_NAME} skill's files are not in this installation of agl",
        hint="reinstall agl (pip install --force-reinstall agl), or use gh skill install",
    )


def project_root(start: Path) -> Path:
    """The git work tree holding `start`, like gh; a folder outside any repository is its own project root."""
    try:
        out = subprocess.run(
            ["git", "-C", str(start), "rev-parse", "--show-toplevel"],
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return start
    top = out.stdout.strip()
    return Path(top) if out.returncode == 0 and top else start


def skills_dir(agent: str, scope: str, *, cwd: Path, home: Path) -> Path:
    """Where `agent` reads skills at `scope`."""
    if agent not in AGENTS:
        raise UsageError(f"unknown agent {agent!r}; choose one of {', '.join(AGENTS)}")
    if scope not in SCOPES:
        raise UsageError(f"unknown scope {scope!r}; choose project or user")
    host = AGENTS[agent]
    if scope == "project":
        return project_root(cwd) / host.project_dir
    # Claude Code moves its whole configuration folder when CLAUDE_CONFIG_DIR is set; gh honours it too.
    if agent == "claude-code" and os.environ.get("CLAUDE_CONFIG_DIR"):
        return Path(os.environ["CLAUDE_CONFIG_DIR"]) / "skills"
    return home / host.user_dir


def _files(folder: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def same_tree(a: Path, b: Path) -> bool:
    files = _files(a)
    if files != _files(b):
        return False
    return all(filecmp.cmp(a / f, b / f, shallow=False) for f in files)


def install(target_root: Path, *, force: bool) -> tuple[Path, str, list[str]]:
    """Copy the skill to `target_root/agent-lightning`; returns (path, what happened, files).

    An existing copy that differs (edited by hand, or from another agl version) is only replaced with `force`.
    The new copy is written next to the target and renamed into place, so a failed copy never leaves half a skill.
    """
    source = skill_source()
    target = target_root / SKILL_NAME
    files = _files(source)
    if target.exists():
        if not target.is_dir():
            raise UsageError(f"{target} exists and is not a folder")
        if same_tree(source, target):
            return target, "unchanged", files
        if not force:
            raise UsageError(
                f"{target} already holds a different copy of the skill",
                hint="pass --force to replace it with this agl's version",
            )
    target_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{SKILL_NAME}-", dir=target_root))
    try:
        copied = staging / SKILL_NAME
        shutil.copytree(source, copied, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for script in (copied / "scripts").glob("*.py"):
            script.chmod(0o755)
        action = "installed"
        if target.exists():
            shutil.rmtree(target)
            action = "replaced"
        copied.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, action, files
