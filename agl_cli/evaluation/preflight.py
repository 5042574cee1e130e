"""Checks before the first rollout: an agent or grader command whose program is missing or not executable would
fail every rollout the same way, so it is a config error (exit 2) naming the file, the line and the fix.

Only what can be known without running anything is checked: the command's program (a path, or a name on the PATH
the agent gets) and, for an interpreter (`python`, `node`, `bash`...), the script it is given. Commands that start
with shell syntax (a variable assignment, a builtin, a subshell) are left to the shell.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from agl_cli.errors import ConfigError
from agl_cli.evaluation.grade_channel import GRADER_DIR_ENV
from agl_cli.spec.command_template import fill
from agl_cli.spec.schema import ExperimentSpec
from agl_cli.spec.yaml_source import YamlDocument

_INTERPRETERS = {"python", "python3", "node", "bash", "sh", "ruby", "perl", "deno", "bun"}
_SHELL_WORDS = {"cd", "exec", "env", "export", "set", "if", "for", "while", "case", "source", ".", "eval", "time",
                "nice", "timeout", "nohup", "command", "builtin", "{", "(", "!", "true", "false", "test", "["}
_SAMPLE = {"task_file": "task.json", "output_file": "output.txt", "rollout_dir": ".", "rollout_id": "r0",
           "python": sys.executable}


def _first_words(command: str) -> list[str]:
    try:
        return shlex.split(fill(command, _SAMPLE))
    except ValueError:  # unbalanced quotes and the like: the shell will say
        return []


def _agent_path() -> str:
    # The agent's processes find agl's own Python first (agl_cli.evaluation.runner), so `python` resolves the same here.
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def command_problem(command: str, cwd: Path) -> str | None:
    """Why `command` cannot start in `cwd`, or None when it can (or when only the shell could tell)."""
    words = _first_words(command)
    if not words or "=" in words[0] or words[0] in _SHELL_WORDS or any(c in words[0] for c in "$`|&;<>*?"):
        return None
    program = words[0]
    if "/" in program:
        path = Path(program) if Path(program).is_absolute() else cwd / program
        if not path.exists():
            return f"{program} does not exist (looked for {path})"
        if path.is_dir():
            return f"{program} is a folder, not a program"
        if not os.access(path, os.X_OK):
            return (f"{program} is not executable: make it so (chmod +x {shlex.quote(str(path))}), or run it through "
                    f"its interpreter (e.g. `python {program}` or `sh {program}`)")
    elif shutil.which(program, path=_agent_path()) is None:
        return f"{program!r} is not a command on PATH"
    name = Path(program).name
    if name.rstrip("0123456789.") in _INTERPRETERS and len(words) > 1:
        script = words[1]
        if not script.startswith("-") and Path(script).suffix and script not in _SAMPLE.values():
            path = Path(script) if Path(script).is_absolute() else cwd / script
            if not path.is_file():
                return f"{name} is given {script}, which does not exist (looked for {path})"
    return None


def check_commands(spec: ExperimentSpec, *, spec_path: Path | None = None) -> None:
    """ConfigError for the agent or grader command that cannot start; each is only checked when it runs here (in a
    cluster trainer's pod graders run in the grader container, on another image: $AGL_GRADER_DIR)."""
    path = spec_path if spec_path is not None else spec.base_dir / "agl.yaml"
    checks = [] if os.environ.get(GRADER_DIR_ENV) else [("grader", spec.grader.command)]
    if spec.runner == "local":
        checks.insert(0, ("agent", spec.agent.command))
    for section, command in checks:
        if not command:
            continue
        problem = command_problem(command, spec.base_dir)
        if problem is None:
            continue
        line = _line_of(path, (section, "command"))
        raise ConfigError(
            f"{path}{f':{line}' if line else ''}: `{section}.command`: {problem}; every rollout would fail the same way",
            hint=f"commands run in {spec.base_dir} (the folder of agl.yaml), with agl's Python first on PATH",
        )


def _line_of(path: Path, location: tuple[str, ...]) -> int | None:
    try:
        return YamlDocument.load(path).line_of(location)
    except ConfigError:
        return None
