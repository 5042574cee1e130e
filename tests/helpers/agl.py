"""Running `agl` from tests (as a subprocess of the interpreter running them, or in this process through typer's
runner), and writing the specs and task files those runs read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"  # agents, graders and models the tests run
REPO = Path(__file__).resolve().parents[2]
AGL = [sys.executable, "-m", "agl_cli"]  # `agl` as a subprocess of the interpreter running the tests
GATEWAY_SERVE = [*AGL, "gateway", "serve"]


def agl_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["NO_COLOR"] = "1"
    env.pop("AGL_HOME", None)
    env.update(extra or {})
    return env


def run_agl(args: list[str], cwd: Path, *, env: dict[str, str] | None = None, timeout: float = 600,
            check: bool = False) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*AGL, *args], cwd=cwd, env=agl_env(env), capture_output=True, text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"agl {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def process_alive(pid: int) -> bool:
    """True for a running process; a killed one that nobody reaped yet (a zombie) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" not in status.read_text()


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll until `predicate()` is true: a state the process shows (a row written, a file made), never a sleep."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def invoke_agl(args: list[str], cwd: Path, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`agl ARGS` in this process through typer's runner, for usage errors and other quick exits: the same result as
    run_agl without a second of Python start-up per call. Anything that runs rollouts belongs in run_agl."""
    from typer.testing import CliRunner

    from agl_cli.main import app

    before = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner(env={"NO_COLOR": "1", "AGL_HOME": None, **(env or {})}).invoke(app, args)
    finally:
        os.chdir(before)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["agl", *args], result.exit_code, result.stdout, result.stderr)


def write_tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def write_spec(folder: Path, task_list: list[dict[str, Any]], **overrides: Any) -> Path:
    write_tasks(folder / "tasks.jsonl", task_list)
    spec: dict[str, Any] = {
        "name": "scripted",
        "agent": {"command": f"python {FIXTURES / 'behave_agent.py'} {{task_file}} {{output_file}}", "timeout_s": 20},
        "tasks": {"path": "tasks.jsonl"},
        "grader": {"command": f"python {FIXTURES / 'behave_grader.py'} {{task_file}} {{output_file}}"},
        "concurrency": 4,
    }
    for key, value in overrides.items():
        if value is None:
            spec.pop(key, None)
        elif isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {k: v for k, v in {**spec[key], **value}.items() if v is not None}
        else:
            spec[key] = value
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
