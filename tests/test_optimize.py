"""`agl optimize` on the synthetic agent (a real process, right with a per-variant probability), plus the pure
parts (racing, objectives, ledger, cache, best config) on constructed data."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from agl_cli.evaluation.runner import PlannedRollout
from agl_cli.metrics.stats import Estimate
from agl_cli.metrics.variant import VariantMetrics
from agl_cli.optimize.cache import IMPORTED_META, ResultCache, agent_version
from agl_cli.optimize.objectives import Constraints, choose, pareto_front
from agl_cli.optimize.racing import decide_round, race, schedule
from agl_cli.optimize.study import Ledger
from agl_cli.runs.rundir import RunDir
from agl_cli.spec.schema import load_spec
from agl_cli.spec.tasks import Task
from agl_cli.spec.variants import Variant
from rl_backend.store.db import RunStore
from rl_backend.store.records import Api, CallRecord, Rollout, RolloutStatus
from tests.helpers import FIXTURES, agl_env, invoke_agl, run_agl


def write_synth_spec(folder: Path, p_values: list[Any], *, n_val: int, n_test: int, **extra: Any) -> Path:
    """A spec over the synthetic agent: knob `p` (env SYNTH_P) picks each variant's chance of being right."""
    shutil.copy(FIXTURES / "synthetic_agent.py", folder / "synthetic_agent.py")
    tasks = [{"id": f"v{i:03d}", "split": "val"} for i in range(n_val)]
    tasks += [{"id": f"x{i:03d}", "split": "test"} for i in range(n_test)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    spec: dict[str, Any] = {
        "name": "synthetic",
        "agent": {"command": "python synthetic_agent.py {task_file} {output_file}", "timeout_s": 20},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": {"entry": "synthetic_agent:grade"},
        "knobs": {"p": {"values": p_values, "via": "env", "name": "SYNTH_P"}},
        "concurrency": 4,
    }
    spec.update(extra)
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def optimize_json(folder: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_agl(["optimize", "agl.yaml", "--json", "-q", *args], cwd=folder, env=env)
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    doc["_stderr"] = result.stderr
    return doc


# -- pure logic -------------------------------------------------------------------------------------------------


def test_schedule_grows_to_every_task() -> None:
    assert schedule(40) == [8, 12, 18, 27, 40]
    assert schedule(800)[0] == 50 and schedule(800)[-1] == 800
    assert schedule(5) == [5] and schedule(0) == []
    assert schedule(10, first=3, growth=2.0) == [3, 6, 10]


def test_racing_finds_the_best_of_8_with_fewer_rollouts_than_the_grid() -> None:
    accuracies = [0.45, 0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.90]
    names = [f"v{i}" for i in range(8)]
    n_tasks, reps, picked, rollouts = 200, 20, 0, []
    for rep in range(reps):
        rng = np.random.default_rng(rep)
        truth = {n: rng.random(n_tasks) < p for n, p in zip(names, accuracies, strict=True)}
        ran: dict[str, dict[tuple[str, int], float]] = {n: {} for n in names}

        def run_batch(variants: list[str], tasks: list[str], ran=ran, truth=truth) -> bool:
            for v in variants:
                for t in tasks:
                    ran[v][(t, 0)] = float(truth[v][int(t)])
            return True

        result = race(names, [str(i) for i in range(n_tasks)], run_batch, lambda ran=ran: ran)
        best = max(result.survivors, key=lambda n, ran=ran: np.mean(list(ran[n].values())))
        picked += best == "v7"
        rollouts.append(sum(len(v) for v in ran.values()))
    assert picked / reps >= 0.95
    assert np.mean(rollouts) < 0.5 * 8 * n_tasks, np.mean(rollouts)


def test_decide_round_drops_constraint_breakers_and_clear_losers() -> None:
    scores = {
        "a": {(f"t{i}", 0): 1.0 for i in range(30)},
        "b": {(f"t{i}", 0): float(i % 10 == 0) for i in range(30)},
        "c": {(f"t{i}", 0): 1.0 for i in range(30)},
    }
    decision = decide_round(scores, ["a", "b", "c"], {f"t{i}" for i in range(30)}, alpha=0.05,
                            infeasible={"c": "cost per task $2 > $1"})
    assert decision.leader == "a" and decision.survivors == ["a"]
    assert {d.variant: d.reason for d in decision.dropped} == {"c": "infeasible", "b": "worse"}
    # A round only looks at its own tasks: on the first 2 tasks nothing is clear yet.
    early = decide_round(scores, ["a", "b"], {"t1", "t2"}, alpha=0.05)
    assert early.survivors == ["a", "b"]


def _metrics(name: str, acc: float, cost: float, p95: float) -> VariantMetrics:
    none = Estimate(None, None, 0)
    return VariantMetrics(
        name=name, planned=100, finished=100, n_tasks=100, accuracy=Estimate(acc, (acc - 0.1, acc + 0.1), 100),
        wrong=0, missing=0, missing_reasons={}, error_rate=none, timeout_rate=None, latency_p50=None,
        latency_p95=p95, input_tokens=0, output_tokens=0, calls=0, cost_usd=100 * cost, unpriced_calls=0,
        cost_per_task=Estimate(cost, None, 100), tokens_per_task=none, pass_k=Estimate(acc, None, 100), k=1,
        pass_threshold=0.5)


def test_pareto_front_and_choice_under_constraints() -> None:
    metrics = [_metrics("cheap", 0.6, 0.01, 2.0), _metrics("strong", 0.8, 0.10, 5.0),
               _metrics("dominated", 0.55, 0.05, 6.0), _metrics("fast", 0.7, 0.05, 1.0)]
    assert pareto_front(metrics) == ["cheap", "strong", "fast"]
    assert choose(metrics, Constraints()) == ("strong", None)
    assert choose(metrics, Constraints(max_cost_per_task=0.06)) == ("fast", None)
    assert choose(metrics, Constraints(max_p95_latency=1.5)) == ("fast", None)
    name, note = choose(metrics, Constraints(max_p95_latency=0.5))
    assert name == "strong" and note is not None and "no variant meets" in note


def _call(call_id: str, rollout_id: str, cost: float) -> CallRecord:
    return CallRecord(call_id=call_id, rollout_id=rollout_id, api=Api.openai_chat, upstream="u", cost_usd=cost)


def test_usd_ledger_counts_only_what_this_study_paid(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store.sqlite")
    for i in range(3):
        store.put_rollout(Rollout(id=f"r{i}", key=f"k{i}", variant="v", task_id=f"t{i}",
                                  status=RolloutStatus.succeeded))
    store.insert_calls([_call(f"c{i}", f"r{i}", 0.02) for i in range(3)])
    store.set_meta(IMPORTED_META, {"r2": "an earlier run"})  # a cached copy: it cost this study nothing
    ledger = Ledger(store, max_rollouts=None, max_usd=0.05)
    assert ledger.launched == 2 and ledger.spent_usd == pytest.approx(0.04) and ledger.can_launch()
    store.insert_call(_call("c9", "r1", 0.01))
    assert not ledger.can_launch() and "of $0.05" in ledger.describe()
    counted = Ledger(store, max_rollouts=10, max_usd=None)
    counted.confirm_rollouts = 20  # the reserve for the confirmation: at most half the ceiling
    assert counted.reserve_rollouts == 5 and counted.can_launch()
    counted.launched = 5
    assert not counted.can_launch()
    counted.confirm_rollouts = 0
    assert counted.can_launch()


def test_cache_reuses_only_same_agent_and_same_task_content(tmp_path: Path) -> None:
    write_synth_spec(tmp_path, [0.5, 0.6], n_val=2, n_test=1)
    spec = load_spec(tmp_path / "agl.yaml")
    version = agent_version(spec)
    assert version == agent_version(load_spec(tmp_path / "agl.yaml"))
    changed = spec.model_copy(deep=True)
    changed.agent.timeout_s = 99
    assert agent_version(changed) != version
    root = tmp_path / "runs"
    source = RunDir.create(root, spec_data={}, manifest={"kind": "study", "agent_version": version})
    store = source.open_store()
    rollout = Rollout(id="r1", key="h/v000/0", variant="old-name", task_id="v000", status=RolloutStatus.succeeded,
                      reward=1.0)
    store.put_rollout(rollout)
    store.insert_call(_call("c1", "r1", 0.5))
    store.close()
    (source.rollout_dir("r1") / "task.json").write_text(json.dumps({"id": "v000", "split": "val"}))
    variant = Variant("p=0.6", {"p": 0.6}, "h")
    target = RunStore(tmp_path / "target.sqlite")
    edited = Task("v000", {"id": "v000", "split": "val", "edited": True}, "val", 1)
    assert ResultCache(root, version).import_into(target, [PlannedRollout(variant, edited, 0)], run_id="target") == 0
    assert ResultCache(root, "another-agent").import_into(target, [PlannedRollout(variant, edited, 0)], run_id="target") == 0
    same = Task("v000", {"id": "v000", "split": "val"}, "val", 1)
    assert ResultCache(root, version).import_into(target, [PlannedRollout(variant, same, 0)], run_id="target") == 1
    (copied,) = target.rollouts()
    assert copied.variant == "p=0.6" and copied.reward == 1.0 and copied.key == "h/v000/0"
    assert [c.cost_usd for c in target.calls(copied.id)] == [0.5]
    assert Ledger(target, max_rollouts=1, max_usd=0.1).launched == 0  # a copy is not a launch
    assert ResultCache(root, version).import_into(target, [PlannedRollout(variant, same, 0)], run_id="target") == 0  # once only


# -- the command, end to end -------------------------------------------------------------------------------------


def test_racing_end_to_end_confirms_writes_best_config_and_reruns_from_cache(tmp_path: Path) -> None:
    p_values = [0.5, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.95]
    write_synth_spec(tmp_path, p_values, n_val=40, n_test=16)
    doc = optimize_json(tmp_path)
    assert doc["status"] == "completed" and doc["strategy"] == "racing"
    assert doc["winner"]["name"] == "p=0.95" and doc["recommendation"] == "adopt"
    grid = 8 * 40 + 2 * 16
    assert doc["spend"]["rollouts"] < grid * 0.6, doc["spend"]
    assert doc["confirmation"]["split"] == "test" and doc["confirmation"]["verdict"] == "better"
    assert doc["confirmation"]["n_tasks"] == 16 and doc["validation"]["split"] == "val"
    assert len(doc["rounds"]) >= 2 and doc["rounds"][0]["tasks"] == 8
    assert {row["name"] for row in doc["variants"]} == {"baseline", *(f"p={p}" for p in p_values[1:])}
    assert "p=0.95" in doc["pareto_front"]
    assert "spent $" in doc["_stderr"] and "round 1" in doc["_stderr"]
    best = yaml.safe_load((tmp_path / "agl.best.yaml").read_text())
    assert best["knobs"]["p"]["values"] == [0.95, 0.5, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
    assert "+    - 0.95" in doc["best_config"]["diff"]
    # The study ends with its report, like eval and train.
    html = Path(doc["report"]["html"]).read_text()
    assert Path(doc["report"]["html"]).parent == Path(doc["study_dir"]) / "report" and "p=0.95" in html
    assert "p=0.95" in Path(doc["report"]["md"]).read_text()
    # The test split was never seen by the search: no test-split rollout before the confirmation's.
    store = sqlite3.connect(Path(doc["study_dir"]) / "store.sqlite")
    splits = [row[0] for row in store.execute("SELECT split FROM rollouts ORDER BY rowid")]
    assert "test" not in splits[: splits.index("test")] and set(splits[splits.index("test"):]) == {"test"}
    again = optimize_json(tmp_path)
    assert again["spend"]["rollouts"] == 0 and again["spend"]["reused_from_cache"] == doc["spend"]["rollouts"]
    assert f"rollouts reused from run {doc['study_id']} (" in again["_stderr"]  # which run paid for them
    assert again["winner"] == doc["winner"] and again["rounds"] == doc["rounds"]
    fresh = optimize_json(tmp_path, "--no-cache", "--max-rollouts", "5")
    assert fresh["spend"]["rollouts"] <= 5 and fresh["spend"]["reused_from_cache"] == 0
    assert fresh["status"] == "budget_reached"


def test_budget_is_a_hard_ceiling_and_spend_shows_live(tmp_path: Path) -> None:
    write_synth_spec(tmp_path, [0.1, 0.95, 0.9], n_val=20, n_test=10, budget={"rollouts": 500})
    doc = optimize_json(tmp_path, "--max-rollouts", "13", "--strategy", "grid")
    assert doc["spend"]["rollouts"] == 13 and doc["status"] == "budget_reached"
    assert doc["budget_reached"] and any("budget" in m for m in doc["messages"])
    store = sqlite3.connect(Path(doc["study_dir"]) / "store.sqlite")
    assert store.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0] == 13
    assert "of 13 rollouts" in doc["_stderr"]
    # Raising the ceiling on resume continues the same study.
    result = run_agl(["optimize", "--resume", doc["study_id"], "--max-rollouts", "20", "--json", "-q"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["spend"]["rollouts"] == 20


def _finished(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return int(conn.execute(
                "SELECT COUNT(*) FROM rollouts WHERE status IN ('succeeded','failed','timed_out')").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def test_study_killed_mid_way_resumes_with_no_rollout_run_twice(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    write_synth_spec(tmp_path, [0.5, 0.8], n_val=14, n_test=6, concurrency=2,
                     agent={"command": "python synthetic_agent.py {task_file} {output_file}", "timeout_s": 20,
                            "env": {"SYNTH_SLEEP": "0.2", "SYNTH_MARKERS": str(markers)}})
    proc = subprocess.Popen([sys.executable, "-m", "agl_cli", "optimize", "agl.yaml", "-q", "--json"], cwd=tmp_path,
                            env=agl_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = tmp_path / ".agl" / "runs"
    deadline = time.monotonic() + 60
    db = None
    while time.monotonic() < deadline and db is None:
        found = list(runs.glob("*/store.sqlite")) if runs.exists() else []
        if found and _finished(found[0]) >= 6:
            db = found[0]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert db is not None, "the study never got going"
    # Only agl writes rows, and it is gone (its agents die with it: a parent-death signal): nothing to wait for.
    with sqlite3.connect(db) as conn:
        done_before = {(r[0], r[1], r[2]) for r in conn.execute(
            "SELECT variant, task_id, seed FROM rollouts WHERE status IN ('succeeded','failed','timed_out')")}
    result = run_agl(["optimize", "--resume", db.parent.name, "--json", "-q"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["status"] == "completed" and doc["study_id"] == db.parent.name
    starts: dict[tuple[str, str, str], int] = {}
    for marker in markers.iterdir():
        task, seed, variant_hash, _pid = marker.name.split(".")
        key = (marker.read_text(), task, seed)
        starts[key] = starts.get(key, 0) + 1
    for variant, task, seed in done_before:
        assert starts[(variant, task, str(seed))] == 1, f"{variant} {task} finished before the kill but ran again"
    with sqlite3.connect(db) as conn:
        keys = [r[0] for r in conn.execute("SELECT key FROM rollouts WHERE status = 'succeeded'")]
    assert len(keys) == len(set(keys)) == 2 * 14 + 2 * 6  # every planned rollout finished, each once


def test_candidate_file_dry_run_and_pilot_reuse(tmp_path: Path) -> None:
    write_synth_spec(tmp_path, [0.5], n_val=12, n_test=8)
    spec = yaml.safe_load((tmp_path / "agl.yaml").read_text())
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "base.txt").write_text("0.3")
    (tmp_path / "prompts" / "v3.txt").write_text("0.97")
    spec["knobs"] = {"p_file": {"files": ["prompts/base.txt"], "via": "env", "name": "SYNTH_P_FILE"}}
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    dry = run_agl(["optimize", "agl.yaml", "--candidate", "prompts/v3.txt", "--dry-run", "--json"], cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    projection = json.loads(dry.stdout)
    assert projection["strategy"] == "grid" and projection["per_rollout"]["source"] == "pilot"
    assert projection["projected"]["grid"]["rollouts"] == 2 * 12 + 2 * 8
    assert projection["cached_rollouts"] == 3 and projection["projected"]["grid"]["to_run"] == 37
    again = json.loads(run_agl(["optimize", "agl.yaml", "--candidate", "prompts/v3.txt", "--dry-run", "--json"],
                               cwd=tmp_path).stdout)
    assert again["per_rollout"]["source"] == "store" and again["pilot_study"] is None
    doc = optimize_json(tmp_path, "--candidate", "prompts/v3.txt")
    assert doc["winner"]["name"] == "p_file=v3" and doc["spend"]["reused_from_cache"] == 3
    assert doc["winner"]["changes"] == {"p_file": {"baseline": "prompts/base.txt", "winner": "prompts/v3.txt"}}
    best = yaml.safe_load((tmp_path / "agl.best.yaml").read_text())
    assert best["knobs"]["p_file"]["files"] == ["prompts/v3.txt", "prompts/base.txt"]


@pytest.mark.parametrize("args,message", [
    (["--strategy", "reflect"], "reflect"),
    (["--max-rollouts", "0"], "--max-rollouts"),
    (["--candidate", "missing.md"], "file-valued"),
    (["--resume", "x"], "--resume STUDY takes no spec"),
])
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    write_synth_spec(tmp_path, [0.5, 0.6], n_val=4, n_test=2)
    result = invoke_agl(["optimize", "agl.yaml", *args], cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_specs_that_cannot_be_optimized_are_usage_errors(tmp_path: Path) -> None:
    write_synth_spec(tmp_path, [0.5], n_val=4, n_test=2)
    result = invoke_agl(["optimize", "agl.yaml"], cwd=tmp_path)
    assert result.returncode == 2 and "nothing to optimize" in result.stderr
    write_synth_spec(tmp_path, [0.5, 0.6], n_val=4, n_test=2, tasks={"path": "tasks.jsonl"})
    result = invoke_agl(["optimize", "agl.yaml"], cwd=tmp_path)
    assert result.returncode == 2 and "defines no splits" in result.stderr
