"""A partial-credit grader (the mean of three fields): beside the mean reward, every surface that shows accuracy
shows the share of rollouts fully right (reward 1) with its n and interval: `agl eval` (table and --json), the
report, `agl compare` (sentence and --json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import run_agl, write_tasks

AGENT = """\
import json, os, sys
task = json.load(open(sys.argv[1]))
open(sys.argv[2], "w").write(task["answers"][os.environ["TRIAGE_PROMPT"]])
"""
GRADER = """\
import json, sys
task = json.load(open(sys.argv[1]))
got = open(sys.argv[2]).read().strip().split(",")
fields = [a == b for a, b in zip(got, task["expected"])]
print(json.dumps({"score": sum(fields) / 3, "fields": fields}))
"""
EXPECTED = ["billing", "high", "refund"]


def _answer(right: int) -> str:
    """Three fields, the first `right` of them right."""
    return ",".join(EXPECTED[:right] + ["wrong"] * (3 - right))


EVAL = ["eval", "agl.yaml", "-v", "baseline", "-v", "prompt=new", "--quiet"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """12 tickets; the old prompt gets 4 fully right and the rest 2 of 3 fields, the new one 9 fully right and 3 at
    1 of 3: nearly the same mean reward (0.78 vs 0.83), very different counts of fully right tickets."""
    folder = tmp_path_factory.mktemp("partial")
    (folder / "agent.py").write_text(AGENT)
    (folder / "grade.py").write_text(GRADER)
    tasks = [{"id": f"t{i:02d}", "expected": EXPECTED,
              "answers": {"old": _answer(3 if i < 4 else 2), "new": _answer(3 if i < 9 else 1)}} for i in range(12)]
    write_tasks(folder / "tasks.jsonl", tasks)
    spec = {"name": "triage", "agent": {"command": "python agent.py {task_file} {output_file}", "timeout_s": 30},
            "tasks": {"path": "tasks.jsonl"}, "grader": {"command": "python grade.py {task_file} {output_file}"},
            "knobs": {"prompt": {"values": ["old", "new"], "via": "env", "name": "TRIAGE_PROMPT"}}, "concurrency": 4}
    (folder / "agl.yaml").write_text(yaml.safe_dump(spec))
    result = run_agl([*EVAL, "--json"], cwd=folder, check=True)
    return folder, json.loads(result.stdout)


def test_eval_shows_the_share_fully_right_beside_the_mean(project: tuple[Path, dict]) -> None:
    folder, doc = project
    old, new = doc["variants"]
    assert old["accuracy"]["mean"] == pytest.approx((4 + 8 * 2 / 3) / 12)
    assert old["partial_credit"] and old["fully_right"]["mean"] == pytest.approx(4 / 12)
    assert new["fully_right"]["mean"] == pytest.approx(9 / 12) and new["fully_right"]["n"] == 12
    lo, hi = new["fully_right"]["ci95"]
    assert lo < 0.75 < hi and new["fully_right"]["interval"] == "wilson"
    table = run_agl(EVAL, cwd=folder, check=True).stdout  # every rollout reused: nothing runs again
    assert "fully right [95% CI]" in table and "33.3% [" in table and "75.0% [" in table


def test_the_report_shows_it_too(project: tuple[Path, dict]) -> None:
    folder, doc = project
    md = (Path(doc["run_dir"]) / "report" / "report.md").read_text()
    assert r"fully right \[95% CI\]" in md and "fully right the share of rollouts at reward 1" in md


def test_compare_shows_it_beside_the_paired_mean(project: tuple[Path, dict]) -> None:
    folder, doc = project
    refs = [f"{doc['run_id']}:baseline", f"{doc['run_id']}:prompt=new"]
    (result,) = json.loads(run_agl(["compare", *refs, "--json"], cwd=folder, check=True).stdout)["comparisons"]
    full = result["fully_right"]
    assert full["partial_credit"] and full["baseline"]["mean"] == pytest.approx(4 / 12)
    assert full["candidate"]["mean"] == pytest.approx(9 / 12) and full["difference"]["mean"] == pytest.approx(5 / 12)
    text = run_agl(["compare", *refs], cwd=folder, check=True).stdout
    assert "fully right 33.3% [" in text and "-> 75.0% [" in text and "+41.7 points" in text
    # The verdict says which check decided it.
    assert "\n  why: neither check passes: the interval includes zero and the sign test does not pass" in text


def test_too_few_tasks_for_a_bootstrap_are_called_rough_where_shown() -> None:
    """Partial credit over 4 tasks: the mean's bootstrap interval is too narrow as often as not, and the eval
    table, the report's note and the JSON say so; 0/1 rewards over as few tasks get a Wilson interval instead."""
    from rich.console import Console

    from agl_cli.display import variant_table
    from agl_cli.metrics.variant import measure, rough_note
    from rl_backend.store.records import RewardSource, Rollout, RolloutStatus

    def rollouts(rewards: list[float]) -> list[Rollout]:
        return [Rollout(id=f"r{i}", key=f"v/t{i}/0", variant="v", task_id=f"t{i}", seed=0,
                        status=RolloutStatus.succeeded, reward=r, reward_source=RewardSource.grader, started_at=0.0,
                        ended_at=1.0) for i, r in enumerate(rewards)]

    partial = measure("partial", rollouts([0.2, 1.0, 0.6, 1.0]), {})
    binary = measure("binary", rollouts([0.0, 1.0, 1.0, 1.0]), {})
    assert partial.accuracy.rough and not binary.accuracy.rough and binary.accuracy.method == "wilson"
    assert "rough" in partial.summary_json()["accuracy"] and "rough" not in binary.summary_json()["accuracy"]
    note = rough_note([partial, binary])
    assert note == ("accuracy of partial: partial-credit rewards over 4 tasks, fewer than 10: read its interval as "
                    "rough (likely too narrow)")
    console = Console(width=200, record=True, no_color=True)
    console.print(variant_table([partial, binary], title="run"))
    shown = console.export_text()
    assert "accuracy of partial: partial-credit rewards over 4 tasks" in shown and "read its interval as rough" in shown
