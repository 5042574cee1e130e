"""`agl doctor` on this machine: each check says what it found, and a missing optional piece names its fix without
failing the command."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from agl_cli.main import app

COMPILER = "C++ compiler (the embedded engine's kernels)"


def _checks(monkeypatch: pytest.MonkeyPatch, **env: str) -> tuple[int, dict[str, dict[str, object]]]:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(app, ["doctor", "--json"])
    return result.exit_code, {c["name"]: c for c in json.loads(result.stdout)["checks"]}


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler on this machine")
def test_doctor_finds_the_compiler_the_engine_builds_its_kernel_with(monkeypatch: pytest.MonkeyPatch) -> None:
    _, checks = _checks(monkeypatch, CXX="c++")
    assert checks[COMPILER]["ok"] and checks[COMPILER]["detail"] == shutil.which("c++")
    assert checks[COMPILER]["fix"] is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_doctor_says_what_a_c_compiler_alone_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    _, checks = _checks(monkeypatch, CXX="no-such-compiler-agl", CC="cc")
    compiler = checks[COMPILER]
    assert not compiler["ok"] and not compiler["required"]
    assert f"{shutil.which('cc')} builds the attention alone as C" in str(compiler["detail"])
    assert "one thread" in str(compiler["detail"]) and "g++" in str(compiler["fix"])


def test_doctor_names_the_fix_for_a_missing_compiler_without_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    code, checks = _checks(monkeypatch, CXX="no-such-compiler-agl", CC="no-cc-either-agl")
    compiler = checks[COMPILER]
    assert not compiler["ok"] and not compiler["required"]
    detail = str(compiler["detail"])
    assert "neither no-such-compiler-agl nor no-cc-either-agl found" in detail and "torch" in detail
    assert "g++" in str(compiler["fix"]) and "$CXX" in str(compiler["fix"])
    # Optional: the exit code is what the required checks make it, with or without a compiler.
    assert code == _checks(monkeypatch, CXX="c++", CC="cc")[0]
