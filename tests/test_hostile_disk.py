"""When the store or the disk says no: a store another process keeps locked, a disk (here: a file size limit) that
fills up mid-run, a runs folder on a read-only mount. Each ends in a clear error with what to do (no traceback), the
run marked interrupted, every finished rollout kept, and `--resume` finishing the run once the cause is gone; on
read-only media every reading command works."""

from __future__ import annotations

import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_backend.store.db import RunStore
from rl_backend.store.records import RolloutStatus
from tests.helpers import AGL, FIXTURES, agl_env, run_agl, wait_for, write_spec

# {python}, not `python`: run as `nobody` (see _read_only_runner), a PATH lookup may not see the interpreter.
AGENT = f"{{python}} {FIXTURES / 'hostile_agent.py'} {{task_file}} {{output_file}}"
GRADER = f"{{python}} {FIXTURES / 'hostile_grader.py'} {{task_file}} {{output_file}}"
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the checks read Linux's /proc")


def _terminal(run: Path) -> dict[str, str]:
    store = RunStore(run / "store.sqlite", read_only=True)
    try:
        return {r.task_id: r.id for r in store.rollouts(latest_only=True) if r.status.terminal}
    finally:
        store.close()


def _clear(stderr: str) -> str:
    assert "Traceback" not in stderr and "OperationalError" not in stderr, stderr
    return " ".join(stderr.split())


def _listed_status(folder: Path, run_id: str) -> str:
    listing = run_agl(["runs", "--json"], cwd=folder, check=True)
    return next(r["status"] for r in json.loads(listing.stdout)["runs"] if r["run_id"] == run_id)


def test_a_store_locked_by_another_process_stops_the_run_clearly_and_resume_finishes_it(tmp_path: Path) -> None:
    go = tmp_path / "go"
    tasks = [{"id": "fast", "answer": "1"}, {"id": "held", "behavior": "wait_for_go", "go": str(go), "answer": "1"}]
    write_spec(tmp_path, tasks, agent={"command": AGENT}, grader={"command": GRADER}, concurrency=2)
    agl = subprocess.Popen([*AGL, "eval", "agl.yaml", "--json", "--no-report"], cwd=tmp_path, text=True,
                           env=agl_env({"AGL_STORE_BUSY_TIMEOUT_S": "1"}),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    runs = tmp_path / ".agl" / "runs"
    wait_for(lambda: list(runs.glob("*/rollouts/*/started")), 60, "the held agent to start")
    run = next(runs.glob("*/store.sqlite")).parent
    wait_for(lambda: "fast" in _terminal(run), 60, "the fast rollout to finish")
    holder = sqlite3.connect(run / "store.sqlite", isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # what another program holding the store does
        go.touch()
        out, err = agl.communicate(timeout=120)
        status_while_held = _listed_status(tmp_path, run.name)
    finally:
        holder.close()
    assert agl.returncode == 1, err
    text = _clear(err)
    assert f"locked by process {os.getpid()}" in text and "waited 1 s" in text, text
    assert f"resume the run: agl eval --resume {run.name}" in text and "AGL_STORE_BUSY_TIMEOUT_S" in text, text
    assert out == ""
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"
    assert status_while_held == "interrupted"
    done = _terminal(run)
    assert set(done) == {"fast"}

    resumed = run_agl(["eval", "--resume", run.name, "--json", "--no-report"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 rollouts this run already finished are kept" in resumed.stderr
    after = _terminal(run)
    assert after["fast"] == done["fast"] and set(after) == {"fast", "held"}  # the finished one never ran again
    assert json.loads(resumed.stdout)["variants"][0]["n"] == 2


def _limit_file_size(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_full_disk_stops_the_run_clearly_keeps_what_finished_and_resume_finishes_it(tmp_path: Path) -> None:
    # A file size limit (ulimit -f) makes SQLite's writes fail exactly as a full disk does (EFBIG, as ENOSPC): the
    # store's WAL stops growing past it. Each rollout keeps 60 KiB of output in the store.
    tasks = [{"id": f"t{i:02d}", "behavior": "big_output", "kb": 60, "answer": "1"} for i in range(12)]
    write_spec(tmp_path, tasks, agent={"command": AGENT}, grader={"command": GRADER}, concurrency=2)
    full = subprocess.run([*AGL, "eval", "agl.yaml", "--json", "--no-report"], cwd=tmp_path, env=agl_env(),
                          capture_output=True, text=True, timeout=300, preexec_fn=lambda: _limit_file_size(400_000))
    assert full.returncode == 1, full.stderr
    text = _clear(full.stderr)
    run = next((tmp_path / ".agl" / "runs").glob("*/store.sqlite")).parent
    assert "a file size limit (ulimit -f: 400,000 bytes) stopped agl writing" in text, text
    assert "every rollout that finished is kept" in text and f"agl eval --resume {run.name}" in text, text
    assert _listed_status(tmp_path, run.name) == "interrupted"
    kept = _terminal(run)
    assert 0 < len(kept) < len(tasks), kept

    resumed = run_agl(["eval", "--resume", run.name, "--json", "--no-report"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    after = _terminal(run)
    assert {t: after[t] for t in kept} == kept and len(after) == len(tasks)  # nothing finished ran again
    store = RunStore(run / "store.sqlite", read_only=True)
    try:
        rollouts = store.rollouts(latest_only=True)
    finally:
        store.close()
    assert all(r.status is RolloutStatus.succeeded for r in rollouts)


# -- a runs folder on read-only media ------------------------------------------------------------------------------


def _read_only_runner() -> list[str] | None:
    """A command prefix under which the runs folder is read-only for real: a read-only bind mount in a mount
    namespace of its own (root, with unshare), else the same command as `nobody` over a folder made read-only by
    chmod (root without mounts), else nothing is needed beyond chmod (an ordinary user)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("unshare") and subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0:
        return None  # the mount form: see _on_read_only_media
    as_nobody = ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]
    probe = [*as_nobody, sys.executable, "-c", "import os, sys; os.stat(sys.executable)"]
    if shutil.which("setpriv") and subprocess.run(probe, capture_output=True).returncode == 0:
        return as_nobody
    pytest.skip("root, without mount namespaces, and `nobody` cannot run this Python: no honest read-only folder")


def _open_folder() -> Path:
    """A new folder anyone may read and enter (the `nobody` form runs agl there); pytest's own are private."""
    top = Path(tempfile.mkdtemp(prefix="agl-ro-"))
    top.chmod(0o755)
    return top


@pytest.fixture
def open_dir() -> Iterator[Path]:
    top = _open_folder()
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def archived() -> Iterator[tuple[Path, list[str]]]:
    """Two finished runs of one spec, in a folder anyone may read."""
    top = _open_folder()
    folder = top / "project"
    folder.mkdir()
    write_spec(folder, [{"id": f"t{i}", "answer": "1"} for i in range(3)], agent={"command": AGENT},
               grader={"command": GRADER})
    ids = []
    for _ in range(2):
        result = run_agl(["eval", "agl.yaml", "--json", "--no-report", "--no-cache"], cwd=folder, check=True)
        ids.append(json.loads(result.stdout)["run_id"])
    for path in [top, *top.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        yield folder, ids
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _on_read_only_media(folder: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """`agl ARGS` in `folder`, with `folder/.agl/runs` read-only (see _read_only_runner)."""
    runs = folder / ".agl" / "runs"
    prefix = _read_only_runner()
    command = [*AGL, *args]
    if prefix is None:
        script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@"'
        command = ["unshare", "-m", "sh", "-c", script, "sh", str(runs), *command]
    else:
        for path in [runs, *runs.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        command = [*prefix, *command]
    try:
        return subprocess.run(command, cwd=folder, env=agl_env(), capture_output=True, text=True, timeout=120)
    finally:
        for path in [runs, *runs.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def test_every_reading_command_works_on_read_only_media(archived: tuple[Path, list[str]], open_dir: Path) -> None:
    folder, (first, second) = archived
    out = open_dir / "out"
    out.mkdir()
    out.chmod(0o777)  # the `nobody` form writes the report here
    before = sorted(p.name for p in (folder / ".agl" / "runs" / first).iterdir())
    commands = [
        ["runs", "--json"], ["runs", first, "--json"], ["runs", first], ["transcript", first, "--json"],
        ["spend", "--json"], ["compare", f"{first}:baseline", f"{second}:baseline", "--json"],
        ["report", first, "--out", str(out), "--format", "md"],
    ]
    for args in commands:
        result = _on_read_only_media(folder, args)
        assert result.returncode == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)
    assert (out / "report.md").is_file()
    listing = json.loads(_on_read_only_media(folder, ["runs", first, "--json"]).stdout)
    assert [r["reward"] for r in listing["rollouts"]] == [1.0, 1.0, 1.0]
    assert json.loads(_on_read_only_media(folder, ["spend", "--json"]).stdout)["rollouts"] == 6
    assert sorted(p.name for p in (folder / ".agl" / "runs" / first).iterdir()) == before  # nothing left behind


def test_a_store_whose_rows_are_still_in_its_wal_is_read_whole_on_read_only_media(
        archived: tuple[Path, list[str]], open_dir: Path, tmp_path: Path) -> None:
    folder, (first, _) = archived
    copy = open_dir / "project"
    shutil.copytree(folder, copy)
    store = copy / ".agl" / "runs" / first / "store.sqlite"
    # A run archived while its writer was alive (or killed): its last rows live only in the WAL.
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA wal_autocheckpoint=0')\n"
        "c.execute(\"UPDATE rollouts SET reward = 0.25 WHERE task_id = 't0'\")\n"
        "print('written', flush=True)\n"
        "sys.stdin.read()\n"), str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "written"
        shutil.copyfile(store, tmp_path / "store.sqlite")
        shutil.copyfile(str(store) + "-wal", tmp_path / "store.sqlite-wal")
    finally:
        writer.kill()
        writer.wait()
    for suffix in ("", "-wal"):
        shutil.copyfile(tmp_path / ("store.sqlite" + suffix), str(store) + suffix)
    Path(str(store) + "-shm").unlink(missing_ok=True)
    for path in [open_dir, *open_dir.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    result = _on_read_only_media(copy, ["runs", first, "--json"])
    assert result.returncode == 0, result.stderr
    rewards = {r["task_id"]: r["reward"] for r in json.loads(result.stdout)["rollouts"]}
    assert rewards == {"t0": 0.25, "t1": 1.0, "t2": 1.0}


def test_eval_into_a_read_only_runs_folder_says_it_cannot_write(archived: tuple[Path, list[str]]) -> None:
    folder, (first, _) = archived
    for args in (["eval", "agl.yaml"], ["eval", "--resume", first]):
        result = _on_read_only_media(folder, args)
        assert result.returncode == 2, (args, result.stderr)
        text = _clear(result.stderr)
        assert "cannot" in text and str(folder / ".agl" / "runs") in text and "writable" in text, (args, text)
        assert "Read-only file system" in text or "Permission denied" in text, (args, text)
