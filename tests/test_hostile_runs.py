"""Kills, concurrent resumes and agents that misbehave with their processes: nothing runs twice, nothing outlives
agl, and an agent's exit ends its rollout whatever it left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agl_cli.main import app
from rl_backend.store.db import RunStore, StoreError
from rl_backend.store.records import Rollout, RolloutStatus
from rl_backend.store.runlock import RunLock, lock_holder
from tests.helpers import FIXTURES, agl_env, run_agl, wait_for, write_spec
from tests.helpers import process_alive as _alive

AGENT = f"python {FIXTURES / 'hostile_agent.py'} {{task_file}} {{output_file}}"
GRADER = f"python {FIXTURES / 'hostile_grader.py'} {{task_file}} {{output_file}}"
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process checks read Linux's /proc")


def _start_agl(folder: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "agl_cli", *args], cwd=folder, env=agl_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _only_run(folder: Path) -> Path:
    runs = [p for p in (folder / ".agl" / "runs").glob("*") if (p / "manifest.json").is_file()]
    assert len(runs) == 1, runs
    return runs[0]


def _started(folder: Path) -> bool:
    return any((p / "manifest.json").is_file() for p in (folder / ".agl" / "runs").glob("*"))


def _finished(run: Path) -> int:
    if not (run / "store.sqlite").exists():
        return 0
    store = RunStore(run / "store.sqlite")
    try:
        return sum(1 for r in store.rollouts() if r.status.terminal)
    finally:
        store.close()


def _kill_9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()


def test_agent_exit_ends_the_rollout_even_with_children_holding_its_stdout(tmp_path: Path) -> None:
    tasks = [{"id": "bg", "behavior": "background_child", "answer": "42"}]
    write_spec(tmp_path, tasks, agent={"command": AGENT, "timeout_s": 60}, grader={"command": GRADER})
    result = run_agl(["eval", "agl.yaml", "--json", "--no-report"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = Path(json.loads(result.stdout)["run_dir"])
    (rollout,) = RunStore(run / "store.sqlite").rollouts()
    assert rollout.status is RolloutStatus.succeeded and rollout.reward == 1.0, rollout.error
    assert rollout.duration_s is not None and rollout.duration_s < 30, "it waited for the children, not the agent"
    assert "done, children keep running" in (rollout.stdout_tail or "")
    pids = json.loads((run / "rollouts" / rollout.id / "pids.json").read_text())
    wait_for(lambda: not _alive(pids["child"]) and not _alive(pids["grandchild"]), 5, "the children to be ended")


def test_a_child_in_a_group_of_its_own_with_a_scrubbed_environment_ends_with_its_agent(tmp_path: Path) -> None:
    tasks = [{"id": "pg", "behavior": "scrubbed_child", "answer": "42"}]
    write_spec(tmp_path, tasks, agent={"command": AGENT, "timeout_s": 60}, grader={"command": GRADER})
    result = run_agl(["eval", "agl.yaml", "--json", "--no-report"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Event loop is closed" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    run = Path(json.loads(result.stdout)["run_dir"])
    (rollout,) = RunStore(run / "store.sqlite").rollouts()
    # The child sleeps 300 s: a rollout that waited for it would take minutes; 30 s leaves room for a loaded machine.
    assert rollout.reward == 1.0 and rollout.duration_s is not None and rollout.duration_s < 30, rollout
    pids = json.loads((run / "rollouts" / rollout.id / "pids.json").read_text())
    assert not _alive(pids["child"]), "the child outlived agl"  # ended before agl exited: no waiting here


def test_a_child_that_escapes_every_tracking_leaves_no_event_loop_error(tmp_path: Path) -> None:
    """A child in a session of its own with a scrubbed environment is beyond what agl can find without cgroups; it
    still must not make agl print asyncio's `Event loop is closed` when it exits."""
    tasks = [{"id": "gone", "behavior": "scrubbed_child", "escape": True, "answer": "42"}]
    write_spec(tmp_path, tasks, agent={"command": AGENT, "timeout_s": 60}, grader={"command": GRADER})
    result = run_agl(["eval", "agl.yaml", "--json", "--no-report"], cwd=tmp_path)
    run = Path(json.loads(result.stdout)["run_dir"])
    child = json.loads(next(run.glob("rollouts/*/pids.json")).read_text())["child"]
    if _alive(child):
        os.kill(child, signal.SIGKILL)
    assert result.returncode == 0, result.stderr
    assert "Event loop is closed" not in result.stderr and "Traceback" not in result.stderr, result.stderr


def _hang_first(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, list[dict[str, int]]]:
    """An eval whose two agents (each with a child and a setsid grandchild) hang on their first attempt."""
    tasks = [{"id": f"t{i}", "behavior": "hang_first_attempt", "answer": "ok"} for i in range(2)]
    write_spec(tmp_path, tasks, agent={"command": AGENT, "timeout_s": 120}, grader={"command": GRADER}, concurrency=2)
    proc = _start_agl(tmp_path, "eval", "agl.yaml", "--json")
    wait_for(lambda: len(list((tmp_path / ".agl" / "runs").glob("*/rollouts/*-1/pids.json"))) == 2, 60,
              "both agents to start their children")
    run = _only_run(tmp_path)
    families = [json.loads(p.read_text()) for p in sorted(run.glob("rollouts/*-1/pids.json"))]
    return proc, run, families


def _watchdog_of(pid: int) -> int:
    found = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
             and b"rl_backend.rollout.reaper" in _read(p / "cmdline") and f"PPid:\t{pid}\n" in _read(p / "status").decode()]
    assert len(found) == 1, found
    return found[0]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_nothing_an_agent_started_outlives_a_killed_agl(tmp_path: Path) -> None:
    proc, run, families = _hang_first(tmp_path)
    _kill_9(proc)
    everything = [pid for family in families for pid in family.values()]
    wait_for(lambda: not any(_alive(pid) for pid in everything), 10, "the agents and all they started to end")


def test_resume_ends_what_a_killed_agl_left_running(tmp_path: Path) -> None:
    proc, run, families = _hang_first(tmp_path)
    store = RunStore(run / "store.sqlite")
    wait_for(lambda: len(store.agent_processes()) == 2, 10, "each running agent to be on record")
    os.kill(_watchdog_of(proc.pid), signal.SIGKILL)  # as if the watchdog had been killed too
    _kill_9(proc)
    # The kernel ends each agent (its parent-death signal); what the agents started is left for the resume.
    wait_for(lambda: not any(_alive(f["agent"]) for f in families), 5, "the agents to die with agl")
    assert all(_alive(f["child"]) and _alive(f["grandchild"]) for f in families)

    result = run_agl(["eval", "--resume", run.name, "--json", "--no-report"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "that an earlier, killed agl left running" in result.stderr
    for family in families:
        assert not _alive(family["child"]) and not _alive(family["grandchild"])
    latest = store.rollouts(latest_only=True)
    assert [r.status for r in latest] == [RolloutStatus.succeeded] * 2 and all(r.attempt == 2 for r in latest)
    for rollout in latest:  # attempt 2 saw nothing of attempt 1 still running when it started
        assert json.loads((run / "rollouts" / rollout.id / "overlap.json").read_text()) == []
    assert store.agent_processes() == []


def test_two_resumes_of_one_eval_run_the_rest_once(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    tasks = [{"id": f"t{i:02d}", "answer": "ok", "behavior": "slow"} for i in range(10)]
    behave = f"python {FIXTURES / 'behave_agent.py'} {{task_file}} {{output_file}}"
    write_spec(tmp_path, [{**t, "sleep": 0.4} for t in tasks], concurrency=2,
               agent={"command": behave, "env": {"BEHAVE_MARKERS": str(markers)}})
    first = _start_agl(tmp_path, "eval", "agl.yaml", "--json")
    wait_for(lambda: _started(tmp_path) and _finished(_only_run(tmp_path)) >= 2, 60,
              "the first rollouts to finish")
    run = _only_run(tmp_path)
    _kill_9(first)
    done_before = {r.task_id for r in RunStore(run / "store.sqlite").rollouts() if r.status.terminal}

    resume_a = _start_agl(tmp_path, "eval", "--resume", run.name, "--json", "--no-report")
    wait_for(lambda: lock_holder(run) == resume_a.pid, 30, "the first resume to hold the run")
    resume_b = run_agl(["eval", "--resume", run.name, "--json", "--no-report"], cwd=tmp_path)
    assert resume_b.returncode == 2, resume_b.stderr
    text = " ".join(resume_b.stderr.split())
    assert f"is in use by process {resume_a.pid}" in text and "agl eval --resume" in text
    assert resume_b.stdout == ""
    out, err = resume_a.communicate(timeout=120)
    assert resume_a.returncode == 0, err

    starts = Counter(m.name.split(".")[0] for m in markers.iterdir())
    assert all(starts[t] == 1 for t in done_before), starts  # finished before the kill: never again
    assert all(n <= 2 for n in starts.values()), starts  # in flight at the kill: once more, and only once
    rollouts = RunStore(run / "store.sqlite").rollouts()
    succeeded = Counter(r.task_id for r in rollouts if r.status is RolloutStatus.succeeded)
    assert succeeded == Counter({t["id"]: 1 for t in tasks}), succeeded
    assert json.loads(out)["variants"][0]["n"] == 10
    assert lock_holder(run) is None  # released when the resume ended


def test_two_resumes_of_one_study_run_the_rest_once(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    tasks = [{"id": f"v{i}", "split": "val", "answer": "ok", "behavior": "slow", "sleep": 1.0} for i in range(4)]
    tasks += [{"id": f"t{i}", "split": "test", "answer": "ok", "behavior": "slow", "sleep": 1.0} for i in range(4)]
    behave = f"python {FIXTURES / 'behave_agent.py'} {{task_file}} {{output_file}}"
    write_spec(tmp_path, tasks, concurrency=2, tasks={"split": {"field": "split"}},
               agent={"command": behave, "env": {"BEHAVE_MARKERS": str(markers)}},
               knobs={"flavour": {"values": ["plain", "spicy"], "via": "env", "name": "FLAVOUR"}})
    study = _start_agl(tmp_path, "optimize", "agl.yaml", "--json", "--quiet")
    wait_for(lambda: _started(tmp_path) and lock_holder(_only_run(tmp_path)) == study.pid, 60,
              "the study to start")
    run = _only_run(tmp_path)
    second = run_agl(["optimize", "--resume", run.name, "--json"], cwd=tmp_path)
    assert second.returncode == 2 and f"is in use by process {study.pid}" in " ".join(second.stderr.split())
    _, err = study.communicate(timeout=180)
    assert study.returncode == 0, err
    starts = Counter(m.name.split(".")[0] for m in markers.iterdir())
    rollouts = RunStore(run / "store.sqlite").rollouts()
    assert len(rollouts) == sum(starts.values())  # every start is one recorded rollout: none ran twice
    assert all(r.attempt == 1 for r in rollouts)


def test_a_second_train_on_a_held_run_is_refused(tmp_path: Path) -> None:
    write_spec(tmp_path, [{"id": "a", "split": "train"}, {"id": "b", "split": "val"}],
               tasks={"split": {"field": "split"}})
    run = tmp_path / "runs" / "20250101-000000-abcd"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"kind": "train", "spec_path": str(tmp_path / "agl.yaml"),
                                                   "options": {}, "status": "running"}))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom rl_backend.store.runlock import RunLock\n"
                               "RunLock(sys.argv[1]).acquire(command='agl train agl.yaml')\nprint('held', flush=True)\n"
                               "time.sleep(60)", str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        result = CliRunner().invoke(app, ["train", "--resume", str(run)])
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert f"is in use by process {holder.pid} (agl train agl.yaml)" in text and f"kill {holder.pid}" in text
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    assert lock_holder(run) is None  # the kernel released the lock with its holder


def test_mark_interrupted_never_touches_a_live_holders_rows(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store.sqlite")
    store.put_rollout(Rollout(id="r1", key="k", variant="v", task_id="t", status=RolloutStatus.running))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom rl_backend.store.runlock import RunLock\n"
                               "RunLock(sys.argv[1]).acquire()\nprint('held', flush=True)\ntime.sleep(60)",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreError, match=f"held by process {holder.pid}"):
            store.mark_interrupted()
        assert store.get_rollout("r1").status is RolloutStatus.running  # type: ignore[union-attr]
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    assert store.mark_interrupted() == 1  # its holder is gone: the row was left by a dead process
    with RunLock(tmp_path):  # this process's own lock does not stop it
        store.put_rollout(Rollout(id="r2", key="k2", variant="v", task_id="t", status=RolloutStatus.running))
        assert store.mark_interrupted() == 1


@pytest.mark.parametrize("command", ["eval", "optimize"])
def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path: Path, command: str) -> None:
    """A supervisor's SIGTERM: the run is marked interrupted, the resume command printed, exit 143; resume ends it."""
    go = tmp_path / "go"
    tasks = [{"id": "v0", "split": "val", "answer": "1"},
             {"id": "held", "split": "val", "behavior": "wait_for_go", "go": str(go), "answer": "1"},
             {"id": "t0", "split": "test", "answer": "1"}]
    write_spec(tmp_path, tasks, agent={"command": AGENT}, grader={"command": GRADER}, concurrency=4,
               tasks={"split": {"field": "split"}},
               knobs={"flavour": {"values": ["a", "b"], "via": "env", "name": "FLAVOUR"}})
    proc = _start_agl(tmp_path, command, "agl.yaml", "--json", "--quiet")
    wait_for(lambda: list((tmp_path / ".agl" / "runs").glob("*/rollouts/*/started")), 60, "the held agent to start")
    run = _only_run(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert f"agl {command} --resume {run.name}" in " ".join(err.split()) and "Traceback" not in err, err
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"
    go.touch()
    resumed = run_agl([command, "--resume", run.name, "--json", "--no-report" if command == "eval" else "--quiet"],
                      cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr


CANCEL_DURING_START = '''
import asyncio, gc, os, sys
from pathlib import Path
from rl_backend.rollout.base import RolloutJob
from rl_backend.rollout.local import LocalController

async def main(turns: int) -> None:
    controller = LocalController()
    job = RolloutJob(rollout_id="r", command=sys.argv[1], env=dict(os.environ), cwd=Path.cwd(), rollout_dir=Path.cwd(),
                     timeout_s=60)
    task = asyncio.create_task(controller.run(job))
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()  # again, as a run's clean-up cancels every rollout it has
    try:
        await task
    except asyncio.CancelledError:
        pass
    await controller.close()

for turns in range(8):
    asyncio.run(main(turns))
    gc.collect()
'''


def test_a_rollout_cancelled_as_its_process_starts_leaves_nothing_behind(tmp_path: Path) -> None:
    """Ctrl-C or SIGTERM can land while a grader or agent is being started: the process is ended, and nothing is
    printed when the loop is gone (no "Event loop is closed", no unretrieved exceptions)."""
    marker = f"{os.getpid() % 1000}.{time.time_ns() % 10**6}"
    script = tmp_path / "cancel.py"
    script.write_text(CANCEL_DURING_START)
    done = subprocess.run([sys.executable, str(script), f"sleep 7{marker}"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    left = subprocess.run(["pgrep", "-f", f"sleep 7{marker}"], capture_output=True, text=True)
    assert left.stdout == "", f"processes left running: {left.stdout}"
