"""The runner on scripted agents and graders: every misbehaviour ends as a rollout with its reason, never a
silent 0; timeouts kill the whole process group; a run killed with -9 resumes without losing or redoing work."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_backend.store.db import RunStore
from tests.helpers import FIXTURES, agl_env, invoke_agl, run_agl, write_spec
from tests.helpers import process_alive as _alive


def _eval_json(folder: Path, *args: str) -> dict:
    result = run_agl(["eval", str(folder / "agl.yaml"), "--json", *args], cwd=folder)
    assert result.stdout.strip(), result.stderr
    doc = json.loads(result.stdout)
    doc["_returncode"] = result.returncode
    doc["_stderr"] = result.stderr
    return doc


def _rollouts(folder: Path, run_id: str) -> dict[str, object]:
    store = RunStore(folder / ".agl" / "runs" / run_id / "store.sqlite")
    return {r.task_id: r for r in store.rollouts(latest_only=True)}


def test_misbehaving_agents_and_graders_are_reported_not_scored(tmp_path: Path) -> None:
    tasks = [
        {"id": "ok", "answer": "42"},
        {"id": "wrong", "answer": "41", "expected": "42"},
        {"id": "crash", "behavior": "crash"},
        {"id": "hang", "behavior": "hang_child"},
        {"id": "silent", "behavior": "no_output"},
        {"id": "flood", "behavior": "flood", "answer": "7"},
        {"id": "grader_crash", "answer": "1", "grader": "crash"},
        {"id": "grader_garbage", "answer": "1", "grader": "garbage"},
    ]
    write_spec(tmp_path, tasks, agent={"timeout_s": 3})
    started = time.monotonic()
    doc = _eval_json(tmp_path)
    assert time.monotonic() - started < 60
    assert doc["_returncode"] == 0, doc["_stderr"]
    (variant,) = doc["variants"]
    assert variant["name"] == "baseline"
    assert variant["n"] == 3  # ok, wrong, flood have rewards; nothing else was counted as 0
    assert variant["accuracy"]["mean"] == pytest.approx(2 / 3)
    lo, hi = variant["accuracy"]["ci95"]
    assert 0 <= lo <= 2 / 3 <= hi <= 1
    assert variant["missing"] == 5
    assert variant["missing_reasons"] == {
        "agent_crashed": 1, "agent_timeout": 1, "no_output": 1, "grader_crashed": 1, "grader_garbage": 1,
    }
    rollouts = _rollouts(tmp_path, doc["run_id"])
    assert "code 3" in rollouts["crash"].error and "something broke" in rollouts["crash"].error
    assert rollouts["hang"].status.value == "timed_out" and "3 s" in rollouts["hang"].error
    child_pid = int((tmp_path / ".agl" / "runs" / doc["run_id"] / "rollouts" / rollouts["hang"].id / "child.pid")
                    .read_text())
    # The group was killed before the rollout was recorded; the kernel may still be tearing the child down.
    deadline = time.monotonic() + 5
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child_pid), "the agent's child outlived its timed-out process group"
    assert "output file" in rollouts["silent"].error
    assert rollouts["flood"].reward == 1.0
    assert len(rollouts["flood"].stdout_tail) < 200_000 and "earlier bytes not kept" in rollouts["flood"].stdout_tail
    assert "grader exploded" in rollouts["grader_crash"].error
    assert "neither a number nor a JSON object" in rollouts["grader_garbage"].error
    assert rollouts["wrong"].reward == 0.0 and rollouts["wrong"].grader_detail == {"score": 0.0, "got": "41"}


def test_entry_agent_and_entry_grader(tmp_path: Path) -> None:
    (tmp_path / "myagent.py").write_text("def solve(task):\n    return str(task['a'] + task['b'])\n")
    (tmp_path / "mygrader.py").write_text(
        "def grade(task, output):\n    return {'score': float(output == str(task['a'] + task['b']))}\n"
        "def broken(task, output):\n    raise RuntimeError('grader bug')\n"
    )
    tasks = [{"id": f"t{i}", "a": i, "b": 2 * i} for i in range(4)]
    write_spec(tmp_path, tasks, agent={"command": None, "entry": "myagent:solve"}, grader={"command": None,
               "entry": "mygrader:grade"})
    spec_text = (tmp_path / "agl.yaml").read_text()
    doc = _eval_json(tmp_path)
    assert doc["_returncode"] == 0, doc["_stderr"]
    assert doc["variants"][0]["n"] == 4 and doc["variants"][0]["accuracy"]["mean"] == 1.0
    (tmp_path / "agl.yaml").write_text(spec_text.replace("mygrader:grade", "mygrader:broken"))
    doc = _eval_json(tmp_path)
    assert doc["_returncode"] == 1  # nothing was scored: that is a failure, and it says why
    assert doc["variants"][0]["missing_reasons"] == {"grader_crashed": 4}


def test_limit_split_seeds_and_variants(tmp_path: Path) -> None:
    tasks = [{"id": f"t{i}", "answer": "1", "split": "val" if i % 2 else "train"} for i in range(10)]
    write_spec(tmp_path, tasks, tasks={"split": {"field": "split"}},
               knobs={"flavour": {"values": ["plain", "spicy"], "via": "env", "name": "FLAVOUR"}})
    doc = _eval_json(tmp_path, "--split", "val", "--limit", "3", "--seeds", "2", "-v", "baseline", "-v", "flavour=spicy")
    assert [v["name"] for v in doc["variants"]] == ["baseline", "flavour=spicy"]
    assert all(v["n"] == 6 for v in doc["variants"])
    rollouts = RunStore(tmp_path / ".agl" / "runs" / doc["run_id"] / "store.sqlite").rollouts()
    assert {r.task_id for r in rollouts} == {"t1", "t3", "t5"} and {r.seed for r in rollouts} == {0, 1}
    bad = invoke_agl(["eval", str(tmp_path / "agl.yaml"), "-v", "flavour=sour"], cwd=tmp_path)
    assert bad.returncode == 2 and "not an option of knob 'flavour'" in bad.stderr and "plain, spicy" in bad.stderr


def _count_finished(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return int(conn.execute(
                "SELECT COUNT(*) FROM rollouts WHERE status IN ('succeeded','failed','timed_out')").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def test_kill_9_then_resume_loses_and_repeats_nothing(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    tasks = [{"id": f"t{i:02d}", "answer": "ok", "behavior": "slow", "sleep": 0.6} for i in range(16)]
    write_spec(tmp_path, tasks, concurrency=2, agent={"env": {"BEHAVE_MARKERS": str(markers)}})
    proc = subprocess.Popen(
        [sys.executable, "-m", "agl_cli", "eval", "agl.yaml", "--json"], cwd=tmp_path, env=agl_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    runs = tmp_path / ".agl" / "runs"
    deadline = time.monotonic() + 60
    db = None
    while time.monotonic() < deadline:
        found = list(runs.glob("*/store.sqlite")) if runs.exists() else []
        if found and _count_finished(found[0]) >= 5:
            db = found[0]
            break
        time.sleep(0.1)
    assert db is not None, "the run never got going"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Only agl writes rows, and it is gone; its agents die with it (their parent-death signal): none finishes after.
    finished_before = {r.task_id for r in RunStore(db).rollouts() if r.status.terminal}
    in_flight_before = {r.task_id for r in RunStore(db).rollouts() if not r.status.terminal}
    run_id = db.parent.name
    result = run_agl(["eval", "--resume", run_id, "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["run_id"] == run_id and doc["variants"][0]["n"] == 16 and doc["variants"][0]["missing"] == 0
    store = RunStore(db)
    latest = store.rollouts(latest_only=True)
    assert sorted(r.task_id for r in latest) == sorted(t["id"] for t in tasks)  # none lost, none twice
    assert all(r.status.value == "succeeded" for r in latest)
    starts: dict[str, int] = {}
    for marker in markers.iterdir():
        task_id = marker.name.split(".")[0]
        starts[task_id] = starts.get(task_id, 0) + 1
    for task_id in finished_before:
        assert starts[task_id] == 1, f"{task_id} finished before the kill but ran again"
    for r in store.rollouts():
        if r.attempt > 1:  # only tasks that were in flight at the kill got a second attempt
            assert r.task_id in in_flight_before and r.task_id not in finished_before
    again = run_agl(["eval", "--resume", run_id, "--json"], cwd=tmp_path)
    assert again.returncode == 0 and len(list(markers.iterdir())) == sum(starts.values())  # nothing left to run


def test_resume_refuses_changed_variant(tmp_path: Path) -> None:
    (tmp_path / "p.md").write_text("v1")
    write_spec(tmp_path, [{"id": "a", "answer": "1"}],
               knobs={"prompt": {"files": ["p.md"], "via": "file", "path": "{rollout_dir}/prompt.md"}})
    doc = _eval_json(tmp_path)
    (tmp_path / "p.md").write_text("v2")
    result = invoke_agl(["eval", "--resume", doc["run_id"]], cwd=tmp_path)
    assert result.returncode == 2 and "no longer what it was" in result.stderr


def test_no_spec_and_bad_flags_are_usage_errors(tmp_path: Path) -> None:
    assert invoke_agl(["eval"], cwd=tmp_path).returncode == 2
    write_spec(tmp_path, [{"id": "a"}])
    result = invoke_agl(["eval", "agl.yaml", "--limit", "0"], cwd=tmp_path)
    assert result.returncode == 2 and "--limit" in result.stderr
    result = invoke_agl(["eval", "--resume", "nope"], cwd=tmp_path)
    assert result.returncode == 2 and "no run 'nope'" in result.stderr


def test_fixture_paths_exist() -> None:
    assert (FIXTURES / "behave_agent.py").is_file()


def test_regression_gate_exits_3_only_for_a_worse_run(tmp_path: Path) -> None:
    tasks = [{"id": f"t{i:02d}", "answer": "1"} for i in range(24)]
    write_spec(tmp_path, tasks, concurrency=6)
    first = _eval_json(tmp_path, "--no-report")
    assert first["_returncode"] == 0 and first["variants"][0]["accuracy"]["mean"] == 1.0
    same = run_agl(["eval", "agl.yaml", "--no-report", "--baseline", first["run_id"], "--fail-on-regression"],
                   cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    assert "no regression" in same.stderr
    write_spec(tmp_path, tasks, concurrency=6, agent={"env": {"BEHAVE_WRONG": "1"}})
    worse = run_agl(["eval", "agl.yaml", "--no-report", "--json", "--baseline", first["run_id"],
                     "--fail-on-regression"], cwd=tmp_path)
    assert worse.returncode == 3, worse.stderr
    doc = json.loads(worse.stdout)
    assert doc["regression"]["is_regression"] is True and "REGRESSION" in worse.stderr
    gate_off = run_agl(["eval", "agl.yaml", "--no-report", "--baseline", first["run_id"]], cwd=tmp_path)
    assert gate_off.returncode == 0  # without --fail-on-regression the verdict is shown, not enforced
    missing = invoke_agl(["eval", "agl.yaml", "--fail-on-regression"], cwd=tmp_path)
    assert missing.returncode == 2 and "--baseline" in missing.stderr


def test_eval_reuses_finished_rollouts_unless_no_cache(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    write_spec(tmp_path, [{"id": f"t{i}", "answer": "1"} for i in range(5)], agent={"env": {"BEHAVE_MARKERS": str(markers)}})
    first = _eval_json(tmp_path, "--no-report")
    assert len(list(markers.iterdir())) == 5
    second = _eval_json(tmp_path, "--no-report")
    assert "reused 5 finished rollouts" in second["_stderr"]
    assert len(list(markers.iterdir())) == 5  # nothing ran again
    assert second["variants"][0]["accuracy"] == first["variants"][0]["accuracy"]
    _eval_json(tmp_path, "--no-report", "--no-cache")
    assert len(list(markers.iterdir())) == 10
    study_like = run_agl(["eval", "--resume", second["run_id"]], cwd=tmp_path)
    assert study_like.returncode == 0  # an eval run resumes (nothing left to do)
