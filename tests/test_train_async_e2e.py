"""`agl train --loop collocated-async` end to end on the tiny random model through a real agent process: rollouts
keep running while the model trains, the gateway holds calls during each update, the new weights are served, the
staleness bound holds, and the run ends with the before/after comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_backend.store.db import RunStore
from rl_backend.trainer.async_loop import rollout_staleness
from tests.helpers import run_agl
from tests.helpers.models import write_tiny_train_spec

pytestmark = pytest.mark.slow


def test_collocated_async_two_steps(tmp_path: Path, tiny_chat_model: Path) -> None:
    spec = write_tiny_train_spec(tmp_path, tiny_chat_model)
    args = ["train", str(spec), "--loop", "collocated-async", "--max-staleness", "1", "--steps", "2",
            "--tasks-per-step", "2", "--group-size", "2", "--heldout-limit", "2", "--lr", "1e-3",
            "--runs-dir", str(tmp_path / "runs"), "--json"]
    result = run_agl(args, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    steps = [s for s in doc["steps"] if s["updated"]]
    assert [s["step"] for s in steps] == [1, 2], doc["steps"][-1]["metrics"]
    store = RunStore(Path(doc["run_dir"]) / "store.sqlite")
    for s in steps:
        m = s["metrics"]
        assert m["loop"] == "collocated-async" and len(m["groups"]) == 2
        assert m["pause"]["drained"] and m["resume"]["paused_s"] > 0
        assert s["staleness_max"] is not None and s["staleness_max"] <= 1
        assert all((rollout_staleness(store, rid, s["step"] - 1) or 0) <= 1 for rid in m["rollout_ids"])
        assert m["wall_s"] > 0
    trained = [rid for s in doc["steps"] for rid in s["metrics"]["rollout_ids"]]
    assert len(trained) == len(set(trained))
    after = {c.model_version for r in store.rollouts() if r.variant == "after-step-2" for c in store.calls(r.id)}
    assert after == {"step-2"}
    store.close()
    assert doc["comparison"]["n_tasks"] == 2
    rows = [json.loads(line) for line in (Path(doc["run_dir"]) / "train_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["updated"]] == [1, 2]
    assert all("staleness_max" in r and "wall_s" in r for r in rows)
