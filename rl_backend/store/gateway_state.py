"""What a gateway must remember across a restart for a train to go on: the rollouts it admitted (id, token, knobs),
where the servers of the policy being trained are, whether it is paused (and for how long a call waits), and the
model version its records carry.

A cluster's gateway (`agl gateway serve --in-cluster`) is a pod like any other: an eviction, a node upgrade or an
OOM kill restarts it mid-train. The trainer registered the policy's servers once and every running agent holds the
token it was given, so a gateway that forgot them would refuse every later call (401, or 503 "not registered yet").
This keeps them in a small SQLite file next to the gateway's store (on its volume), written on each admin change
(not on each proxied call), and read back when the gateway starts. The file holds the rollouts' tokens: it is
created readable by its owner only, like the store.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (id TEXT PRIMARY KEY, token TEXT NOT NULL, knobs TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS endpoints (upstream TEXT PRIMARY KEY, base_urls TEXT NOT NULL, model TEXT);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def state_path(store_path: Path) -> Path:
    """The state file that goes with a store: `store.sqlite` -> `store.admin.sqlite`."""
    return store_path.with_name(f"{store_path.stem}.admin{store_path.suffix or '.sqlite'}")


class AdminState:
    """The durable copy of a gateway's admin state. Thread-safe: admin calls come from the event loop, an
    in-process trainer's from its own thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))  # owner-only before the first token lands in it
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # an admitted rollout survives a kill right after its answer
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            self._db.execute(sql, args)

    def put_rollout(self, rollout_id: str, token: str, knobs: dict[str, Any]) -> None:
        self._write("INSERT OR REPLACE INTO rollouts VALUES (?, ?, ?)", (rollout_id, token, json.dumps(knobs)))

    def drop_rollout(self, rollout_id: str) -> None:
        self._write("DELETE FROM rollouts WHERE id = ?", (rollout_id,))

    def put_endpoints(self, upstream: str, base_urls: list[str], model: str | None) -> None:
        self._write("INSERT OR REPLACE INTO endpoints VALUES (?, ?, ?)", (upstream, json.dumps(base_urls), model))

    def put_setting(self, key: str, value: Any) -> None:
        self._write("INSERT OR REPLACE INTO settings VALUES (?, ?)", (key, json.dumps(value)))

    def rollouts(self) -> dict[str, tuple[str, dict[str, Any]]]:
        with self._lock:
            rows = self._db.execute("SELECT id, token, knobs FROM rollouts").fetchall()
        return {rid: (token, json.loads(knobs)) for rid, token, knobs in rows}

    def endpoints(self) -> dict[str, tuple[list[str], str | None]]:
        with self._lock:
            rows = self._db.execute("SELECT upstream, base_urls, model FROM endpoints").fetchall()
        return {upstream: (json.loads(urls), model) for upstream, urls, model in rows}

    def settings(self) -> dict[str, Any]:
        with self._lock:
            rows = self._db.execute("SELECT key, value FROM settings").fetchall()
        return {key: json.loads(value) for key, value in rows}

    def close(self) -> None:
        with self._lock:
            self._db.close()
