"""`agl train` end to end. On SmolLM2-135M-Instruct (the one training test on the real model): the unchanged calc
agent through the gateway, a real update with a learning signal, new weights served, the before/after comparison.
On the tiny random model (same code, seconds per step): a finished run resumed for another step continues from its
checkpoint without measuring the baseline again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rl_backend.store.db import RunStore
from rl_backend.trainer.curves import read_curve
from tests.helpers import REPO, run_agl
from tests.helpers.models import write_tiny_train_spec

CALC = REPO / "examples" / "calc"


def _calc_spec(folder: Path) -> Path:
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


def _by_variant(store: RunStore) -> dict[str, list]:
    out: dict[str, list] = {}
    for rollout in store.rollouts(latest_only=True):
        out.setdefault(rollout.variant, []).append(rollout)
    return out


@pytest.mark.usefixtures("smollm2")
@pytest.mark.slow
def test_train_one_step_of_smollm2_through_the_calc_agent(tmp_path: Path) -> None:
    spec = _calc_spec(tmp_path)
    args = ["train", str(spec), "--steps", "1", "--tasks-per-step", "2", "--group-size", "2", "--heldout-limit", "2",
            "--lr", "1e-5", "--runs-dir", str(tmp_path / "runs"), "--json"]
    first = run_agl(args, cwd=tmp_path, timeout=1500)
    assert first.returncode == 0, first.stderr[-3000:]
    doc = json.loads(first.stdout)
    (step,) = doc["steps"]
    assert step["rollouts"] == 4 and step["model_version"] == "step-1"
    assert step["updated"], step["metrics"].get("skipped")
    # The server's logprobs are the trainer's own (float32 on both sides): the first update starts on-policy.
    assert step["metrics"]["train"]["logprob_abs_diff"] < 1e-3
    trained = Path(doc["trained_model"])
    assert (trained / "config.json").is_file() and list(trained.glob("*.safetensors"))
    assert doc["model_knob"]["value"] == "trained/trained-model"
    assert doc["comparison"]["n_tasks"] == 2 and doc["comparison"]["verdict"] in (
        "better", "worse", "no detectable difference")
    run_dir = tmp_path / "runs" / doc["run_id"]
    store = RunStore(run_dir / "store.sqlite")
    by_variant = _by_variant(store)
    assert {k: len(v) for k, v in by_variant.items()} == {"before": 2, "train": 4, "after-step-1": 2}
    # Calls of the held-out run after training were served by the trained weights.
    assert {c.model_version for r in by_variant["after-step-1"] for c in store.calls(r.id)} == {"step-1"}
    assert {c.model_version for r in by_variant["before"] for c in store.calls(r.id)} == {"base"}
    store.close()
    assert (run_dir / "report" / "report.html").is_file()


@pytest.mark.slow
def test_a_finished_run_resumed_for_another_step(tmp_path: Path, tiny_chat_model: Path) -> None:
    spec = write_tiny_train_spec(tmp_path, tiny_chat_model)
    runs = str(tmp_path / "runs")
    args = ["train", str(spec), "--steps", "1", "--tasks-per-step", "2", "--group-size", "2", "--heldout-limit", "2",
            "--lr", "1e-3", "--runs-dir", runs, "--json"]
    first = run_agl(args, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    doc = json.loads(first.stdout)
    assert [s["step"] for s in doc["steps"] if s["updated"]] == [1]
    resumed = run_agl(["train", "--resume", doc["run_id"], "--steps", "2", "--runs-dir", runs, "--json"], cwd=tmp_path,
                      timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from checkpoint step-1" in resumed.stderr
    store = RunStore(Path(runs) / doc["run_id"] / "store.sqlite")
    assert [c.step for c in read_curve(store)] == [1, 2]
    assert len([r for r in store.rollouts() if r.variant == "before"]) == 2  # the baseline was not measured again
    after = {c.model_version for r in store.rollouts() if r.variant == "after-step-2" for c in store.calls(r.id)}
    assert after == {"step-2"}  # ...but the model trained further was measured anew
    store.close()
