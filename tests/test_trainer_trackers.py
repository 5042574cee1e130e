"""`agl train --track`: the toy loop's step curves reach TensorBoard and W&B (offline), read back from what each
wrote; a tracker whose package is missing is a usage error naming the pip install. No network."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import invoke_agl

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("verl") is None:  # found, not imported: importing verl configures logging
    pytest.skip("verl is not installed", allow_module_level=True)

from rl_backend.store.db import RunStore  # noqa: E402
from rl_backend.trainer.loop import LoopConfig, TrainingLoop  # noqa: E402
from rl_backend.trainer.torch_backend import TorchTrainer, TrainerConfig  # noqa: E402
from rl_backend.trainer.toy import make_tasks, stored_batches, tiny_llama  # noqa: E402
from rl_backend.trainer.trackers import PACKAGES, TrackerError, open_trackers, parse_trackers  # noqa: E402

CURVES = ("reward", "pass_rate", "entropy", "tokens_per_s", "rollouts_per_min", "staleness_mean", "staleness_max")


def _train_toy(tmp_path: Path, names: list[str]) -> list[dict[str, float]]:
    """Three sync updates of the toy task with the trackers logging each step; returns what was logged."""
    torch.set_num_threads(2)
    store = RunStore(tmp_path / "store.sqlite")
    trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=5e-3))
    tasks = make_tasks()

    run_batch = stored_batches(store, trainer, tasks, 4)

    trackers = open_trackers(names, run_dir=tmp_path / "run", run_id="toyrun1", name="toy-toyrun1",
                             config={"lr": 5e-3, "loop": "sync"})
    logged: list[dict[str, float]] = []

    def on_step(record: object) -> None:
        trackers.log(record)  # type: ignore[arg-type]
        from rl_backend.trainer.trackers import step_values

        logged.append({"step": record.step, **step_values(record)})  # type: ignore[attr-defined]

    TrainingLoop(store, trainer, run_batch, on_step=on_step, config=LoopConfig(iterations=3, pass_threshold=0.5)).run()
    trackers.close()
    store.close()
    return logged


def test_tensorboard_event_files_hold_every_step(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = _train_toy(tmp_path, ["tensorboard"])
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {f"train/{c}" for c in CURVES} <= tags
    for curve in CURVES:
        events = acc.Scalars(f"train/{curve}")
        assert [e.step for e in events] == [1, 2, 3]
        assert [e.value for e in events] == pytest.approx([row[curve] for row in logged], rel=1e-5)


def test_wandb_offline_run_holds_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "agl-test")
    logged = _train_toy(tmp_path, ["wandb"])
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*-toyrun1")
    out = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(run_dir)],
                         capture_output=True, text=True, timeout=120, check=True)
    history = [json.loads(line)["history"] for line in out.stdout.splitlines()
               if line.startswith("{") and json.loads(line).get("type") == "history"]
    assert [int(h["step"]["num"]) for h in history] == [1, 2, 3]
    for row, h in zip(logged, history, strict=True):
        for curve in CURVES:
            assert h["item"][f"train/{curve}"] == pytest.approx(row[curve], rel=1e-6)


def test_unknown_or_missing_tracker_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(TrackerError, match="unknown tracker"):
        parse_trackers("tensorboard,comet")
    assert parse_trackers(" tensorboard , wandb,tensorboard") == ["tensorboard", "wandb"]
    result = invoke_agl(["train", str(tmp_path / "agl.yaml"), "--track", "comet"], cwd=tmp_path)
    assert result.returncode == 2 and "use any of tensorboard, wandb, mlflow" in result.stderr
    if importlib.util.find_spec(PACKAGES["mlflow"][0]) is None:
        result = invoke_agl(["train", str(tmp_path / "agl.yaml"), "--track", "mlflow"], cwd=tmp_path)
        assert result.returncode == 2 and "pip install mlflow" in result.stderr, result.stderr
