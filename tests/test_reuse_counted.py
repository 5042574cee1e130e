"""A repeated `agl eval` reuses finished rollouts of an earlier run; that reuse shows everywhere and is never
counted as spent twice: on each progress line, in the summary ("4 rollouts reused from run X"), in `--json`, in
the run's budget, in the report's spend line and in the skill's spend script. Real runs of a paying agent (the
openai SDK through the gateway, to a priced fake upstream), stdout piped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY
from rl_backend.store.db import RunStore
from tests.helpers import FIXTURES, REPO, run_agl

SPEND = REPO / "skills" / "agent-lightning" / "scripts" / "spend.py"
# max_tokens 4, and a price for output only: each call's worst case (what it reserves against a budget) is its cost.
ENV = {"PAID_KEY": UPSTREAM_KEY, "PAID_CALLS": "1", "PAID_MAX_TOKENS": "4"}


def _write(folder: Path, fake: FakeUpstream, n_tasks: int, budget_usd: float | None = None) -> None:
    shutil.copy(FIXTURES / "paid_agent.py", folder / "paid_agent.py")
    (folder / "tasks.jsonl").write_text("".join(json.dumps({"id": f"t{i}"}) + "\n" for i in range(n_tasks)))
    spec: dict[str, Any] = {
        "name": "paid",
        "agent": {"command": "python paid_agent.py {task_file} {output_file}", "timeout_s": 30},
        "tasks": {"path": "tasks.jsonl"},
        "grader": {"entry": "paid_agent:grade"},
        "upstreams": {"paid": {"kind": "openai-compatible", "base_url": fake.base_url, "api_key_env": "PAID_KEY",
                             "free": False}},
        "model": "paid/gpt-4o",
        "prices": {"paid/gpt-4o": {"input": 0.0, "output": 10.0}},
        "concurrency": 2,
    }
    if budget_usd is not None:
        spec["budget"] = {"usd": budget_usd}
    (folder / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def _eval(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_agl(["eval", "agl.yaml", "--no-report", *args], cwd=folder, env=ENV, check=True)


def test_reused_rollouts_are_marked_and_never_counted_as_spent(tmp_path: Path, fake_server: FakeUpstream) -> None:
    fake_server.reset()
    _write(tmp_path, fake_server, n_tasks=4)
    first = json.loads(_eval(tmp_path, "--json").stdout)
    paid = first["spend"]["usd"]
    assert paid > 0 and first["spend"]["rollouts_launched"] == 4 and first["spend"]["reused_rollouts"] == 0

    # The same eval again, stdout piped: every rollout is reused, and says so.
    again = _eval(tmp_path)
    second_id = sorted(p.name for p in (tmp_path / ".agl" / "runs").iterdir())[-1]
    progress = [line for line in again.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 4, again.stderr
    assert all(f"(reused from run {first['run_id']}, not run again)" in line for line in progress), progress
    assert f"4 rollouts reused from run {first['run_id']}" in again.stdout
    assert "this run launched 0 rollouts and spent $0.00\n" in again.stdout

    as_json = json.loads(run_agl(["eval", "agl.yaml", "--no-report", "--json", "-q"], cwd=tmp_path, env=ENV,
                                 check=True).stdout)
    assert as_json["spend"] == {"rollouts_launched": 0, "usd": 0.0, "priced_usd": 0.0, "unpriced_calls": 0,
                                "reused_rollouts": 4, "reused_usd": pytest.approx(paid),
                                "reused_from": {first["run_id"]: 4}}
    assert as_json["variants"][0]["reused"] == 4
    assert as_json["variants"][0]["accuracy"] == first["variants"][0]["accuracy"]

    # The skill's spend total: the money was spent once, by the first run; 4 rollouts launched, 8 reused.
    spend = subprocess.run([sys.executable, str(SPEND)], cwd=tmp_path, capture_output=True, text=True, check=True)
    totals = json.loads(spend.stdout)
    assert totals["rollouts"] == 4 and totals["usd"] == pytest.approx(paid) and totals["reused_rollouts"] == 8
    by_run = {r["run_id"]: r for r in totals["runs"]}
    assert by_run[second_id]["rollouts"] == 0 and by_run[second_id]["usd"] == 0
    assert by_run[second_id]["reused_usd"] == pytest.approx(paid)

    # The report of the second run: nothing spent by it, the reused calls named apart.
    run_agl(["report", second_id, "--format", "md"], cwd=tmp_path, check=True)
    text = (tmp_path / ".agl" / "runs" / second_id / "report" / "report.md").read_text()
    assert "No model calls were made by this run. Not counted: 4 rollouts reused from earlier runs" in text


def test_reused_cost_does_not_count_against_the_new_runs_budget(tmp_path: Path, fake_server: FakeUpstream) -> None:
    fake_server.reset()
    _write(tmp_path, fake_server, n_tasks=4)
    first = json.loads(_eval(tmp_path, "--json").stdout)
    store = RunStore(Path(first["run_dir"]) / "store.sqlite")
    paid = sum(c.cost_usd or 0.0 for c in store.calls())
    store.close()
    # Two new tasks and a budget just below what the four reused rollouts cost when they ran: the new ones
    # (half that cost) fit, because the copies cost this run nothing.
    _write(tmp_path, fake_server, n_tasks=6, budget_usd=paid * 0.9)
    second = json.loads(_eval(tmp_path, "--json").stdout)
    assert second["status"] == "completed", second
    assert second["variants"][0]["n"] == 6 and second["variants"][0]["missing"] == 0
    assert second["spend"]["rollouts_launched"] == 2 and second["spend"]["reused_rollouts"] == 4
