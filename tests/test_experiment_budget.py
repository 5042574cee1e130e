"""`budget: {usd: X, scope: experiment}`: one ceiling for every run of a spec together, as a user means "don't spend
more than $1 on the experiments". `agl spend agl.yaml` shows spent and left against the spec's budget; a later run
starts with what is left and stops there; once nothing is left a run is refused (exit 2); reused rollouts are never
counted twice. Real `agl` processes, a paying agent (the openai SDK) and a priced upstream on loopback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY
from rl_backend.store.db import RunStore
from tests.helpers import FIXTURES, invoke_agl, run_agl

ENV = {"PAID_KEY": UPSTREAM_KEY, "PAID_MAX_TOKENS": "4"}  # a worst case the gateway can reserve within the budgets


def write_paid_spec(folder: Path, fake: FakeUpstream, budget: dict[str, Any]) -> None:
    """Six val tasks; the agent makes $PAID_CALLS priced calls per task (knob `calls`: 1 or 2)."""
    shutil.copy(FIXTURES / "paid_agent.py", folder / "paid_agent.py")
    tasks = [{"id": f"v{i:02d}", "split": "val"} for i in range(6)] + [{"id": "x0", "split": "test"}]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (folder / "agl.yaml").write_text(yaml.safe_dump({
        "name": "paid",
        "agent": {"command": "python paid_agent.py {task_file} {output_file}", "timeout_s": 30},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": {"entry": "paid_agent:grade"},
        "upstreams": {"paid": {"kind": "openai-compatible", "base_url": fake.base_url, "api_key_env": "PAID_KEY",
                               "free": False}},
        "model": "paid/tiny",
        "prices": {"paid/tiny": {"input": 1000.0, "output": 1000.0}},
        "knobs": {"calls": {"values": [1, 2], "via": "env", "name": "PAID_CALLS"}},
        "concurrency": 1,
        "budget": budget,
    }, sort_keys=False))


def spend(folder: Path) -> dict[str, Any]:
    result = invoke_agl(["spend", "agl.yaml", "--json"], cwd=folder)
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def evaluate(folder: Path, *args: str) -> Any:
    return run_agl(["eval", "agl.yaml", "--split", "val", "-q", "--no-report", "--json", *args], cwd=folder, env=ENV)


def test_an_experiment_budget_covers_every_run_of_the_spec(tmp_path: Path, fake_server: FakeUpstream) -> None:
    fake_server.reset()
    write_paid_spec(tmp_path, fake_server, {"usd": 1.0, "scope": "experiment"})
    first = evaluate(tmp_path)
    assert first.returncode == 0, first.stderr
    per_task = json.loads(first.stdout)["spend"]["usd"] / 6  # one priced call per task

    # The ceiling that leaves room for a little more than this run: 8 tasks' worth in all.
    write_paid_spec(tmp_path, fake_server, {"usd": round(8.5 * per_task, 8), "scope": "experiment"})
    doc = spend(tmp_path)
    assert doc["budget"]["scope"] == "experiment" and doc["budget"]["source"].endswith("agl.yaml")
    assert doc["usd"] == pytest.approx(6 * per_task) and doc["rollouts"] == 6
    assert doc["left"]["usd"] == pytest.approx(2.5 * per_task, rel=1e-3) and doc["over_budget"] is False
    text = invoke_agl(["spend", "agl.yaml"], cwd=tmp_path).stdout
    assert "spent of $" in text and "left" in text

    # The same rollouts again are reused, not paid again: the experiment's spend does not move.
    again = evaluate(tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["spend"]["reused_rollouts"] == 6
    assert spend(tmp_path)["usd"] == pytest.approx(6 * per_task)

    # A new variant (2 calls per task) starts with what is left and stops there.
    capped = evaluate(tmp_path, "-v", "calls=2")
    capped_doc = json.loads(capped.stdout)
    assert capped_doc["status"] == "budget_reached", capped.stderr
    assert "scope: experiment" in capped.stderr and "left" in capped.stderr
    total = spend(tmp_path)
    # A ceiling is a ceiling: each call reserves its worst case before it goes out (the gateway's guarantee), so
    # the experiment as a whole never passes it, whatever the run in flight was doing.
    assert 6 * per_task - 1e-9 <= total["priced_usd"] <= 8.5 * per_task + 1e-9
    assert total["over_budget"] is False

    # A ceiling the runs so far have reached: nothing is left.
    write_paid_spec(tmp_path, fake_server, {"usd": total["priced_usd"], "scope": "experiment"})
    # Nothing is left: the next run is refused before it starts, and says why and what to do.
    refused = evaluate(tmp_path, "-v", "calls=2")
    assert refused.returncode == 2 and not refused.stdout
    assert "experiment's budget is spent" in refused.stderr and "user's decision" in refused.stderr
    runs = sorted((tmp_path / ".agl" / "runs").iterdir())
    assert len(runs) == 3  # the refused run left no folder behind


def test_a_resumed_run_keeps_its_own_spend_and_gets_the_rest(tmp_path: Path, fake_server: FakeUpstream) -> None:
    """The run being resumed is not one of the 'others': its own spend counts once, through its own store."""
    fake_server.reset()
    write_paid_spec(tmp_path, fake_server, {"usd": 1.0, "scope": "experiment"})
    first = evaluate(tmp_path, "--limit", "2")
    per_task = json.loads(first.stdout)["spend"]["usd"] / 2
    write_paid_spec(tmp_path, fake_server, {"usd": round(4.5 * per_task, 8), "scope": "experiment"})
    second = evaluate(tmp_path, "-v", "calls=2")  # 2 per task: stops after about 1.25 tasks of the 4 it may pay for
    run_id = json.loads(second.stdout)["run_id"]
    assert json.loads(second.stdout)["status"] == "budget_reached"
    write_paid_spec(tmp_path, fake_server, {"usd": round(100 * per_task, 8), "scope": "experiment"})
    resumed = run_agl(["eval", "--resume", run_id, "-q", "--no-report", "--json"], cwd=tmp_path, env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    total = spend(tmp_path)
    # Every call made is counted once, in the run that made it: 2 tasks x 1 call, 6 tasks x 2 calls, and the first
    # call of the rollout the budget stopped half-way (it ran again on resume; a refused call costs nothing).
    made = 0.0
    for run in (tmp_path / ".agl" / "runs").iterdir():
        store = RunStore(run / "store.sqlite", read_only=True)
        made += sum(c.cost_usd or 0.0 for c in store.calls())
        store.close()
    assert total["priced_usd"] == pytest.approx(made) and 14 * per_task <= made <= 15 * per_task + 1e-9


def test_a_per_run_budget_is_not_summed_across_runs(tmp_path: Path, fake_server: FakeUpstream) -> None:
    fake_server.reset()
    write_paid_spec(tmp_path, fake_server, {"usd": 1.0})
    assert evaluate(tmp_path, "--limit", "1").returncode == 0
    doc = spend(tmp_path)
    assert doc["budget"] == {"usd": 1.0, "rollouts": None, "scope": "run", "source": str((tmp_path / "agl.yaml").resolve())}
    assert doc["left"] == {"usd": None, "rollouts": None} and doc["over_budget"] is False
    text = invoke_agl(["spend", "agl.yaml"], cwd=tmp_path).stdout
    assert "for each run on its own" in text and "scope: experiment" in text


def test_runs_of_an_experiment_budget_go_one_at_a_time(tmp_path: Path, fake_server: FakeUpstream) -> None:
    """A run started while another run of the spec is running could spend the same remainder: refused, naming it."""
    from agl_cli.runs.rundir import RunDir
    from rl_backend.store.runlock import RunLock

    write_paid_spec(tmp_path, fake_server, {"usd": 1.0, "scope": "experiment"})
    busy = RunDir.create(tmp_path / ".agl" / "runs", spec_data={},
                         manifest={"kind": "eval", "spec_path": str((tmp_path / "agl.yaml").resolve())})
    with RunLock(busy.path).acquire(command="agl eval agl.yaml"):
        refused = invoke_agl(["eval", "agl.yaml", "--split", "val", "--no-report"], cwd=tmp_path, env=ENV)
        assert refused.returncode == 2, refused.stdout
        assert f"run {busy.run_id}" in refused.stderr and "one at a time" in refused.stderr
    assert len(list((tmp_path / ".agl" / "runs").iterdir())) == 1
