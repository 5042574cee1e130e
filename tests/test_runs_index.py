"""The runs index: every command that lists or finds runs sees the same runs, picks them by kind, spec or agent
version, and sets damaged ones aside with the reason instead of failing; `agl runs RUN` and `agl spend` read
through it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agl_cli.errors import UsageError
from agl_cli.main import app
from agl_cli.optimize.cache import ResultCache
from agl_cli.runs.rundir import RunDir, RunsIndex, find_run
from agl_cli.training.verl_job import newest_verl_run
from rl_backend.store.db import RunStore
from rl_backend.store.records import Api, CallRecord, FailureKind, RewardSource, Rollout, RolloutStatus
from rl_backend.store.schema import MIGRATIONS


def make_run(root: Path, run_id: str, **manifest: Any) -> RunDir:
    run = RunDir(root / run_id)
    run.path.mkdir(parents=True)
    run.write_manifest({"run_id": run_id, "created_at": 1000.0, "status": "completed", **manifest})
    return run


def fill(run: RunDir, *, cost: float | None = 0.01) -> None:
    """Two rollouts of one variant: one right (two calls, one of them failed), one crashed (no call)."""
    store = run.open_store()
    store.put_rollout(Rollout(id="r-ok", key="v/t1/0", variant="v", task_id="t1", split="val",
                              status=RolloutStatus.succeeded, reward=1.0, reward_source=RewardSource.grader,
                              started_at=1.0, ended_at=3.0, output="4 (my key is sk-abcdefghijklmnop)"))
    store.put_rollout(Rollout(id="r-crash", key="v/t2/0", variant="v", task_id="t2", split="val",
                              status=RolloutStatus.failed, failure=FailureKind.agent_crashed, error="KeyError",
                              started_at=1.0, ended_at=2.0))
    store.insert_calls([
        CallRecord(call_id="c1", rollout_id="r-ok", api=Api.openai_chat, upstream="up", model="m", input_tokens=10,
                   output_tokens=2, cost_usd=cost, latency_s=0.5, status_code=200,
                   completion_token_ids=[1, 2]),
        CallRecord(call_id="c2", rollout_id="r-ok", api=Api.openai_chat, upstream="up", model="m", cost_usd=0.0,
                   latency_s=0.25, status_code=500, error="upstream_http_500"),
    ])
    store.close()


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    spec_a, spec_b = tmp_path / "a" / "agl.yaml", tmp_path / "b" / "agl.yaml"
    fill(make_run(root, "20250101-000000-aaaa", kind="eval", spec_path=str(spec_a), agent_version="v1"))
    make_run(root, "20250102-000000-bbbb", kind="study", spec_path=str(spec_a), agent_version="v2")
    make_run(root, "20250103-000000-cccc", kind="train", spec_path=str(spec_b), options={"backend": "verl"})
    make_run(root, "20250104-000000-dddd", kind="train", spec_path=str(spec_b), options={"backend": "torch"})
    damaged = root / "20250105-000000-eeee"
    damaged.mkdir()
    (damaged / "manifest.json").write_text('{"kind": "tra')  # cut short by a full disk
    (root / "not-a-run").mkdir()  # a folder without a manifest is not a run at all
    return root


def test_the_index_lists_selects_finds_and_sets_damaged_runs_aside(runs: Path) -> None:
    index = RunsIndex.scan(runs)
    assert [r.run_id for r in index.runs] == ["20250101-000000-aaaa", "20250102-000000-bbbb",
                                              "20250103-000000-cccc", "20250104-000000-dddd"]
    (skipped,) = index.skipped
    assert skipped.path.name == "20250105-000000-eeee" and "manifest.json is damaged" in skipped.reason
    spec_a = runs.parent / "a" / "agl.yaml"
    assert [r.kind for r in index.select(spec=spec_a)] == ["eval", "study"]
    assert [r.run_id for r in index.select(agent_version="v2")] == ["20250102-000000-bbbb"]
    assert [r.run_id for r in index.select(kind="train")] == ["20250103-000000-cccc", "20250104-000000-dddd"]
    assert [r.run_id for r in index.select(with_store=True)] == ["20250101-000000-aaaa"]
    assert index.select(spec=spec_a, exclude=runs / "20250101-000000-aaaa")[0].kind == "study"
    # A damaged run is still found by name, so that a command about it can say what is damaged.
    assert find_run("latest", runs).run_id == "20250105-000000-eeee"
    assert find_run("20250102", runs).run_id == "20250102-000000-bbbb"
    with pytest.raises(UsageError, match="matches 5 runs"):
        find_run("2025", runs)
    with pytest.raises(UsageError, match="no run 'nope'"):
        find_run("nope", runs)


def test_resume_finds_the_newest_verl_run_past_a_damaged_newer_one(runs: Path) -> None:
    spec_b = runs.parent / "b" / "agl.yaml"
    found = newest_verl_run(spec_b, runs)
    assert found is not None and found.run_id == "20250103-000000-cccc"
    assert newest_verl_run(runs.parent / "other.yaml", runs) is None


def test_agl_runs_names_damaged_runs_apart_and_filters(runs: Path) -> None:
    result = CliRunner().invoke(app, ["runs", "--runs-dir", str(runs), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [r["kind"] for r in doc["runs"]] == ["eval", "study", "train", "train"]
    assert doc["skipped"][0]["run_dir"].endswith("20250105-000000-eeee")
    assert "damaged" in doc["skipped"][0]["reason"]
    result = CliRunner().invoke(app, ["runs", "--runs-dir", str(runs), "--kind", "train", "--spec",
                                      str(runs.parent / "b" / "agl.yaml"), "--json"])
    assert [r["run_id"] for r in json.loads(result.stdout)["runs"]] == ["20250103-000000-cccc", "20250104-000000-dddd"]
    result = CliRunner().invoke(app, ["runs", "20250101", "--kind", "eval", "--runs-dir", str(runs)])
    assert result.exit_code == 2 and "not both" in result.output


def test_agl_runs_run_shows_rollouts_and_their_calls_per_model(runs: Path) -> None:
    result = CliRunner().invoke(app, ["runs", "20250101", "--runs-dir", str(runs), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["run_id"], doc["kind"]) == ("20250101-000000-aaaa", "eval")
    ok, crash = doc["rollouts"]
    assert (ok["reward"], ok["duration_s"], crash["failure"], crash["calls"]) == (1.0, 2.0, "agent_crashed", {})
    assert ok["calls"]["up/m"] == {"calls": 2, "failed_calls": 1, "input_tokens": 10, "output_tokens": 2,
                                   "latency_s": 0.75, "priced_usd": 0.01, "unpriced_calls": 0, "cost_usd": 0.01}
    assert "sk-abcdef" not in ok["output"]  # secrets removed, as everywhere agl shows stored text
    table = CliRunner().invoke(app, ["runs", "20250101", "--runs-dir", str(runs)])
    assert table.exit_code == 0 and "r-crash" in table.stdout and "agent_crashed" in table.stdout


def test_agl_spend_counts_every_readable_run_and_says_what_it_passed_over(runs: Path) -> None:
    other = make_run(runs, "20250106-000000-ffff", kind="eval", spec_path=str(runs.parent / "a" / "agl.yaml"))
    fill(other, cost=None)
    broken = make_run(runs, "20250107-000000-gggg", kind="eval")
    broken.store_path.write_bytes(b"not a database at all, " * 200)

    def spend(*args: str) -> dict[str, Any]:
        result = CliRunner().invoke(app, ["spend", "--runs-dir", str(runs), *args, "--json"])
        assert result.exit_code == 0, result.output
        return dict(json.loads(result.stdout))

    doc = spend("--budget-usd", "0.05", "--budget-rollouts", "4")
    assert [r["run_id"] for r in doc["runs"]] == ["20250101-000000-aaaa", "20250106-000000-ffff"]
    assert doc["rollouts"] == 4 and doc["priced_usd"] == 0.01 and doc["unpriced_calls"] == 1 and doc["usd"] is None
    assert doc["over_budget"] is True and doc["left"] == {"usd": 0.04, "rollouts": 0}
    reasons = {Path(s["run_dir"]).name: s["reason"] for s in doc["skipped"]}
    assert "damaged" in reasons["20250105-000000-eeee"] and "damaged" in reasons["20250107-000000-gggg"]
    assert spend("--since", "2999-01-01")["rollouts"] == 0
    assert [r["run_id"] for r in spend("--spec", str(runs.parent / "b" / "agl.yaml"))["runs"]] == []
    refused = CliRunner().invoke(app, ["spend", "--runs-dir", str(runs), "--since", "last tuesday"])
    assert refused.exit_code == 2 and "--since 'last tuesday'" in refused.output


def test_the_result_cache_reads_other_runs_without_changing_them(tmp_path: Path) -> None:
    """A run left by an older agl is a source of the cache as it is: reading it neither migrates nor locks it."""
    root = tmp_path / "runs"
    run = make_run(root, "20250101-000000-aaaa", kind="eval", agent_version="v1")
    conn = sqlite3.connect(run.store_path, isolation_level=None)
    for statement in MIGRATIONS[0].statements():
        conn.execute(statement)
    conn.execute("PRAGMA user_version=1")
    conn.close()
    store = RunStore(run.store_path, read_only=True)
    assert store.schema_version == 1
    store.close()
    legacy = sqlite3.connect(run.store_path, isolation_level=None)
    legacy.execute("INSERT INTO rollouts (id, key, variant, task_id, seed, attempt, status, reward, reward_source) "
                   "VALUES ('r1', 'h/t1/0', 'v', 't1', 0, 1, 'succeeded', 1.0, 'grader')")
    legacy.close()
    cache = ResultCache(root, "v1")
    assert list(cache.entries) == ["h/t1/0"]
    check = sqlite3.connect(run.store_path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == 1
    check.close()


def test_runs_started_in_the_same_second_are_listed_in_the_order_they_were_created(tmp_path: Path) -> None:
    """An id names its second: the random end of two ids from the same second says nothing of which came first."""
    make_run(tmp_path, "20261203-153550-c90a", kind="eval", created_at=1000.2)
    make_run(tmp_path, "20261203-153550-3821", kind="eval", created_at=1000.7)
    make_run(tmp_path, "20261203-153549-ffff", kind="eval", created_at=999.9)
    names = [r.run.path.name for r in RunsIndex.scan(tmp_path).select()]
    assert names == ["20261203-153549-ffff", "20261203-153550-c90a", "20261203-153550-3821"]
