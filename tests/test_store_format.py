"""The store owns its format: one call-row codec for the gateway's writer and the store, named migrations that
bring a store of any older schema up to date with its rows kept, and read-only handles that change nothing."""

from __future__ import annotations

import asyncio
import hashlib
import re
import sqlite3
from pathlib import Path

import pytest

from rl_backend.gateway.writer import RecordWriter
from rl_backend.store.db import RunStore, StoreError
from rl_backend.store.records import Api, CallRecord, RewardSource, Rollout, RolloutStatus, RouteKind
from rl_backend.store.schema import MIGRATIONS, SCHEMA_VERSION

REPO = Path(__file__).resolve().parent.parent


def _record(call_id: str) -> CallRecord:
    return CallRecord(
        call_id=call_id, rollout_id="r1", api=Api.anthropic_messages, upstream="local", request_model="m",
        model="m", served_model="m-2025", route=RouteKind.knob, stream=True, status_code=200,
        request={"messages": [{"role": "user", "content": "déjà vu, 2+2? \u2603"}], "temperature": 0.5},
        response={"content": [{"type": "text", "text": "4"}], "usage": {"output_tokens": 3}},
        input_tokens=12, output_tokens=3, cost_usd=None, started_at=10.0, ended_at=11.5, latency_s=1.5,
        prompt_token_ids=[1, 2, 3], completion_token_ids=[7, 8, 9],
        # A sampled token can carry a logprob of -inf (a probability that underflowed).
        logprobs=[-0.25, float("-inf"), -1e-9], model_version="step-3", knobs_applied={"temperature": 0.5},
    )


def _rows(store: RunStore) -> dict[str, tuple[object, ...]]:
    conn = sqlite3.connect(store.path)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute("SELECT * FROM calls").fetchall()
    finally:
        conn.close()
    return {r["call_id"]: tuple(r[k] for k in r.keys() if k not in ("seq", "call_id")) for r in rows}  # noqa: SIM118


def test_a_call_reads_back_as_written_whichever_path_stored_it(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store.sqlite")
    writer = RecordWriter(store)

    async def through_the_gateway() -> None:
        await writer.write(_record("batched"))  # the writer thread's group commit
        await writer.write(_record("inline"), alone=True)  # a call alone: committed on the event loop

    asyncio.run(through_the_gateway())
    writer.close()
    store.insert_calls([_record("direct")])  # the store's own insert (the result cache, the remote gateway)

    assert writer.written == 2
    read = {c.call_id: c for c in store.calls()}
    for call_id in ("batched", "inline", "direct"):
        assert read[call_id] == _record(call_id), call_id
    rows = _rows(store)
    assert rows["batched"] == rows["inline"] == rows["direct"]  # one codec: the same row, byte for byte
    store.close()


def test_calls_have_one_insert_and_the_store_alone_writes_sql() -> None:
    """Every statement that writes a call, and every SQL text, lives in the store's own modules."""
    inserts, sql_outside = [], []
    for path in sorted([*(REPO / "agl_cli").rglob("*.py"), *(REPO / "rl_backend").rglob("*.py")]):
        text = path.read_text(encoding="utf-8")
        inserts += [path.name for _ in re.finditer(r"INTO calls\b", text)]
        if path.parent != REPO / "rl_backend" / "store" and re.search(r"\b(SELECT|INSERT|UPDATE|DELETE) .*\b(FROM|INTO|SET)\b",
                                                                      text):
            sql_outside.append(str(path.relative_to(REPO)))
    assert inserts == ["codec.py"]
    assert sql_outside == []


# Shipped migrations are never edited: a schema change is a new migration at the end. These digests hold them still.
SHIPPED = {
    "create_runs_rollouts_and_calls": "7e07e5d6ad42",
    "add_train_steps": "a3b3d083364b",
    "add_served_model_and_route_to_calls": "b7a5e7af8f4a",
    "add_agent_processes": "30ea2c1fedad",
}


def _digest(sql: str) -> str:
    return hashlib.sha256(" ".join(sql.split()).encode()).hexdigest()[:12]


def test_migrations_are_named_and_the_shipped_ones_never_change() -> None:
    names = [m.name for m in MIGRATIONS]
    assert len(set(names)) == len(names) == SCHEMA_VERSION
    assert all(re.fullmatch(r"[a-z][a-z0-9_]+", n) for n in names)
    assert names[: len(SHIPPED)] == list(SHIPPED)
    assert {m.name: _digest(m.sql) for m in MIGRATIONS[: len(SHIPPED)]} == SHIPPED


def _old_store(path: Path, version: int) -> None:
    """A store as an agl of schema `version` left it: its migrations applied, one rollout and one call in it."""
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS[:version]:
        for statement in migration.statements():
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version={version}")
    conn.execute("INSERT INTO rollouts (id, key, variant, task_id, split, seed, attempt, status, reward, reward_source, "
                 "grader_detail, started_at, ended_at) VALUES ('r1', 'v/t1/0', 'v', 't1', 'val', 0, 1, 'succeeded', 1.0, "
                 "'grader', '{\"expected\": \"4\"}', 1.0, 2.0)")
    conn.execute("INSERT INTO calls (call_id, rollout_id, api, upstream, model, request, response, stream, input_tokens, "
                 "output_tokens, cost_usd, started_at, logprobs) VALUES ('c1', 'r1', 'openai.chat', 'u', 'm', '{}', "
                 "'{\"choices\": []}', 0, 5, 2, 0.01, 1.5, '[-0.5]')")
    conn.close()


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_a_store_of_an_older_schema_opens_migrated_with_its_rows(tmp_path: Path, version: int) -> None:
    path = tmp_path / "store.sqlite"
    _old_store(path, version)

    reader = RunStore(path, read_only=True)  # reads it through a copy brought up to date, and leaves the file so
    assert [r.id for r in reader.rollouts()] == ["r1"] and reader.calls()[0].logprobs == [-0.5]
    assert [u.calls for u in reader.model_use_by_rollout()["r1"]] == [1]  # a query on columns it lacked
    assert reader.task_hashes() == {}
    reader.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == version
    conn.close()

    store = RunStore(path)
    assert store.schema_version == SCHEMA_VERSION
    (rollout,) = store.rollouts()
    assert (rollout.reward, rollout.reward_source, rollout.grader_detail) == (1.0, RewardSource.grader,
                                                                              {"expected": "4"})
    (call,) = store.calls()
    assert (call.call_id, call.served_model, call.route, call.cost_usd) == ("c1", None, None, 0.01)
    assert store.call_totals_by_rollout()["r1"].cost_usd == 0.01
    store.insert_call(_record("new"))  # the migrated columns take new rows
    assert store.calls("r1")[-1].served_model == "m-2025" and store.agent_processes() == []
    store.put_rollout(rollout.model_copy(update={"id": "r2", "attempt": 2, "status": RolloutStatus.failed}))
    assert len(store.rollouts(latest_only=True)) == 1
    store.close()


def test_a_read_only_store_changes_nothing_and_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        RunStore(tmp_path / "missing.sqlite", read_only=True)
    assert not (tmp_path / "missing.sqlite").exists()
    sqlite3.connect(tmp_path / "empty.sqlite").close()
    with pytest.raises(StoreError, match="holds no run yet"):
        RunStore(tmp_path / "empty.sqlite", read_only=True)
    path = tmp_path / "store.sqlite"
    RunStore(path).close()
    reader = RunStore(path, read_only=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.put_rollout(Rollout(id="r", key="k", variant="v", task_id="t"))
    reader.close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    for read_only in (True, False):
        with pytest.raises(StoreError, match="newer than this agl understands"):
            RunStore(path, read_only=read_only)
