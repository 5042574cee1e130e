"""The run store: one SQLite database (WAL) per run, brought up to date by its named migrations (schema.py), its
rows written and read through one codec (codec.py), its sums over model calls in SQL (aggregates.py).

Writers in several threads (the gateway, the runner) and processes (a resumed run) share it safely:
each RunStore serialises its own writes behind a lock, and SQLite's WAL and busy timeout do the rest.
A store opened `read_only` is never migrated or written: what a report or an advice reads, it leaves as it was.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rl_backend.store import aggregates, codec
from rl_backend.store.records import AgentProcess, CallRecord, CallTotals, FailureKind, ModelUse, Rollout, RolloutStatus
from rl_backend.store.runlock import lock_holder
from rl_backend.store.schema import StoreError, check_not_newer, migrate, schema_version


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in str(exc)


class RunStore:
    """A handle on one run's `store.sqlite`. Safe to share between threads of one process."""

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        if read_only and not self.path.is_file():
            raise StoreError(f"{self.path} does not exist: there is no run store to read")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path} cannot be opened as a run store ({exc})") from None
        try:
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA busy_timeout=30000")
            if read_only:
                self._conn.execute("PRAGMA query_only=1")
                if check_not_newer(self._conn, self.path) == 0:
                    raise StoreError(f"{self.path} holds no run yet (an agl process may be creating it)")
            else:
                self._conn.execute("PRAGMA journal_mode=WAL")
                # NORMAL keeps every committed row across a kill -9 of this process (the WAL is written, not fsynced).
                self._conn.execute("PRAGMA synchronous=NORMAL")
                with self._lock:
                    migrate(self._conn, self.path)
        except BaseException as exc:
            self._conn.close()
            if isinstance(exc, sqlite3.DatabaseError) and _is_damage(exc):
                raise self._damaged(exc) from None
            raise

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
        return schema_version(self._conn)

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
