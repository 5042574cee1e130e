"""Run directories: `.agl/runs/<run-id>/` with the store, the resolved config and a manifest."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agl_cli.errors import UsageError
from rl_backend.store.db import RunStore

MANIFEST = "manifest.json"
STORE = "store.sqlite"
CONFIG = "config.yaml"


def runs_root(runs_dir: Path | None = None) -> Path:
    if runs_dir is not None:
        return runs_dir
    home = os.environ.get("AGL_HOME")
    return (Path(home) if home else Path.cwd() / ".agl") / "runs"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def git_sha(folder: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@dataclass
class RunDir:
    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def store_path(self) -> Path:
        return self.path / STORE

    def open_store(self) -> RunStore:
        return RunStore(self.store_path)

    def manifest(self) -> dict[str, Any]:
        try:
            manifest: dict[str, Any] = json.loads((self.path / MANIFEST).read_text())
            return manifest
        except FileNotFoundError:
            raise UsageError(f"{self.path} has no {MANIFEST}: it is not a complete agl run") from None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        tmp = self.path / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        tmp.replace(self.path / MANIFEST)

    def rollout_dir(self, rollout_id: str) -> Path:
        folder = self.path / "rollouts" / rollout_id
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    @classmethod
    def create(cls, root: Path, *, spec_data: dict[str, Any], manifest: dict[str, Any]) -> RunDir:
        run_id = new_run_id()
        path = root / run_id
        path.mkdir(parents=True, exist_ok=False)
        run = cls(path)
        (path / CONFIG).write_text(yaml.safe_dump(spec_data, sort_keys=False))
        run.write_manifest(
            {"run_id": run_id, "created_at": time.time(), "command_line": sys.argv, **manifest}
        )
        return run


def find_run(reference: str, runs_dir: Path | None = None) -> RunDir:
    """A run by path, by id, by unique id prefix, or `latest`."""
    as_path = Path(reference)
    if (as_path / MANIFEST).is_file():
        return RunDir(as_path)
    root = runs_root(runs_dir)
    candidates = sorted(p for p in root.glob("*") if (p / MANIFEST).is_file()) if root.is_dir() else []
    if reference == "latest":
        if not candidates:
            raise UsageError(f"no runs under {root}")
        return RunDir(candidates[-1])
    matches = [p for p in candidates if p.name == reference] or [p for p in candidates if p.name.startswith(reference)]
    if len(matches) == 1:
        return RunDir(matches[0])
    if not matches:
        raise UsageError(
            f"no run {reference!r} under {root}",
            hint="`agl runs` lists them; pass --runs-dir or set AGL_HOME if they live elsewhere",
        )
    raise UsageError(f"{reference!r} matches {len(matches)} runs: {', '.join(p.name for p in matches[:5])}")
