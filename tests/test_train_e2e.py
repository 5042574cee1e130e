"""`agl train` end to end on SmolLM2-135M-Instruct: the unchanged calc agent, through the gateway, a real update,
new weights served, the before/after comparison, and a resumed run that continues from its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rl_backend.store.db import RunStore
from rl_backend.trainer.curves import read_curve
from tests.conftest import REPO, run_agl

pytestmark = [pytest.mark.model, pytest.mark.slow]
CALC = REPO / "examples" / "calc"


def _spec(folder: Path) -> Path:
    spec = {
        "name": "calc-train-test",
        "agent": {"command": f"python {CALC / 'agent.py'} --task {{task_file}} --out {{output_file}}", "timeout_s": 600,
                  "env": {"AGENT_MAX_TURNS": "2"}},
        "tasks": {"path": str(CALC / "tasks.jsonl"), "split": {"field": "split"}},
        "grader": {"command": f"python {CALC / 'grade.py'} {{task_file}} {{output_file}}"},
        "upstreams": {"local": {"kind": "embedded", "model": "smollm2-135m-instruct"}},
        "model": "local/smollm2-135m-instruct",
        "concurrency": 4,
    }
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_train_one_step_then_resume_for_another(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    args = ["train", str(spec), "--steps", "1", "--tasks-per-step", "2", "--group-size", "2", "--heldout-limit", "2",
            "--lr", "1e-5", "--runs-dir", str(tmp_path / "runs"), "--json"]
    first = run_agl(args, cwd=tmp_path, timeout=1500)
    assert first.returncode == 0, first.stderr[-3000:]
    doc = json.loads(first.stdout)
    (step,) = doc["steps"]
    assert step["rollouts"] == 4 and step["model_version"] == "step-1"
    assert step["updated"], step["metrics"].get("skipped")
    trained = Path(doc["trained_model"])
    assert (trained / "config.json").is_file() and list(trained.glob("*.safetensors"))
    assert doc["model_knob"]["value"] == "trained/trained-model"
    assert doc["comparison"]["n_tasks"] == 2 and doc["comparison"]["verdict"] in (
        "better", "worse", "no detectable difference")
    run_dir = tmp_path / "runs" / doc["run_id"]
    store = RunStore(run_dir / "store.sqlite")
    by_variant: dict[str, list] = {}
    for rollout in store.rollouts(latest_only=True):
        by_variant.setdefault(rollout.variant, []).append(rollout)
    assert {k: len(v) for k, v in by_variant.items()} == {"before": 2, "train": 4, "after-step-1": 2}
    # Calls of the held-out run after training were served by the trained weights.
    versions = {c.model_version for r in by_variant["after-step-1"] for c in store.calls(r.id)}
    assert versions == {"step-1"}
    assert {c.model_version for r in by_variant["before"] for c in store.calls(r.id)} == {"base"}
    store.close()
    assert (run_dir / "report" / "report.html").is_file()

    resumed = run_agl(["train", "--resume", doc["run_id"], "--steps", "2", "--runs-dir", str(tmp_path / "runs"),
                       "--json"], cwd=tmp_path, timeout=1500)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from checkpoint step-1" in resumed.stderr
    store = RunStore(run_dir / "store.sqlite")
    curve = read_curve(store)
    assert [c.step for c in curve] == [1, 2]
    before_ids = sorted(r.id for r in store.rollouts() if r.variant == "before")
    assert len(before_ids) == 2  # the held-out baseline was not run again
    after = {c.model_version for r in store.rollouts() if r.variant == "after-step-2" for c in store.calls(r.id)}
    assert after == {"step-2"}  # ...but the model trained further was measured anew
    store.close()
