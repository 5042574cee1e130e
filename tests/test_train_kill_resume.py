"""`agl train` killed with SIGKILL mid-run, then `agl train --resume RUN`: it continues from the last checkpoint, no
step is recorded or trained twice, the step count goes on, the before/after comparison completes, the store is sound.

The model is a tiny random Llama with SmolLM2's tokenizer (so the embedded server, the gateway and the trainer run
their real code in seconds); the agent makes one call and is graded on the parity of its reply.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import agl_env, run_agl
from tests.helpers.models import write_tiny_train_spec

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

STEPS = 3


def _wait_for(predicate: object, timeout_s: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if proc.poll() is not None:
            raise AssertionError(f"agl train exited early ({proc.returncode}): {proc.stderr.read()[-3000:]}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)


@pytest.mark.parametrize("loop", ["sync", "collocated-async"])
def test_sigkill_mid_training_then_resume(tmp_path: Path, loop: str, tiny_chat_model: Path) -> None:
    spec = write_tiny_train_spec(tmp_path, tiny_chat_model)
    runs = tmp_path / "runs"
    args = [sys.executable, "-m", "agl_cli", "train", str(spec), "--steps", str(STEPS), "--tasks-per-step", "2",
            "--group-size", "2", "--heldout-limit", "2", "--lr", "1e-3", "--loop", loop, "--runs-dir", str(runs),
            "--json"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=agl_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _wait_for(lambda: any(runs.glob("*/checkpoints/step-*/trainer_state.json")), 240, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # mid-run: its next batch, a checkpoint or a row may be half done
        proc.wait(30)
    (run_dir,) = runs.iterdir()
    killed_at = max(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*")
                    if p.name.split("-")[1].isdigit())

    resumed = run_agl(["train", "--resume", run_dir.name, "--runs-dir", str(runs), "--json"], cwd=tmp_path,
                      timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from checkpoint step-" in resumed.stderr
    doc = json.loads(resumed.stdout)

    updated = [s for s in doc["steps"] if s["updated"]]
    assert [s["step"] for s in updated] == list(range(1, STEPS + 1)), [s["step"] for s in doc["steps"]]
    assert killed_at <= STEPS
    trained = [rid for s in doc["steps"] for rid in s["metrics"]["rollout_ids"]]
    assert len(trained) == len(set(trained)), "a rollout was trained twice"
    assert doc["comparison"] is not None and doc["comparison"]["n_tasks"] == 2
    assert doc["trained_model"] and (Path(doc["trained_model"]) / "config.json").is_file()

    with sqlite3.connect(run_dir / "store.sqlite") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        statuses = dict(conn.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status").fetchall())
        rows = conn.execute("SELECT step FROM train_steps WHERE updated = 1 ORDER BY seq").fetchall()
    assert "running" not in statuses and "queued" not in statuses, statuses
    assert [r[0] for r in rows] == list(range(1, STEPS + 1))
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "completed"
