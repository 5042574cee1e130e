"""The run store: one SQLite database (WAL) per run, brought up to date by its named migrations (schema.py), its
rows written and read through one codec (codec.py), its sums over model calls in SQL (aggregates.py).

Writers in several threads (the gateway, the runner) and processes (a resumed run) share it safely:
each RunStore serialises its own writes behind a lock, and SQLite's WAL and busy timeout do the rest.
A store opened `read_only` is never migrated or written: what a report or an advice reads, it leaves as it was,
and it opens on read-only media too (an archived run). A write SQLite refuses (the store locked by another process,
a full disk, a read-only folder) is a StoreError that says so and what to do (rl_backend/store/failures.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rl_backend.store import aggregates, codec
from rl_backend.store.failures import StoreReadOnlyError, busy_timeout_s, explain, explain_os
from rl_backend.store.records import AgentProcess, CallRecord, CallTotals, FailureKind, ModelUse, Rollout, RolloutStatus
from rl_backend.store.runlock import lock_holder
from rl_backend.store.schema import SCHEMA_VERSION, StoreError, check_not_newer, migrate, schema_version


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in str(exc)


class RunStore:
    """A handle on one run's `store.sqlite`. Safe to share between threads of one process."""

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.RLock()
        self._refused: StoreError | None = None  # the first write this store refused (see `transaction`)
        self._copy: tempfile.TemporaryDirectory[str] | None = None  # read-only media: a copy holding the WAL
        self._file_version: int | None = None  # set when a read-only handle reads an older store through a copy
        if read_only and not self.path.is_file():
            raise StoreError(f"{self.path} does not exist: there is no run store to read")
        if not read_only:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise explain_os(exc, self.path.parent) or StoreError(f"cannot create {self.path.parent}: {exc}") from None
        timeout = busy_timeout_s()
        self._conn = self._connect(str(self.path), timeout)
        try:
            self._conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            if read_only:
                self._open_for_reading(timeout)
            else:
                self._conn.execute("PRAGMA journal_mode=WAL")
                # NORMAL keeps every committed row across a kill -9 of this process (the WAL is written, not fsynced).
                self._conn.execute("PRAGMA synchronous=NORMAL")
                with self._lock:
                    migrate(self._conn, self.path)
        except BaseException as exc:
            self.close()
            if isinstance(exc, sqlite3.DatabaseError) and _is_damage(exc):
                raise self._damaged(exc) from None
            if isinstance(exc, sqlite3.OperationalError):
                explained = explain(exc, self.path)
                if explained is not None:
                    raise explained from None
            raise

    def _connect(self, target: str, timeout: float, *, uri: bool = False) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(target, timeout=timeout, check_same_thread=False, isolation_level=None, uri=uri)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path} cannot be opened as a run store ({exc})") from None
        conn.row_factory = sqlite3.Row
        return conn

    def _open_for_reading(self, timeout: float) -> None:
        """Read the store where it lies; on read-only media (an archived run, another user's folder), where SQLite
        cannot make the WAL's index file next to it, read it read-only, or immutable, or a private copy of it."""
        self._conn.execute("PRAGMA query_only=1")
        try:
            version = check_not_newer(self._conn, self.path)
        except sqlite3.OperationalError as exc:
            if not isinstance(explain(exc, self.path), StoreReadOnlyError):
                raise
            self._conn.close()
            self._conn = self._open_on_read_only_media(timeout)
            version = check_not_newer(self._conn, self.path)
        if version == 0:
            raise StoreError(f"{self.path} holds no run yet (an agl process may be creating it)")
        if version < SCHEMA_VERSION:
            self._file_version = version
            # An older agl's store: read through a copy in memory brought up to date, so every query finds the
            # columns and tables it expects; the file itself stays as it was.
            memory = self._connect(":memory:", timeout)
            self._conn.backup(memory)
            self._conn.close()
            self._conn = memory
            migrate(self._conn, self.path)
            self._conn.execute("PRAGMA query_only=1")

    def _open_on_read_only_media(self, timeout: float) -> sqlite3.Connection:
        uri = self.path.resolve().as_uri()
        conn = self._connect(uri + "?mode=ro", timeout, uri=True)
        try:
            conn.execute("PRAGMA user_version").fetchone()  # works when the WAL and its index lie there already
            return conn
        except sqlite3.OperationalError:
            conn.close()
        wal = Path(str(self.path) + "-wal")
        if not wal.is_file() or wal.stat().st_size == 0:
            # No WAL, or an empty one: the database file holds every row, and nothing can change it here.
            return self._connect(uri + "?immutable=1", timeout, uri=True)
        # Rows still in the WAL: SQLite can only replay it where it may write, so read a private copy.
        self._copy = tempfile.TemporaryDirectory(prefix="agl-store-")
        copy = Path(self._copy.name) / self.path.name
        shutil.copyfile(self.path, copy)
        shutil.copyfile(wal, Path(str(copy) + "-wal"))
        conn = self._connect(str(copy), timeout)
        conn.execute("PRAGMA query_only=1")
        return conn

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

    @property
    def schema_version(self) -> int:
        """The schema version of the file (a read-only handle on an older store reads a migrated copy of it)."""
        return self._file_version if self._file_version is not None else schema_version(self._conn)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. A write the store refuses (locked past the busy timeout, a full disk, a read-only
        folder) raises a StoreError saying so; every later write of this handle then fails at once with it, so a
        run that cannot write stops now instead of waiting out the busy timeout once per rollout."""
        with self._reading() as conn:
            if self._refused is not None:
                raise type(self._refused)(str(self._refused), hint=self._refused.hint)
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                # A handle opened read-only that writes is agl's own bug, not the disk's: raised as it is.
                explained = None if self.read_only else explain(exc, self.path)
                if explained is None:
                    raise
                self._refused = explained
                raise explained from None

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            if self._copy is not None:
                self._copy.cleanup()
                self._copy = None

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
        with self.transaction() as conn:
            conn.execute(codec.PUT_ROLLOUT, codec.encode_rollout(rollout))

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
        result = [codec.decode_rollout(r) for r in rows]
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
        return None if row is None else codec.decode_rollout(row)

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

    # -- the content of the tasks a run planned ------------------------------------------------------------------

    def put_task_hashes(self, hashes: Mapping[str, str]) -> None:
        """Record each task's content hash; a task already recorded keeps its first hash (a resume checks it)."""
        with self.transaction() as conn:
            conn.executemany("INSERT OR IGNORE INTO task_hashes (task_id, hash) VALUES (?, ?)", hashes.items())

    def task_hashes(self) -> dict[str, str]:
        """Task id -> content hash of the tasks this run planned; empty for a run agl recorded none for (older)."""
        with self._reading() as conn:
            return {r["task_id"]: r["hash"] for r in conn.execute("SELECT task_id, hash FROM task_hashes")}

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
                (rollout_id, float(reward), None if detail is None else codec.dump_json(detail), time.time()),
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

    def insert_calls(self, records: Iterable[CallRecord], secrets: Sequence[str] = ()) -> None:
        """Insert calls in one transaction; a call id seen before is ignored (retried writes are harmless)."""
        self.insert_call_rows([codec.encode_call(record, secrets) for record in records])

    def insert_call(self, record: CallRecord) -> None:
        self.insert_calls([record])

    def insert_call_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert rows already encoded by `codec.encode_call` (the gateway's writer encodes them off its loop)."""
        if not rows:
            return
        with self.transaction() as conn:
            conn.executemany(codec.INSERT_CALL, rows)

    def calls(self, rollout_id: str | None = None) -> list[CallRecord]:
        query = "SELECT * FROM calls"
        args: tuple[Any, ...] = ()
        if rollout_id is not None:
            query += " WHERE rollout_id = ?"
            args = (rollout_id,)
        query += " ORDER BY seq"
        with self._reading() as conn:
            rows = conn.execute(query, args).fetchall()
        return [codec.decode_call(row) for row in rows]

    def call_totals_by_rollout(self) -> dict[str, CallTotals]:
        """Per rollout: number of calls, input/output tokens, priced cost and unpriced calls, summed in SQL."""
        with self._reading() as conn:
            return aggregates.call_totals(conn)

    def model_use_by_rollout(self) -> dict[str, list[ModelUse]]:
        """Per rollout: its calls grouped by the name the agent asked for, the upstream/model that served them, how
        the gateway chose it and the name the upstream reported."""
        with self._reading() as conn:
            return aggregates.model_use(conn)

    def model_calls(self) -> list[aggregates.ModelCalls]:
        """The calls grouped by rollout, upstream, model and whether they failed (see aggregates.ModelCalls)."""
        with self._reading() as conn:
            return aggregates.model_calls(conn)

    def spend_series(self) -> list[aggregates.SpendPoint]:
        """Every call's cost and tokens, in the order the calls ended."""
        with self._reading() as conn:
            return aggregates.spend_series(conn)

    def sampling_overridden(self) -> dict[str, int]:
        """Per request field, the training calls on which the gateway overrode the agent's value of it."""
        with self._reading() as conn:
            return aggregates.sampling_overridden(conn)

    def count_calls(self) -> int:
        with self._reading() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0])

    # -- training curves (rl_backend.trainer.curves) ----------------------------------------------------------------

    def add_train_step(self, values: Mapping[str, Any]) -> None:
        with self.transaction() as conn:
            conn.execute(codec.INSERT_TRAIN_STEP, codec.encode_train_step(values))

    def train_steps(self) -> list[dict[str, Any]]:
        """Every `train_steps` row in the order written, as the values `add_train_step` took."""
        with self._reading() as conn:
            rows = conn.execute("SELECT * FROM train_steps ORDER BY seq").fetchall()
        return [codec.decode_train_step(row) for row in rows]


__all__ = ["RunStore", "StoreError"]
