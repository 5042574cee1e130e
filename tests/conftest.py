"""Shared test helpers: write specs and task files into a temporary folder, run `agl` as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent


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
        [sys.executable, "-m", "agl_cli", *args], cwd=cwd, env=agl_env(env), capture_output=True, text=True,
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


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


# -- a gateway in front of the scripted upstream (a module may override `fake`, e.g. to set its model version) ------


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    f = FakeUpstream(api_key=UPSTREAM_KEY).start()
    yield f
    f.stop()


@pytest.fixture()
def h(fake: FakeUpstream) -> Iterator[Harness]:
    fake.reset()
    with Harness(fake) as harness:
        yield harness


@pytest.fixture()
def two_torch_threads() -> Iterator[None]:
    """Training tests use two threads (the CI machine's cores), whatever torch picked, and put it back after."""
    import torch  # here, not at the top: most tests never load torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
