"""The run store: one SQLite database (WAL) per run, with a versioned schema and forward migrations.

Writers in several threads (the gateway, the runner) and processes (a resumed run) share it safely:
each RunStore serialises its own writes behind a lock, and SQLite's WAL and busy timeout do the rest.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rl_backend.store.records import (
    AgentProcess,
    CallRecord,
    CallTotals,
    FailureKind,
    ModelUse,
    RewardSource,
    Rollout,
    RolloutStatus,
    RouteKind,
)
from rl_backend.store.runlock import lock_holder

# Each entry moves the schema from version i to i+1. Never edit a shipped entry: append a new one.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE variants (
        name TEXT PRIMARY KEY,
        hash TEXT NOT NULL,
        knobs TEXT NOT NULL
    );
    CREATE TABLE rollouts (
        id TEXT PRIMARY KEY,
        key TEXT NOT NULL,
        variant TEXT NOT NULL,
        task_id TEXT NOT NULL,
        split TEXT,
        seed INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        status TEXT NOT NULL,
        reward REAL,
        reward_source TEXT NOT NULL DEFAULT 'none',
        grader_detail TEXT,
        failure TEXT,
        error TEXT,
        exit_code INTEGER,
        started_at REAL,
        ended_at REAL,
        stdout_tail TEXT,
        stderr_tail TEXT,
        output TEXT,
        UNIQUE (key, attempt)
    );
    CREATE INDEX rollouts_key ON rollouts (key);
    CREATE TABLE calls (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        call_id TEXT NOT NULL UNIQUE,
        rollout_id TEXT,
        api TEXT NOT NULL,
        upstream TEXT NOT NULL,
        request_model TEXT,
        model TEXT,
        request TEXT NOT NULL,
        response TEXT,
        stream INTEGER NOT NULL,
        status_code INTEGER,
        error TEXT,
        input_tokens INTEGER,
        output_tokens INTEGER,
        cached_tokens INTEGER,
        reasoning_tokens INTEGER,
        cost_usd REAL,
        started_at REAL NOT NULL,
        ended_at REAL,
        latency_s REAL,
        ttft_s REAL,
        prompt_token_ids TEXT,
        completion_token_ids TEXT,
        logprobs TEXT,
        model_version TEXT,
        knobs_applied TEXT
    );
    CREATE INDEX calls_rollout ON calls (rollout_id);
    CREATE TABLE reported_rewards (
        rollout_id TEXT PRIMARY KEY,
        reward REAL NOT NULL,
        detail TEXT,
        reported_at REAL NOT NULL
    );
    """,
    # 1 -> 2: training curves, one row per policy update (rl_backend.trainer.curves reads and writes them).
    """
    CREATE TABLE train_steps (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        step INTEGER NOT NULL,
        model_version TEXT NOT NULL,
        updated INTEGER NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL NOT NULL,
        rollouts INTEGER NOT NULL,
        trained_rollouts INTEGER NOT NULL,
        reward_mean REAL,
        pass_rate REAL,
        entropy REAL,
        kl REAL,
        loss REAL,
        grad_norm REAL,
        tokens_per_s REAL,
        rollouts_per_min REAL,
        staleness_mean REAL,
        staleness_max INTEGER,
        checkpoint TEXT,
        metrics TEXT NOT NULL
    );
    CREATE INDEX train_steps_step ON train_steps (step);
""",
    # 2 -> 3: the model the upstream reported serving each call, and how the gateway chose it (records.RouteKind).
    """
    ALTER TABLE calls ADD COLUMN served_model TEXT;
    ALTER TABLE calls ADD COLUMN route TEXT
""",
    # 3 -> 4: the agent process of each running local rollout (records.AgentProcess), so that a resume after agl
    # was killed ends what it left running before it runs those rollouts again.
    """
    CREATE TABLE agent_processes (
        rollout_id TEXT PRIMARY KEY,
        pid INTEGER NOT NULL,
        pgid INTEGER NOT NULL,
        start_ticks INTEGER,
        command TEXT NOT NULL,
        tag TEXT NOT NULL,
        owner_pid INTEGER NOT NULL,
        owner_start_ticks INTEGER,
        started_at REAL NOT NULL
    );
""",
]

_ROLLOUT_JSON = ("grader_detail",)
_CALL_JSON = ("request", "response", "prompt_token_ids", "completion_token_ids", "logprobs", "knobs_applied")


class StoreError(RuntimeError):
    """A store that cannot be used as it is (damaged, too new, held by another process): the message says which."""


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in str(exc)


# Per rollout: calls, tokens, the cost of the priced calls and how many calls have no price (NULL cost: unknown, which
# a plain SUM would silently skip).
_CALL_TOTALS_SQL = (
    "SELECT rollout_id, COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
    "COALESCE(SUM(cost_usd), 0.0), SUM(CASE WHEN cost_usd IS NULL THEN 1 ELSE 0 END) "
    "FROM calls WHERE rollout_id IS NOT NULL GROUP BY rollout_id"
)


def call_totals(conn: sqlite3.Connection) -> dict[str, CallTotals]:
    """Per rollout id, what its calls used (see CallTotals); summed in SQL, so large calls are never loaded."""
    return {
        str(rid): CallTotals(int(n), int(tin), int(tout), float(usd), int(unpriced or 0))
        for rid, n, tin, tout, usd, unpriced in conn.execute(_CALL_TOTALS_SQL)
    }


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def model_use(conn: sqlite3.Connection) -> dict[str, list[ModelUse]]:
    """Per rollout id, its calls grouped by requested name, upstream/model served, route and reported name."""
    result: dict[str, list[ModelUse]] = {}
    for rid, requested, upstream, model, route, reported, n in conn.execute(
        "SELECT rollout_id, request_model, upstream, model, route, served_model, COUNT(*) FROM calls "
        "WHERE rollout_id IS NOT NULL GROUP BY rollout_id, request_model, upstream, model, route, served_model"
    ):
        served = f"{upstream}/{model}" if model else str(upstream)
        result.setdefault(str(rid), []).append(
            ModelUse(requested, served, RouteKind(route) if route else None, reported, int(n))
        )
    return result


class RunStore:
    """A handle on one run's `store.sqlite`. Safe to share between threads of one process."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path} cannot be opened as a run store ({exc})") from None
        try:
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL keeps every committed row across a kill -9 of this process (the WAL is written, not fsynced).
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA busy_timeout=30000")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            if not _is_damage(exc):
                raise
            raise self._damaged(exc) from None

    def _damaged(self, exc: sqlite3.DatabaseError) -> StoreError:
        return StoreError(
            f"{self.path} is damaged and cannot be read ({exc}); restore it from a copy, or start a new run"
        )

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The connection, under this store's lock; a damaged file is a StoreError naming it, not a traceback."""
        with self._lock:
            try:
                yield self._conn
            except sqlite3.DatabaseError as exc:
                if _is_damage(exc):
                    raise self._damaged(exc) from None
                raise

    # -- schema -------------------------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        with self._lock:
            current = self.schema_version
            if current > len(MIGRATIONS):
                raise StoreError(
                    f"{self.path} has schema version {current}, newer than this agl understands "
                    f"({len(MIGRATIONS)}); upgrade agl to read it."
                )
            for version in range(current, len(MIGRATIONS)):
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    # Another process may have migrated between our read and our lock.
                    if self.schema_version > version:
                        self._conn.execute("COMMIT")
                        continue
                    for statement in MIGRATIONS[version].split(";"):
                        if statement.strip():
                            self._conn.execute(statement)
                    self._conn.execute(f"PRAGMA user_version={version + 1}")
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._reading() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- meta and variants ---------------------------------------------------------------------------------------

    def set_meta(self, key: str, value: Any) -> None:
        with self.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        with self._reading() as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row["value"])

    def upsert_variant(self, name: str, hash_: str, knobs: dict[str, Any]) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO variants (name, hash, knobs) VALUES (?, ?, ?)", (name, hash_, json.dumps(knobs))
            )

    def variants(self) -> dict[str, dict[str, Any]]:
        with self._reading() as conn:
            rows = conn.execute("SELECT name, hash, knobs FROM variants ORDER BY rowid").fetchall()
        return {r["name"]: {"hash": r["hash"], "knobs": json.loads(r["knobs"])} for r in rows}

    # -- rollouts ------------------------------------------------------------------------------------------------

    def put_rollout(self, rollout: Rollout) -> None:
        data = rollout.model_dump(mode="json")
        for name in _ROLLOUT_JSON:
            data[name] = _dumps(data[name])
        columns = ", ".join(data)
        marks = ", ".join("?" for _ in data)
        with self.transaction() as conn:
            conn.execute(f"INSERT OR REPLACE INTO rollouts ({columns}) VALUES ({marks})", tuple(data.values()))

    def _row_to_rollout(self, row: sqlite3.Row) -> Rollout:
        data = dict(row)
        for name in _ROLLOUT_JSON:
            data[name] = json.loads(data[name]) if data[name] is not None else None
        return Rollout.model_validate(data)

    def rollouts(self, *, variant: str | None = None, latest_only: bool = False) -> list[Rollout]:
        """All rollout attempts in creation order; with latest_only, only the newest attempt of each key."""
        query = "SELECT * FROM rollouts"
        args: tuple[Any, ...] = ()
        if variant is not None:
            query += " WHERE variant = ?"
            args = (variant,)
        query += " ORDER BY rowid"
        with self._reading() as conn:
            rows = conn.execute(query, args).fetchall()
        result = [self._row_to_rollout(r) for r in rows]
        if latest_only:
            newest: dict[str, Rollout] = {}
            for r in result:
                if r.key not in newest or r.attempt > newest[r.key].attempt:
                    newest[r.key] = r
            result = list(newest.values())
        return result

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        with self._reading() as conn:
            row = conn.execute("SELECT * FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        return None if row is None else self._row_to_rollout(row)

    def mark_interrupted(self) -> int:
        """Rollouts left queued or running by a process that died become cancelled; returns how many.

        Refused (StoreError) while another live process holds the run's lock: its running rollouts are not dead."""
        holder = lock_holder(self.path.parent)
        if holder is not None and holder != os.getpid():
            raise StoreError(
                f"{self.path.parent} is held by process {holder}: its running rollouts are alive, not interrupted"
            )
        with self.transaction() as conn:
            cur = conn.execute(
                "UPDATE rollouts SET status = ?, failure = ?, error = ?, ended_at = COALESCE(ended_at, ?) "
                "WHERE status IN (?, ?)",
                (
                    RolloutStatus.cancelled.value,
                    FailureKind.interrupted.value,
                    "the run was interrupted before this attempt finished",
                    time.time(),
                    RolloutStatus.queued.value,
                    RolloutStatus.running.value,
                ),
            )
            return cur.rowcount

    # -- agent processes of running rollouts -----------------------------------------------------------------------

    def record_process(self, process: AgentProcess) -> None:
        data = process.model_dump()
        with self.transaction() as conn:
            conn.execute(
                f"INSERT OR REPLACE INTO agent_processes ({', '.join(data)}) VALUES ({', '.join('?' for _ in data)})",
                tuple(data.values()),
            )

    def forget_process(self, rollout_id: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM agent_processes WHERE rollout_id = ?", (rollout_id,))

    def agent_processes(self) -> list[AgentProcess]:
        with self._reading() as conn:
            rows = conn.execute("SELECT * FROM agent_processes ORDER BY started_at").fetchall()
        return [AgentProcess.model_validate(dict(r)) for r in rows]

    # -- rewards reported by agents ----------------------------------------------------------------------------

    def report_reward(self, rollout_id: str, reward: float, detail: dict[str, Any] | None = None) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO reported_rewards (rollout_id, reward, detail, reported_at) VALUES (?, ?, ?, ?)",
                (rollout_id, float(reward), _dumps(detail), time.time()),
            )

    def reported_reward(
        self, rollout_id: str, *, since: float | None = None
    ) -> tuple[float, dict[str, Any] | None] | None:
        """The reward the agent posted; with `since`, only one reported at or after that time."""
        with self._reading() as conn:
            row = conn.execute(
                "SELECT reward, detail, reported_at FROM reported_rewards WHERE rollout_id = ?", (rollout_id,)
            ).fetchone()
        if row is None or (since is not None and row["reported_at"] < since):
            return None
        return float(row["reward"]), (json.loads(row["detail"]) if row["detail"] else None)

    # -- model calls ---------------------------------------------------------------------------------------------

    def insert_calls(self, records: Iterable[CallRecord]) -> None:
        """Insert calls in one transaction; a call id seen before is ignored (retried writes are harmless)."""
        rows = []
        for record in records:
            data = record.model_dump(mode="json")
            for name in _CALL_JSON:
                data[name] = _dumps(data[name])
            data["stream"] = int(record.stream)
            rows.append(data)
        if not rows:
            return
        columns = list(rows[0])
        sql = f"INSERT OR IGNORE INTO calls ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
        with self.transaction() as conn:
            conn.executemany(sql, [tuple(r[c] for c in columns) for r in rows])

    def insert_call(self, record: CallRecord) -> None:
        self.insert_calls([record])

    def calls(self, rollout_id: str | None = None) -> list[CallRecord]:
        query = "SELECT * FROM calls"
        args: tuple[Any, ...] = ()
        if rollout_id is not None:
            query += " WHERE rollout_id = ?"
            args = (rollout_id,)
        query += " ORDER BY seq"
        with self._reading() as conn:
            rows = conn.execute(query, args).fetchall()
        result = []
        for row in rows:
            data = dict(row)
            data.pop("seq")
            for name in _CALL_JSON:
                data[name] = json.loads(data[name]) if data[name] is not None else None
            if data["knobs_applied"] is None:
                data["knobs_applied"] = {}
            if data["request"] is None:
                data["request"] = {}
            data["stream"] = bool(data["stream"])
            result.append(CallRecord.model_validate(data))
        return result

    def call_totals_by_rollout(self) -> dict[str, CallTotals]:
        """Per rollout: number of calls, input/output tokens, priced cost and unpriced calls, summed in SQL."""
        with self._reading() as conn:
            return call_totals(conn)

    def model_use_by_rollout(self) -> dict[str, list[ModelUse]]:
        """Per rollout: its calls grouped by the name the agent asked for, the upstream/model that served them, how
        the gateway chose it and the name the upstream reported."""
        with self._reading() as conn:
            return model_use(conn)

    def count_calls(self) -> int:
        with self._reading() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0])


__all__ = ["RunStore", "StoreError", "MIGRATIONS", "RewardSource"]
