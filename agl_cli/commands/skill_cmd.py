"""`agl skill install`: put the agent-lightning skill where Claude Code, Codex or GitHub Copilot read skills,
for people without `gh skill install` (the same folders gh uses)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from agl_cli.cli_support import handle_errors

app = typer.Typer(
    name="skill",
    help="The agent-lightning skill for coding agents (Claude Code, Codex, GitHub Copilot).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class Agent(str, Enum):
    claude_code = "claude-code"
    codex = "codex"
    github_copilot = "github-copilot"


class Scope(str, Enum):
    project = "project"
    user = "user"


@app.command("install")
@handle_errors
def install_command(
    agent: Annotated[Optional[Agent], typer.Option(help="The coding agent that will read the skill.")] = None,  # noqa: UP045
    scope: Annotated[Scope, typer.Option(help="project: this git repository; user: your home folder.")] = Scope.project,
    dir_: Annotated[Optional[Path], typer.Option("--dir", help="Install into this skills folder instead (no --agent needed).")] = None,  # noqa: UP045,E501
    force: Annotated[bool, typer.Option("--force", help="Replace a different copy already there.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Install the agent-lightning skill: project .claude/skills or .agents/skills; user ~/.claude, ~/.codex, ~/.copilot."""
    from agl_cli.console import print_json, stdout_console
    from agl_cli.errors import UsageError
    from agl_cli.skill_files import install, skills_dir

    if dir_ is not None:
        target_root = dir_.expanduser()
    elif agent is None:
        raise UsageError("name the coding agent: --agent claude-code, codex or github-copilot (or give --dir)")
    else:
        target_root = skills_dir(agent.value, scope.value, cwd=Path.cwd(), home=Path.home())
    path, action, files = install(target_root.resolve(), force=force)
    document = {
        "agent": agent.value if agent else None, "scope": None if dir_ is not None else scope.value,
        "path": str(path), "action": action, "files": files,
    }
    if json_output:
        print_json(document)
        return
    out = stdout_console()
    out.print(f"{action}: {path} ({len(files)} files)", markup=False)
    if action != "unchanged":
        out.print("start a new session of the coding agent so it picks the skill up", markup=False)
