"""Shared by the skill's scripts: find agl runs and read their stores. Standard library only, read only.

A run is `.agl/runs/<run-id>/` (or `$AGL_HOME/runs/<run-id>/`) holding `manifest.json` and `store.sqlite`.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any, NoReturn

TERMINAL = ("succeeded", "failed", "timed_out")


def fail(message: str, code: int = 2) -> NoReturn:
    """Usage errors go to stderr as JSON too, so a calling agent can parse every outcome."""
    sys.stderr.write(json.dumps({"error": message}) + "\n")
    raise SystemExit(code)


def runs_root(runs_dir: str | None) -> Path:
    if runs_dir:
        return Path(runs_dir).expanduser()
    home = os.environ.get("AGL_HOME")
    return (Path(home) if home else Path.cwd() / ".agl") / "runs"


def find_run(reference: str, runs_dir: str | None) -> Path:
    """A run folder by path, id, unique id prefix, or `latest` (the newest, by id)."""
    as_path = Path(reference).expanduser()
    if (as_path / "manifest.json").is_file():
        return as_path
    root = runs_root(runs_dir)
    runs = sorted(p for p in root.glob("*") if (p / "manifest.json").is_file()) if root.is_dir() else []
    if not runs:
        fail(f"no runs under {root}; run `agl eval` first, or pass --runs-dir")
    if reference == "latest":
        return runs[-1]
    matches = [p for p in runs if p.name == reference] or [p for p in runs if p.name.startswith(reference)]
    if len(matches) != 1:
        fail(f"{reference!r} matches {len(matches)} runs under {root}")
    return matches[0]


def manifest(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "manifest.json").read_text())
    return data


def connect(run: Path) -> sqlite3.Connection:
    path = run / "store.sqlite"
    if not path.is_file():
        fail(f"{run} has no store.sqlite")
    conn = sqlite3.connect(path, timeout=30.0)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA query_only=1")  # these scripts never change a run
    return conn


def reused_ids(conn: sqlite3.Connection) -> set[str]:
    """Ids of the rollouts a run copied from earlier runs (agl's result cache): paid for there, not here."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'cache_imported'").fetchone()
    except sqlite3.OperationalError:  # a store from before the meta table
        return set()
    return set(json.loads(row[0])) if row else set()


def latest_rollouts(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The newest attempt of each (variant, task, seed), in creation order."""
    newest: dict[str, dict[str, Any]] = {}
    for row in conn.execute("SELECT * FROM rollouts ORDER BY rowid"):
        item = dict(row)
        old = newest.get(item["key"])
        if old is None or item["attempt"] >= old["attempt"]:
            newest[item["key"]] = item
    return list(newest.values())


def clip(text: Any, limit: int) -> Any:
    """Long text keeps its head and its tail, where errors and final answers usually are."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return text[:half] + f"\n... [{len(text) - 2 * half} characters cut] ...\n" + text[-half:]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def emit(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
