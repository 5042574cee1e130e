"""The skill's scripts on a fixture run store: non-interactive, `--help`, JSON on stdout, exit 2 on misuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agl_cli.runs.rundir import RunDir
from rl_backend.store.db import RunStore
from rl_backend.store.records import Api, CallRecord, FailureKind, RewardSource, Rollout, RolloutStatus

SCRIPTS = Path(__file__).resolve().parent.parent / "skills" / "agent-lightning" / "scripts"
TRACEBACK = "Traceback (most recent call last):\n  File \"agent.py\", line 3\nKeyError: 'answer'"


# The scripts read runs through `agl`: the one installed beside this Python, found first on PATH.
AGL_ON_PATH = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


def run_script(name: str, *args: str, cwd: Path, stdin: str | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], cwd=cwd, input=stdin, capture_output=True,
                          text=True, timeout=60, check=False, env=env or AGL_ON_PATH)


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    run = RunDir.create(tmp_path / ".agl" / "runs", spec_data={},
                        manifest={"kind": "eval", "spec_path": str(tmp_path / "agl.yaml"), "split": "val"})
    store = RunStore(run.store_path)
    cases: list[tuple[str, str, float | None, FailureKind | None, str | None]] = [
        ("baseline", "ok", 1.0, None, None),
        ("baseline", "wrong", 0.0, None, None),
        ("baseline", "crash", None, FailureKind.agent_crashed, TRACEBACK),
        ("baseline", "silent", None, FailureKind.no_output, "the agent wrote no output"),
        ("v2", "ok", 1.0, None, None),
        ("v2", "wrong", 1.0, None, None),
    ]
    for i, (variant, task, reward, failure, error) in enumerate(cases):
        rid = f"r{i:02d}{task}"
        (run.rollout_dir(rid) / "task.json").write_text(json.dumps({"id": task, "q": "2+2"}))
        store.put_rollout(Rollout(
            id=rid, key=f"{variant}/{task}/0", variant=variant, task_id=task, split="val",
            status=RolloutStatus.succeeded if failure is None else RolloutStatus.failed, reward=reward,
            reward_source=RewardSource.grader if reward is not None else RewardSource.none, failure=failure,
            error=error, grader_detail={"expected": "4"} if reward == 0.0 else None, started_at=100.0 + i,
            ended_at=102.0 + i, output="5" if task == "wrong" else "4", stderr_tail=error,
        ))
        store.insert_call(CallRecord(
            call_id=f"c{i}", rollout_id=rid, api=Api.openai_chat, upstream="openai", model="gpt-4.1-mini",
            request={"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "What is 2+2?" + "x" * 5000}]},
            response={"choices": [{"message": {"role": "assistant", "content": "5"}}]},
            input_tokens=1200, output_tokens=10, cost_usd=0.001, latency_s=1.5, started_at=100.0 + i, status_code=200,
        ))
    store.close()
    return tmp_path


def test_every_script_has_help() -> None:
    for script in ("failures.py", "transcript.py", "journal.py", "spend.py"):
        result = subprocess.run([sys.executable, str(SCRIPTS / script), "--help"], capture_output=True, text=True,
                                timeout=60, check=False)
        assert result.returncode == 0 and "usage:" in result.stdout, script


def test_failures_summarises_the_latest_run(project: Path) -> None:
    doc = as_json(run_script("failures.py", cwd=project))
    base = doc["variants"]["baseline"]
    assert (base["finished"], base["scored"], base["passed"], base["failed_scored"], base["missing_reward"]) == \
        (4, 2, 1, 1, 2)
    assert base["missing_reasons"] == {"agent_crashed": 1, "no_output": 1}
    model = base["by_model"]["openai/gpt-4.1-mini"]
    assert model["calls"] == 4
    # Four calls of 1.5 s each: 6 s spent in them, 1.5 s per call; never a bare `latency_s` that reads as per call.
    assert model["latency_s_total"] == 6.0 and model["latency_s_per_call"] == 1.5 and "latency_s" not in model
    assert base["model_time_share"] == 0.75 and base["cost_per_rollout_usd"] == 0.001
    assert doc["failure_kinds"] == {"low_reward": 1, "agent_crashed": 1, "no_output": 1}
    assert doc["common_errors"][0]["line"] == "KeyError: 'answer'"
    assert doc["failures_total"] == 3 and doc["failures"][0]["grader_detail"] == {"expected": "4"}
    only = as_json(run_script("failures.py", "--variant", "v2", cwd=project))
    assert only["failures_total"] == 0 and list(only["variants"]) == ["v2"]


def test_failures_reads_eval_json_from_stdin(project: Path) -> None:
    run_dir = next((project / ".agl" / "runs").iterdir())
    doc = as_json(run_script("failures.py", "--eval-json", "-", "--limit", "1", cwd=project,
                             stdin=json.dumps({"run_id": run_dir.name, "run_dir": str(run_dir)})))
    assert doc["run_id"] == run_dir.name and len(doc["failures"]) == 1
    assert run_script("failures.py", "--eval-json", "-", cwd=project, stdin="not json").returncode == 2
    assert run_script("failures.py", "nope", cwd=project).returncode == 2


def test_transcript_shows_task_calls_and_clips(project: Path) -> None:
    doc = as_json(run_script("transcript.py", "r01", "--chars", "200", cwd=project))
    assert doc["rollout"]["task_id"] == "wrong" and doc["task"] == {"id": "wrong", "q": "2+2"}
    (turn,) = doc["calls"]
    assert turn["response"]["choices"][0]["message"]["content"] == "5"
    content = turn["request"]["messages"][0]["content"]
    assert len(content) < 400 and "characters cut" in content
    assert run_script("transcript.py", "r", cwd=project).returncode == 2  # ambiguous prefix


def test_journal_add_show_and_the_kept_rule(project: Path) -> None:
    compare = {"baseline": {"ref": "baseline"}, "split": "val", "comparisons": [{
        "candidate": {"ref": "v2"}, "verdict": "better", "difference": {"mean": 0.25, "ci95": [0.1, 0.4]},
        "n_tasks": 40, "p_value": 0.01, "p_adjusted": 0.01}]}
    (project / "cmp.json").write_text(json.dumps(compare))
    added = as_json(run_script("journal.py", "add", "--hypothesis", "an explicit format fixes wrong answers",
                               "--lever", "prompt", "--change", "prompt v2", "--compare-json", "cmp.json",
                               "--decision", "kept", cwd=project))
    assert added["entry"]["verdict"] == "better" and added["entry"]["difference"] == 0.25
    assert Path(added["journal"]) == project / ".agl" / "journal.jsonl"
    refused = run_script("journal.py", "add", "--hypothesis", "h", "--lever", "model", "--change", "c",
                         "--verdict", "no detectable difference", "--decision", "kept", cwd=project)
    assert refused.returncode == 2 and "better" in refused.stderr
    shown = as_json(run_script("journal.py", "show", cwd=project))
    assert len(shown["entries"]) == 1
    table = run_script("journal.py", "show", "--markdown", cwd=project)
    # Every difference with its interval and n, the number of tasks it rests on.
    assert "| prompt | prompt v2 | val | better | +25.0 pts [+10.0, +40.0] | 40 | kept |" in table.stdout
    as_json(run_script("journal.py", "add", "--hypothesis", "h", "--lever", "model", "--change", "c",
                       "--verdict", "no detectable difference", "--difference", "0.02", "--decision", "reverted",
                       cwd=project))
    table = run_script("journal.py", "show", "--markdown", cwd=project)
    assert "| model | c |  | no detectable difference | +2.0 pts | ? | reverted |" in table.stdout  # unknown n


def test_journal_takes_several_levers_for_one_change(project: Path) -> None:
    both = as_json(run_script("journal.py", "add", "--hypothesis", "the new prompt needs the large model",
                              "--lever", "prompt,model", "--change", "prompt v3 on the large model",
                              "--verdict", "better", "--difference", "0.13", "--decision", "kept", cwd=project))
    assert both["entry"]["levers"] == ["prompt", "model"] and both["entry"]["lever"] == "prompt+model"
    repeated = as_json(run_script("journal.py", "add", "--hypothesis", "h", "--lever", "prompt", "--lever",
                                  "reasoning-effort", "--change", "c", "--decision", "pending", cwd=project))
    assert repeated["entry"]["levers"] == ["prompt", "reasoning-effort"]
    bad = run_script("journal.py", "add", "--hypothesis", "h", "--lever", "prompt,vibes", "--change", "c",
                     "--decision", "pending", cwd=project)
    assert bad.returncode == 2 and "vibes" in json.loads(bad.stderr)["error"]
    table = run_script("journal.py", "show", "--markdown", cwd=project).stdout
    assert "| prompt + model | prompt v3 on the large model |" in table


def test_spend_against_a_budget(project: Path) -> None:
    doc = as_json(run_script("spend.py", "--budget-usd", "0.01", "--budget-rollouts", "100", cwd=project))
    assert doc["rollouts"] == 6 and doc["usd"] == pytest.approx(0.006)
    assert doc["left"]["rollouts"] == 94 and doc["over_budget"] is False
    assert as_json(run_script("spend.py", "--budget-usd", "0.005", cwd=project))["over_budget"] is True
    assert as_json(run_script("spend.py", "--since", "2999-01-01", cwd=project))["rollouts"] == 0


def test_spend_reads_the_budget_of_the_projects_agl_yaml(project: Path) -> None:
    """The user's "don't spend more than $0.01 on the experiments", written as agl.yaml's budget, is what the
    script measures against by default: spent and left across the spec's runs."""
    import yaml

    (project / "tasks.jsonl").write_text('{"id": "ok"}\n')
    (project / "agl.yaml").write_text(yaml.safe_dump({
        "agent": {"command": "python agent.py {task_file} {output_file}"}, "tasks": {"path": "tasks.jsonl"},
        "grader": {"command": "python grade.py {task_file} {output_file}"},
        "budget": {"usd": 0.01, "rollouts": 10, "scope": "experiment"}}))
    doc = as_json(run_script("spend.py", cwd=project))
    assert doc["budget"]["usd"] == 0.01 and doc["budget"]["scope"] == "experiment"
    assert doc["usd"] == pytest.approx(0.006) and doc["left"]["usd"] == pytest.approx(0.004)
    assert doc["left"]["rollouts"] == 4 and doc["over_budget"] is False
    later = as_json(run_script("spend.py", "--since", "2999-01-01", cwd=project))  # shows no run, but the
    assert later["rollouts"] == 0 and later["left"]["usd"] == pytest.approx(0.004)  # experiment's ceiling counts all
    flags = as_json(run_script("spend.py", "--budget-usd", "0.005", cwd=project))  # a ceiling of one's own
    assert flags["budget"]["source"] == "flags" and flags["over_budget"] is True
    everything = as_json(run_script("spend.py", "--all", cwd=project))
    assert everything["spec"] is None and everything["left"] == {"usd": None, "rollouts": None}


def test_an_unpriced_call_makes_the_cost_unknown_not_zero(project: Path) -> None:
    run = next((project / ".agl" / "runs").iterdir())
    store = RunStore(run / "store.sqlite")
    store.insert_call(CallRecord(call_id="unpriced", rollout_id="r00ok", api=Api.openai_chat, upstream="triage",
                                 model="large-1", input_tokens=100, output_tokens=10, cost_usd=None, started_at=106.0))
    store.close()
    base = as_json(run_script("failures.py", cwd=project))["variants"]["baseline"]
    assert base["cost_usd"] is None and base["unpriced_calls"] == 1 and base["cost_per_rollout_usd"] is None
    assert base["by_model"]["triage/large-1"]["cost_usd"] is None
    assert base["by_model"]["openai/gpt-4.1-mini"]["cost_usd"] == pytest.approx(0.004)
    spent = as_json(run_script("spend.py", "--budget-usd", "0.01", cwd=project))
    assert spent["usd"] is None and spent["unpriced_calls"] == 1 and spent["priced_usd"] == pytest.approx(0.006)


# -- the journal records the whole decision: the candidate among several, and the held-out confirmation -----------


def _compare_json(folder: Path, run_id: str, split: str, *refs: str) -> Path:
    """The real `agl compare --json` document, written to a file as the skill tells the agent to."""
    from typer.testing import CliRunner

    from agl_cli.main import app

    result = CliRunner().invoke(app, ["compare", *refs, "--run", run_id, "--split", split, "--json",
                                      "--runs-dir", str(folder / ".agl" / "runs")])
    assert result.exit_code == 0, result.output
    path = folder / f"cmp-{split}-{len(refs)}.json"
    path.write_text(result.stdout)
    return path


@pytest.fixture
def variants_on_val_and_test(tmp_path: Path) -> tuple[Path, str]:
    """20 tasks per split. Right on val: baseline 4, v2 18, v3 8, v4 18; on test: baseline 10, v2 18, v4 none.
    So v2 is better on val and on test, and v4 better on val but worse on test."""
    run = RunDir.create(tmp_path / ".agl" / "runs", spec_data={}, manifest={"kind": "eval", "spec_path": "x"})
    store = RunStore(run.store_path)
    for split in ("val", "test"):
        held_out = split == "test"
        for i in range(20):
            for variant, right in (("baseline", i < (10 if held_out else 4)), ("v2", i < 18), ("v3", i < 8),
                                   ("v4", not held_out and i < 18)):
                store.put_rollout(Rollout(
                    id=f"{variant}-{split}-{i}", key=f"{variant}/{split}{i}/0", variant=variant,
                    task_id=f"{split}{i}", split=split, status=RolloutStatus.succeeded, reward=1.0 if right else 0.0,
                    reward_source=RewardSource.grader, started_at=1.0, ended_at=2.0,
                ))
    store.close()
    return tmp_path, run.run_id


def test_journal_names_the_candidate_and_records_the_test_confirmation(variants_on_val_and_test: tuple[Path, str]) -> None:
    folder, run_id = variants_on_val_and_test
    val = _compare_json(folder, run_id, "val", "baseline", "v2", "v3")
    test = _compare_json(folder, run_id, "test", "baseline", "v2")
    base = ["add", "--hypothesis", "h", "--lever", "prompt", "--change", "prompt v2", "--compare-json", str(val)]

    unnamed = run_script("journal.py", *base, "--decision", "kept", cwd=folder)
    assert unnamed.returncode == 2 and "judged 2 candidates" in unnamed.stderr and "v2, v3" in unnamed.stderr
    wrong_name = run_script("journal.py", *base, "--candidate", "v9", "--decision", "kept", cwd=folder)
    assert wrong_name.returncode == 2 and "no candidate 'v9'" in wrong_name.stderr

    entry = as_json(run_script("journal.py", *base, "--candidate", "v3", "--decision", "reverted",
                               cwd=folder))["entry"]
    assert entry["candidate"] == "v3" and entry["difference"] == pytest.approx(0.2)

    entry = as_json(run_script("journal.py", *base, "--candidate", f"{run_id}:v2", "--test-compare-json", str(test),
                               "--decision", "kept", cwd=folder))["entry"]
    assert entry["candidate"] == "v2" and entry["split"] == "val" and entry["difference"] == pytest.approx(0.7)
    # What agl advise needs to add gains only along the chain of kept baselines.
    assert (entry["baseline_run"], entry["baseline_variant"]) == (run_id, "baseline")
    assert (entry["candidate_run"], entry["candidate_variant"]) == (run_id, "v2")
    assert entry["test"]["split"] == "test" and entry["test"]["candidate"] == "v2"
    assert entry["test"]["verdict"] == "better" and entry["test"]["difference"] == pytest.approx(0.4)
    assert entry["test"]["n_tasks"] == 20 and entry["test"]["ci95"][0] > 0

    same_split = run_script("journal.py", *base, "--candidate", "v2", "--test-compare-json", str(val),
                            "--decision", "kept", cwd=folder)
    assert same_split.returncode == 2 and "held-out" in same_split.stderr
    table = run_script("journal.py", "show", "--markdown", cwd=folder).stdout
    entry_row = next(line for line in table.splitlines() if "| kept |" in line)
    assert "| prompt | prompt v2 | val | better | +70.0 pts [" in entry_row and "| 20 | kept | better +40.0 pts [" in entry_row
    assert entry_row.endswith("(n=20) |")


def test_journal_refuses_to_keep_what_the_test_split_calls_worse(variants_on_val_and_test: tuple[Path, str]) -> None:
    folder, run_id = variants_on_val_and_test
    val = _compare_json(folder, run_id, "val", "baseline", "v4")
    test = _compare_json(folder, run_id, "test", "baseline", "v4")
    assert json.loads(test.read_text())["verdict"] == "worse"
    args = ["add", "--hypothesis", "h", "--lever", "prompt", "--change", "c", "--compare-json", str(val),
            "--test-compare-json", str(test)]
    refused = run_script("journal.py", *args, "--decision", "kept", cwd=folder)
    assert refused.returncode == 2 and "test confirmation says `worse`" in refused.stderr
    entry = as_json(run_script("journal.py", *args, "--decision", "reverted", cwd=folder))["entry"]
    assert entry["verdict"] == "better" and entry["test"]["verdict"] == "worse"


# -- the scripts read runs through agl, so the skill survives a change of the run store's format -------------------


def test_the_scripts_never_open_the_run_store_themselves() -> None:
    for script in sorted(SCRIPTS.glob("*.py")):
        text = script.read_text()
        assert "sqlite" not in text and "store.sqlite" not in text and "manifest.json" not in text, script.name


def test_the_scripts_say_when_agl_is_not_on_path(project: Path) -> None:
    bare = {**os.environ, "PATH": str(project / "no-bin-here")}
    for args in (("failures.py",), ("transcript.py", "r01"), ("spend.py",)):
        result = run_script(*args, cwd=project, env=bare)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "agl is not on PATH" in json.loads(result.stderr)["error"]


def test_spend_passes_over_a_damaged_run_and_says_why(project: Path) -> None:
    damaged = project / ".agl" / "runs" / "20200101-000000-dead"
    damaged.mkdir()
    (damaged / "manifest.json").write_text('{"kind": "ev')
    (damaged / "store.sqlite").write_bytes(b"")
    doc = as_json(run_script("spend.py", "--budget-usd", "1", cwd=project))
    assert doc["rollouts"] == 6 and doc["usd"] == pytest.approx(0.006)
    assert [Path(s["run_dir"]).name for s in doc["skipped"]] == [damaged.name] and "damaged" in doc["skipped"][0]["reason"]
