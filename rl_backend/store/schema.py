"""The run store's schema: named forward migrations, applied in order. The schema version (SQLite's `user_version`)
is how many have been applied, so a store made by any earlier agl opens and is brought up to date.

A shipped migration is never edited: a change to the schema is a new `Migration` appended at the end, with a name
that says what it does. The migration runner splits a migration on ";", so no ";" inside a statement.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path


class StoreError(RuntimeError):
    """A store that cannot be used as it is (damaged, too new, held by another process): the message says which,
    `hint` what to do. `exit_code` follows the CLI's contract: 2 for what the user must fix, 1 for a failure."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Migration:
    name: str
    sql: str

    def statements(self) -> list[str]:
        return [s for s in self.sql.split(";") if s.strip()]


MIGRATIONS: tuple[Migration, ...] = (
    Migration("create_runs_rollouts_and_calls", """
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
    """),
    # Training curves, one row per iteration of the training loop (rl_backend.trainer.curves).
    Migration("add_train_steps", """
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
"""),
    # The model the upstream reported serving each call, and how the gateway chose it (records.RouteKind).
    Migration("add_served_model_and_route_to_calls", """
    ALTER TABLE calls ADD COLUMN served_model TEXT;
    ALTER TABLE calls ADD COLUMN route TEXT
"""),
    # The agent process of each running local rollout (records.AgentProcess), so that a resume after agl was killed
    # ends what it left running before it runs those rollouts again.
    Migration("add_agent_processes", """
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
"""),
    # The content hash of each task a run planned (agl_cli.spec.tasks.Task.content_hash), so that a resume, a comparison
    # or a reuse can tell the same task id with other content, and name those tasks.
    Migration("add_task_hashes", """
    CREATE TABLE task_hashes (
        task_id TEXT PRIMARY KEY,
        hash TEXT NOT NULL
    );
"""),
)

SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def check_not_newer(conn: sqlite3.Connection, path: Path) -> int:
    """The store's schema version; StoreError when a newer agl wrote it (this one would misread it)."""
    current = schema_version(conn)
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {current}, newer than this agl understands ({SCHEMA_VERSION}); "
            "upgrade agl to read it."
        )
    return current


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply the migrations the store lacks, each in its own transaction (autocommit connection)."""
    for version in range(check_not_newer(conn, path), SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated between our read and our lock.
            if schema_version(conn) > version:
                conn.execute("COMMIT")
                continue
            for statement in MIGRATIONS[version].statements():
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
