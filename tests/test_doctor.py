"""`agl doctor` on this machine: each check says what it found, and a missing optional piece names its fix without
failing the command."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from agl_cli.main import app

COMPILER = "C compiler (the embedded engine's attention kernel)"


def _checks(monkeypatch: pytest.MonkeyPatch, **env: str) -> tuple[int, dict[str, dict[str, object]]]:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(app, ["doctor", "--json"])
    return result.exit_code, {c["name"]: c for c in json.loads(result.stdout)["checks"]}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_doctor_finds_the_c_compiler_the_engine_builds_its_kernel_with(monkeypatch: pytest.MonkeyPatch) -> None:
    _, checks = _checks(monkeypatch, CC="cc")
    assert checks[COMPILER]["ok"] and checks[COMPILER]["detail"] == shutil.which("cc")
    assert checks[COMPILER]["fix"] is None


def test_doctor_names_the_fix_for_a_missing_compiler_without_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    code, checks = _checks(monkeypatch, CC="no-such-compiler-agl")
    compiler = checks[COMPILER]
    assert not compiler["ok"] and not compiler["required"]
    assert "no-such-compiler-agl not found" in str(compiler["detail"]) and "torch" in str(compiler["detail"])
    assert "gcc" in str(compiler["fix"]) and "$CC" in str(compiler["fix"])
    # Optional: the exit code is what the required checks make it, with or without a compiler.
    assert code == _checks(monkeypatch, CC="cc")[0]
