"""Verdicts pair like with like: two runs whose task files share ids but not content are never compared or gated as
if they ran the same tasks, and a run whose task file changed is never resumed into a mix of old and new tasks.
Each refusal (exit 2) names how many tasks differ and which."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agl_cli.errors import UsageError
from agl_cli.report.gate import regression_verdict
from agl_cli.runs.rundir import RunDir
from rl_backend.store.db import RunStore
from tests.helpers import AGL, FIXTURES, agl_env, invoke_agl, run_agl, wait_for, write_spec

AGENT = f"python {FIXTURES / 'hostile_agent.py'} {{task_file}} {{output_file}}"
GRADER = f"python {FIXTURES / 'hostile_grader.py'} {{task_file}} {{output_file}}"


def _tasks(changed: set[int] = frozenset(), n: int = 10) -> list[dict[str, Any]]:  # type: ignore[assignment]
    """q0..q{n-1}; those in `changed` ask another question (same id, other content)."""
    return [{"id": f"q{i}", "question": f"{i} + {i}" if i not in changed else f"{i} * 7", "answer": "1"}
            for i in range(n)]


def _eval(folder: Path, runs: Path, tasks: list[dict[str, Any]]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    write_spec(folder, tasks, agent={"command": AGENT}, grader={"command": GRADER})
    result = run_agl(["eval", "agl.yaml", "--json", "--no-report", "--no-cache", "--runs-dir", str(runs)],
                     cwd=folder, check=True)
    return str(json.loads(result.stdout)["run_id"])


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Runs of three task files sharing the ids q0..q9: the same content, all ten different, only q3 different."""
    top = tmp_path_factory.mktemp("verdicts")
    runs = top / "runs"
    ids = {"a": _eval(top / "a", runs, _tasks()), "same": _eval(top / "same", runs, _tasks()),
           "other": _eval(top / "other", runs, _tasks(set(range(10)))), "q3": _eval(top / "q3", runs, _tasks({3}))}
    return runs, ids


def _compare(runs: Path, *refs: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return invoke_agl(["compare", *(f"{r}:baseline" for r in refs), "--runs-dir", str(runs), *flags], cwd=runs)


def test_compare_refuses_runs_whose_shared_task_ids_hold_different_tasks(three_runs: tuple[Path, dict]) -> None:
    runs, ids = three_runs
    refused = _compare(runs, ids["a"], ids["other"], flags=("--json",))
    assert refused.returncode == 2, refused.stdout
    text = " ".join(refused.stderr.split())
    assert "share 10 task ids, but 10 of them hold different tasks: q0, q1, q2, q3, q4 and 5 more" in text, text
    assert "--allow-different-tasks" in text and refused.stdout == ""
    one = " ".join(_compare(runs, ids["a"], ids["q3"]).stderr.split())
    assert "but 1 of them hold different tasks: q3:" in one, one

    allowed = _compare(runs, ids["a"], ids["other"], flags=("--json", "--allow-different-tasks"))
    assert allowed.returncode == 0, allowed.stderr
    content = json.loads(allowed.stdout)["comparisons"][0]["task_content"]
    assert content["differing"] == 10 and content["checked"] and sorted(content["differing_ids"])[:2] == ["q0", "q1"]
    assert "paired by id although 10 of the 10 shared tasks differ in content" in " ".join(allowed.stderr.split())

    same = _compare(runs, ids["a"], ids["same"], flags=("--json",))
    assert same.returncode == 0, same.stderr
    doc = json.loads(same.stdout)["comparisons"][0]
    assert doc["task_content"] == {"shared_task_ids": 10, "checked": True, "differing": 0, "differing_ids": [],
                                   "task_sets_differ": False}
    assert doc["n_pairs"] == 10 and "warning" not in same.stderr


def test_the_regression_gate_refuses_different_tasks_too(three_runs: tuple[Path, dict]) -> None:
    runs, ids = three_runs
    with pytest.raises(UsageError, match="1 of them hold different tasks: q3"):
        regression_verdict(RunDir(runs / ids["a"]), RunDir(runs / ids["q3"]))
    regression, _ = regression_verdict(RunDir(runs / ids["a"]), RunDir(runs / ids["same"]))
    assert regression is False


def test_runs_older_than_per_task_hashes_are_checked_by_their_manifests_or_said_unchecked(
        three_runs: tuple[Path, dict], tmp_path: Path) -> None:
    source, ids = three_runs
    runs = tmp_path / "runs"
    for name in ("a", "same", "other"):
        folder = runs / ids[name]
        (folder).mkdir(parents=True)
        for file in ("manifest.json", "store.sqlite"):
            (folder / file).write_bytes((source / ids[name] / file).read_bytes())
        conn = sqlite3.connect(folder / "store.sqlite")
        conn.execute("DELETE FROM task_hashes")  # as an older agl left it: no per-task content recorded
        conn.commit()
        conn.close()
    refused = _compare(runs, ids["a"], ids["other"])
    assert refused.returncode == 2
    assert "ran the same task ids from different task files" in " ".join(refused.stderr.split())
    same = _compare(runs, ids["a"], ids["same"])
    assert same.returncode == 0, same.stderr
    manifest = json.loads((runs / ids["same"] / "manifest.json").read_text())
    manifest.pop("tasks_hash")
    (runs / ids["same"] / "manifest.json").write_text(json.dumps(manifest))
    unknown = _compare(runs, ids["a"], ids["same"])
    assert unknown.returncode == 0
    assert "records no per-task content (made by an older agl): agl cannot check" in " ".join(unknown.stderr.split())


# -- resuming after the task file changed ---------------------------------------------------------------------------


def _finished(run: Path) -> set[str]:
    if not (run / "store.sqlite").exists():
        return set()
    store = RunStore(run / "store.sqlite", read_only=True)
    try:
        return {r.task_id for r in store.rollouts(latest_only=True) if r.status.terminal}
    finally:
        store.close()


def _interrupted_run(folder: Path, task_list: list[dict[str, Any]], *args: str, finished: int, **spec: Any) -> Path:
    """Start `agl ARGS` on `task_list`, wait until the held task runs and `finished` others are done, then SIGINT
    it."""
    markers = folder / "markers"
    markers.mkdir()
    write_spec(folder, task_list, agent={"command": AGENT, "env": {"HOSTILE_MARKERS": str(markers)}},
               grader={"command": GRADER}, **{"concurrency": 2, **spec})
    agl = subprocess.Popen([*AGL, *args], cwd=folder, env=agl_env(), text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    runs = folder / ".agl" / "runs"
    wait_for(lambda: list(runs.glob("*/rollouts/*/started")), 60, "the held rollout to start")
    run = next(p for p in runs.iterdir() if (p / "manifest.json").is_file())
    wait_for(lambda: len(_finished(run)) >= finished, 60, "the other rollouts to finish")
    agl.send_signal(signal.SIGINT)
    _, err = agl.communicate(timeout=60)
    assert agl.returncode == 130, err
    return run


def test_resume_refuses_a_task_file_whose_tasks_changed_and_names_them(tmp_path: Path) -> None:
    go = tmp_path / "go"
    tasks = [*_tasks(n=4), {"id": "held", "behavior": "wait_for_go", "go": str(go), "answer": "1"}]
    run = _interrupted_run(tmp_path, tasks, "eval", "agl.yaml", "--json", "--no-report", finished=4)
    starts = len(list((tmp_path / "markers").iterdir()))
    go.touch()
    write_spec(tmp_path, [*_tasks({1, 2}, n=4), tasks[-1]], agent={"command": AGENT}, grader={"command": GRADER})
    refused = run_agl(["eval", "--resume", run.name, "--json"], cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    text = " ".join(refused.stderr.split())
    assert f"run {run.name}: 2 of its 5 tasks changed in {tmp_path / 'tasks.jsonl'} since it started: q1, q2" in text
    assert "resuming would mix answers to the old and the new tasks" in text and "Traceback" not in text
    assert len(list((tmp_path / "markers").iterdir())) == starts  # nothing ran

    write_spec(tmp_path, tasks, agent={"command": AGENT, "env": {"HOSTILE_MARKERS": str(tmp_path / "markers")}},
               grader={"command": GRADER})
    resumed = run_agl(["eval", "--resume", run.name, "--json", "--no-report"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["variants"][0]["n"] == 5


def test_a_study_resume_refuses_changed_tasks(tmp_path: Path) -> None:
    go = tmp_path / "go"
    tasks = [{**t, "split": "val"} for t in _tasks(n=2)]
    tasks += [{"id": "held", "split": "val", "behavior": "wait_for_go", "go": str(go), "answer": "1"}]
    tasks += [{**t, "id": f"t{i}", "split": "test"} for i, t in enumerate(_tasks(n=2))]
    study = {"tasks": {"split": {"field": "split"}}, "concurrency": 4,  # the two held rollouts leave two slots
             "knobs": {"flavour": {"values": ["a", "b"], "via": "env", "name": "FLAVOUR"}}}
    run = _interrupted_run(tmp_path, tasks, "optimize", "agl.yaml", "--json", "--quiet", finished=2, **study)
    go.touch()
    changed = [dict(t, question="something else") if t["id"] == "t1" else t for t in tasks]
    write_spec(tmp_path, changed, agent={"command": AGENT, "env": {"HOSTILE_MARKERS": str(tmp_path / "markers")}},
               grader={"command": GRADER}, **study)  # the same agent: only a task changed
    refused = run_agl(["optimize", "--resume", run.name, "--json"], cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "1 of its 5 tasks changed" in " ".join(refused.stderr.split()) and "since it started: t1" in refused.stderr


def test_the_result_cache_never_reuses_a_rollout_of_a_task_whose_content_changed(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    agent = {"command": AGENT, "env": {"HOSTILE_MARKERS": str(markers)}}
    write_spec(tmp_path, _tasks(n=4), agent=agent, grader={"command": GRADER})
    run_agl(["eval", "agl.yaml", "--json", "--no-report"], cwd=tmp_path, check=True)
    write_spec(tmp_path, _tasks({2}, n=4), agent=agent, grader={"command": GRADER})  # q2: same id, other question
    again = run_agl(["eval", "agl.yaml", "--json", "--no-report"], cwd=tmp_path, check=True)
    assert "reused 3 finished rollouts" in again.stderr
    starts = sorted(m.name.split(".")[0] for m in markers.iterdir())
    assert starts == ["q0", "q1", "q2", "q2", "q3"]  # only the changed task ran again
