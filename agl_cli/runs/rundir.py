"""Run directories, `.agl/runs/<run-id>/` with the store, the resolved config and a manifest, and the runs index:
the one place that lists the runs folder, finds a run by id or prefix, and picks runs by kind, spec or agent
version, setting aside damaged ones with the reason."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agl_cli.errors import AglError, UsageError
from rl_backend.store.db import RunStore, StoreError
from rl_backend.store.failures import explain_os
from rl_backend.store.runlock import RunLock, RunLockedError, lock_holder

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

    def open_store(self, *, read_only: bool = False) -> RunStore:
        return RunStore(self.store_path, read_only=read_only)

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
                             hint="agl writes into the run folder: check that it is yours and writable (an archived "
                             "run: copy its folder into a writable runs folder, and pass --runs-dir)") from None
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
        """A new run folder under `root`; a runs folder agl cannot write (read-only, full) is an error saying so."""
        run_id = new_run_id()
        path = root / run_id
        try:
            path.mkdir(parents=True, exist_ok=False)
            run = cls(path)
            (path / CONFIG).write_text(yaml.safe_dump(spec_data, sort_keys=False))
            run.write_manifest(
                {"run_id": run_id, "created_at": time.time(), "command_line": sys.argv, **manifest}
            )
        except OSError as exc:
            explained = explain_os(exc, Path(exc.filename) if exc.filename else path)
            if explained is None:
                raise
            raise _as_agl_error(explained) from None
        return run


@dataclass(frozen=True)
class IndexedRun:
    """A run of the runs folder with its manifest."""

    run: RunDir
    manifest: dict[str, Any]

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def kind(self) -> str | None:
        kind = self.manifest.get("kind")
        return kind if isinstance(kind, str) else None

    @property
    def status(self) -> str | None:
        """The manifest's status, except that a run it calls `running` which no live process holds was stopped
        without a chance to say so (killed, or its disk refused the last write): it is `interrupted`."""
        status = self.manifest.get("status")
        if status == "running" and lock_holder(self.run.path) is None:
            return "interrupted"
        return status if isinstance(status, str) else None

    @property
    def spec_path(self) -> str | None:
        spec = self.manifest.get("spec_path")
        return spec if isinstance(spec, str) else None

    @property
    def created_at(self) -> float:
        created = self.manifest.get("created_at")
        return float(created) if isinstance(created, int | float) else 0.0

    @property
    def has_store(self) -> bool:
        return self.run.store_path.is_file()

    def of_spec(self, spec_path: Path) -> bool:
        return self.spec_path is not None and Path(self.spec_path).expanduser().resolve() == spec_path.resolve()


@dataclass(frozen=True)
class SkippedRun:
    """A run folder the index cannot use, and why."""

    path: Path
    reason: str


@dataclass
class RunsIndex:
    """The runs under one runs folder, oldest first (run ids begin with their creation time); `skipped` are the
    folders with a damaged manifest, each with its reason."""

    root: Path
    runs: list[IndexedRun] = field(default_factory=list)
    skipped: list[SkippedRun] = field(default_factory=list)

    @classmethod
    def scan(cls, runs_dir: Path | None = None) -> RunsIndex:
        """Every run folder of the runs folder once: a symlink to a run listed already (or to the same run as another
        symlink) is that run, not a second one, so nothing is counted twice."""
        index = cls(runs_root(runs_dir))
        found = sorted(p for p in index.root.glob("*") if (p / MANIFEST).is_file()) if index.root.is_dir() else []
        folders, seen = [], set()
        for folder in sorted(found, key=lambda p: p.is_symlink()):  # real folders first: they keep their own name
            target = folder.resolve()
            if target not in seen:
                seen.add(target)
                folders.append(folder)
        for folder in sorted(folders):
            try:
                index.runs.append(IndexedRun(RunDir(folder), RunDir(folder).manifest()))
            except UsageError as exc:
                index.skipped.append(SkippedRun(folder, exc.message))
        # Oldest first: an id names its second, so runs started within the same second are ordered by their
        # manifests' creation times, not by the random end of their ids.
        index.runs.sort(key=lambda r: (r.run.path.name.rsplit("-", 1)[0], r.created_at, r.run.path.name))
        return index

    def select(self, *, kind: str | None = None, spec: Path | None = None, agent_version: str | None = None,
               with_store: bool = False, exclude: Path | None = None) -> list[IndexedRun]:
        """The runs that match every filter given, oldest first."""
        excluded = exclude.resolve() if exclude is not None else None
        return [
            r for r in self.runs
            if (kind is None or r.kind == kind) and (spec is None or r.of_spec(spec))
            and (agent_version is None or r.manifest.get("agent_version") == agent_version)
            and (not with_store or r.has_store) and (excluded is None or r.run.path.resolve() != excluded)
        ]

    def find(self, reference: str) -> RunDir:
        """A run by id, by unique id prefix, or `latest`; a run with a damaged manifest is found too, so that the
        command about it can say what is damaged."""
        folders = sorted([r.run.path for r in self.runs] + [s.path for s in self.skipped])
        if reference == "latest":
            if not folders:
                raise UsageError(f"no runs under {self.root}")
            return RunDir(folders[-1])
        matches = [p for p in folders if p.name == reference] or [p for p in folders if p.name.startswith(reference)]
        if len(matches) == 1:
            return RunDir(matches[0])
        if not matches:
            raise UsageError(
                f"no run {reference!r} under {self.root}",
                hint="`agl runs` lists them; pass --runs-dir or set AGL_HOME if they live elsewhere",
            )
        raise UsageError(f"{reference!r} matches {len(matches)} runs: {', '.join(p.name for p in matches[:5])}")


def find_run(reference: str, runs_dir: Path | None = None) -> RunDir:
    """A run by path, by id, by unique id prefix, or `latest`."""
    as_path = Path(reference)
    if (as_path / MANIFEST).is_file():
        return RunDir(as_path)
    return RunsIndex.scan(runs_dir).find(reference)


def read_stores(runs: Iterable[IndexedRun], skipped: list[SkippedRun] | None = None
                ) -> Iterator[tuple[IndexedRun, RunStore]]:
    """Each run's store, opened read only and closed once the caller moves on; a run whose store cannot be read
    (damaged, newer than this agl, still being created) is passed over, with its reason added to `skipped`."""
    for entry in runs:
        try:
            store = RunStore(entry.run.store_path, read_only=True)
        except StoreError as exc:
            if skipped is not None:
                skipped.append(SkippedRun(entry.run.path, str(exc)))
            continue
        try:
            yield entry, store
        finally:
            store.close()


def _as_agl_error(error: StoreError, message: str | None = None, hint: str | None = None) -> AglError:
    result = AglError(message or str(error), hint=hint if hint is not None else error.hint)
    result.exit_code = error.exit_code
    return result


def stopped_by_failure(run: RunDir, exc: BaseException, resume: str) -> AglError | None:
    """The error to show when the run's store or folder refused a write (locked by another process, a full disk, a
    read-only folder), after marking the run interrupted so that it is listed as such and resumes; None for any
    other exception (the caller re-raises it)."""
    error: StoreError | None = None
    if isinstance(exc, StoreError):
        error = exc
    elif isinstance(exc, OSError):
        error = explain_os(exc, Path(exc.filename) if exc.filename else run.path)
    if error is None:
        return None
    try:
        manifest = run.manifest()
        manifest["status"] = "interrupted"
        run.write_manifest(manifest)
    except (OSError, UsageError):
        pass  # the same disk may refuse this too: `agl runs` sees no holder of the run and says interrupted anyway
    hint = (error.hint + "; then " if error.hint else "") + f"resume the run: {resume}"
    return _as_agl_error(error, f"{error} — run {run.run_id} stopped; every rollout that finished is kept", hint)
