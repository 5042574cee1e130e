"""Run directories: `.agl/runs/<run-id>/` with the store, the resolved config and a manifest."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agl_cli.errors import UsageError
from rl_backend.store.db import RunStore
from rl_backend.store.runlock import RunLock, RunLockedError

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
        path = self.path / MANIFEST
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UsageError(f"{self.path} has no {MANIFEST}: it is not a complete agl run") from None
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested past Python's stack
            raise UsageError(
                f"{path} is damaged ({type(exc).__name__}: {str(exc)[:200]})",
                hint="restore it from a copy; the run's results are in store.sqlite next to it",
            ) from None
        except OSError as exc:
            raise UsageError(f"{path}: cannot read it ({exc.strerror})") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("kind"), str):
            raise UsageError(
                f"{path} is damaged: it is not an agl run manifest (a JSON object with `kind`)",
                hint="restore it from a copy; the run's results are in store.sqlite next to it",
            )
        return manifest

    def require(self, manifest: dict[str, Any], *keys: str) -> None:
        """A manifest that lacks what resuming needs is damaged: say so, instead of failing on a missing key."""
        missing = [key for key in keys if key not in manifest]
        if missing:
            raise UsageError(
                f"{self.path / MANIFEST} is damaged: it lacks {', '.join(missing)}",
                hint="restore it from a copy, or start a new run (finished results stay in this run's store)",
            )

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the run for the block: a second agl process on the same run is refused (exit 2) with the holder's pid."""
        try:
            lock = RunLock(self.path).acquire(command="agl " + shlex.join(sys.argv[1:]))
        except RunLockedError as exc:
            who = f"process {exc.pid}" if exc.pid else "another agl process"
            raise UsageError(
                f"run {self.run_id} is in use by {who}" + (f" ({exc.command})" if exc.command else ""),
                hint="wait for it to finish, or stop it" + (f" (kill {exc.pid})" if exc.pid else "")
                + f" and run the command again; `agl report {self.run_id}` reads the run meanwhile",
            ) from None
        except OSError as exc:
            raise UsageError(f"cannot lock {self.path} for this run ({exc.strerror})",
                             hint="agl writes into the run folder: check that it is yours and writable") from None
        try:
            yield
        finally:
            lock.release()

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


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A run folder's manifest, or None when it has none or it is damaged: scans over every run skip those."""
    try:
        return RunDir(folder).manifest()
    except UsageError:
        return None


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
