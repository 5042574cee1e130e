"""An undecided change that leans better is not dropped in silence: `agl compare` says it is "likely better,
unproven", which split holds tasks it was not judged on, how many tasks pooling gives, and the commands that pool
them (`--split val,train`, the judged rollouts reused). Real `agl` runs of the synthetic agent."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from agl_cli.metrics.more_evidence import likely_better
from tests.helpers import FIXTURES, run_agl


def test_likely_better_needs_most_of_the_interval_above_zero() -> None:
    assert likely_better(0.069, [-0.007, 0.153])  # the trial's +6.9 points [-0.7, +15.3]
    assert not likely_better(0.005, [-0.10, 0.11])  # a coin flip
    assert not likely_better(-0.05, [-0.15, 0.02]) and not likely_better(0.05, None)


def _json(folder: Path, *args: str) -> dict[str, Any]:
    result = run_agl([*args, "--json"], cwd=folder)
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 train, 24 val and 12 test tasks; variant p=0.9 wins 6 val tasks and loses 2 against the baseline
    (p=0.5): +16.7 points, undecided at n=24 (sign test p=0.29)."""
    folder = tmp_path_factory.mktemp("evidence")
    shutil.copy(FIXTURES / "synthetic_agent.py", folder / "synthetic_agent.py")
    tasks = [{"id": f"t{i:03d}", "split": "train"} for i in range(12)]
    tasks += [{"id": f"v{i:03d}", "split": "val"} for i in range(24)]
    tasks += [{"id": f"x{i:03d}", "split": "test"} for i in range(12)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (folder / "agl.yaml").write_text(yaml.safe_dump({
        "name": "evidence",
        "agent": {"command": "python synthetic_agent.py {task_file} {output_file}", "timeout_s": 20},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": {"entry": "synthetic_agent:grade"},
        "knobs": {"p": {"values": [0.5, 0.9], "via": "env", "name": "SYNTH_P"}},
        "concurrency": 2,
    }, sort_keys=False))
    return folder


def test_undecided_but_leaning_better_says_how_to_decide_it(project: Path) -> None:
    run = _json(project, "eval", "agl.yaml", "--split", "val", "-v", "baseline", "-v", "p=0.9", "-q", "--no-report")
    doc = _json(project, "compare", "baseline", "p=0.9", "--run", run["run_id"], "--split", "val")
    (one,) = doc["comparisons"]
    assert one["verdict"] == "no detectable difference" and one["n_tasks"] == 24
    assert one["discordant"] == {"candidate_better": 6, "baseline_better": 2}
    more = one["more_evidence"]
    assert more["likely_better_unproven"] is True and more["tasks_judged"] == 24
    # train was never judged: more evidence; test stays for the confirmation and is never pooled.
    assert more["splits"] == [{"split": "train", "tasks": 12, "role": "evidence"},
                              {"split": "test", "tasks": 12, "role": "confirmation"}]
    assert more["pooled_tasks"] == 36
    assert more["tasks_likely_needed"] == 24 + one["more_tasks"]
    assert more["tasks_likely_needed"] > 36 and more["enough"] is False  # pooling helps, but not enough alone
    assert more["commands"][0] == "agl eval agl.yaml --split val,train --variant baseline --variant p=0.9"

    text = run_agl(["compare", "baseline", "p=0.9", "--run", run["run_id"], "--split", "val"], cwd=project)
    assert "likely better, unproven" in text.stdout and "train (12 tasks)" in text.stdout
    assert "pooled with the 24 judged: 36 tasks" in text.stdout
    assert "test split (12 tasks) stays for the confirmation" in text.stdout

    # The suggested command runs as printed: the 48 judged val rollouts are reused, only train runs.
    pooled = _json(project, *shlex.split(more["commands"][0])[1:], "-q", "--no-report")
    assert pooled["spend"]["reused_rollouts"] == 48 and pooled["spend"]["rollouts_launched"] == 24
    again = _json(project, "compare", "baseline", "p=0.9", "--run", pooled["run_id"], "--split", "val,train")
    assert again["comparisons"][0]["n_tasks"] == 36


def test_a_decided_or_worse_leaning_comparison_has_no_more_evidence(project: Path) -> None:
    run = _json(project, "eval", "agl.yaml", "--split", "val", "-v", "baseline", "-v", "p=0.9", "-q", "--no-report")
    doc = _json(project, "compare", "p=0.9", "baseline", "--run", run["run_id"], "--split", "val")
    assert doc["comparisons"][0]["verdict"] == "no detectable difference"
    assert doc["comparisons"][0].get("more_evidence") is None


def test_an_unknown_split_in_a_list_is_a_usage_error(project: Path) -> None:
    result = run_agl(["eval", "agl.yaml", "--split", "val,tran", "-q", "--no-report"], cwd=project)
    assert result.returncode == 2 and "tran" in result.stderr and "train" in result.stderr


def test_the_journal_records_a_pending_change_as_likely_better_unproven(project: Path) -> None:
    import subprocess
    import sys

    run = _json(project, "eval", "agl.yaml", "--split", "val", "-v", "baseline", "-v", "p=0.9", "-q", "--no-report")
    compared = run_agl(["compare", "baseline", "p=0.9", "--run", run["run_id"], "--split", "val", "--json"],
                       cwd=project)
    (project / "cmp.json").write_text(compared.stdout)
    script = Path(__file__).resolve().parent.parent / "skills" / "agent-lightning" / "scripts" / "journal.py"
    for args in (["add", "--hypothesis", "h", "--lever", "prompt", "--change", "p=0.9", "--compare-json", "cmp.json",
                  "--decision", "pending"], ["show", "--markdown"]):
        shown = subprocess.run([sys.executable, str(script), *args], cwd=project, capture_output=True, text=True,
                               check=True, timeout=60)
    assert "| pending: likely better, unproven |" in shown.stdout
