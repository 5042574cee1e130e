"""The sync loop on the toy task: store in, updates, weights to the engine, curves and checkpoints out, resume."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("verl") is None:  # found, not imported: importing verl configures logging
    pytest.skip("verl is not installed", allow_module_level=True)

from rl_backend.store.db import RunStore  # noqa: E402
from rl_backend.store.records import FailureKind, Rollout, RolloutStatus  # noqa: E402
from rl_backend.trainer.curves import read_curve  # noqa: E402
from rl_backend.trainer.loop import LoopConfig, TrainingLoop, latest_checkpoint  # noqa: E402
from rl_backend.trainer.torch_backend import TorchTrainer, TrainerConfig  # noqa: E402
from rl_backend.trainer.toy import make_tasks, run_rollouts, tiny_llama  # noqa: E402

pytestmark = pytest.mark.usefixtures("two_torch_threads")


class FakeEngine:
    """Stands in for rl_backend.serving.engine.Engine: a model it samples from and swaps weights of."""

    def __init__(self) -> None:
        self.model = tiny_llama().eval()
        self.model_version = "base"
        self.swaps: list[str] = []

    def load_state_dict(self, state_dict: Mapping[str, Any], version: str, timeout_s: float | None = None) -> None:
        self.model.load_state_dict(dict(state_dict), strict=True)
        self.model_version = version
        self.swaps.append(version)


def open_store(path: Path) -> RunStore:
    store = RunStore(path)
    assert read_curve(store) == []  # the store's own migrations create the curves table
    return store


def batch_runner(store: RunStore, engine: FakeEngine, *, broken: bool = False) -> Any:
    tasks = make_tasks()

    def run_batch(iteration: int) -> list[str]:
        toy = run_rollouts(engine.model, tasks, 4, step=iteration, version=engine.model_version,
                           id_prefix=f"{engine.model_version}-")
        for r in toy.rollouts:
            if broken:
                r.reward, r.status, r.failure = None, RolloutStatus.failed, FailureKind.agent_crashed
            store.put_rollout(r)
            store.insert_calls(toy.calls[r.id])
        lost = Rollout(id=f"lost-{engine.model_version}", key="toy/x/0", variant="toy", task_id="x",
                       status=RolloutStatus.timed_out, failure=FailureKind.agent_timeout)
        store.put_rollout(lost)
        return [r.id for r in toy.rollouts] + [lost.id]

    return run_batch


def test_sync_loop_trains_serves_records_and_resumes(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store.sqlite")
    engine = FakeEngine()
    trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=5e-3))
    ckpt = tmp_path / "ckpt"
    loop = TrainingLoop(store, trainer, batch_runner(store, engine), engine=engine,
                        config=LoopConfig(iterations=3, checkpoint_dir=ckpt, keep_checkpoints=2, pass_threshold=0.5))
    records = loop.run()
    assert [r.step for r in records] == [1, 2, 3] and all(r.updated for r in records)
    assert engine.swaps == ["step-1", "step-2", "step-3"]
    assert all(r.staleness_max == 0 for r in records)  # every call was sampled by the weights being trained
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-2", "step-3"]
    first = records[0]
    assert first.rollouts == 9 and first.trained_rollouts == 8
    assert first.metrics["trajectories"]["dropped"] == {"no_reward": 1}
    assert first.metrics["rewards_missing"] == 1
    assert first.entropy is not None and first.tokens_per_s and first.rollouts_per_min
    assert first.pass_rate is not None and 0.0 <= first.pass_rate <= 1.0

    curve = read_curve(store)
    assert [(c.step, c.model_version) for c in curve] == [(1, "step-1"), (2, "step-2"), (3, "step-3")]
    assert curve[2].checkpoint == str(ckpt / "step-3")
    assert curve[0].metrics["timings"]["train_s"] > 0

    # resume in a "new process": a fresh engine serving the base weights gets the checkpoint's first
    latest = latest_checkpoint(ckpt)
    assert latest is not None and latest.name == "step-3"
    engine2 = FakeEngine()
    loop2 = TrainingLoop(store, TorchTrainer.from_checkpoint(latest), batch_runner(store, engine2), engine=engine2,
                         config=LoopConfig(iterations=1, checkpoint_dir=ckpt))
    (record,) = loop2.run()
    assert engine2.swaps == ["step-3", "step-4"] and record.step == 4 and record.staleness_max == 0
    assert len(read_curve(store)) == 4
    store.close()


def test_iteration_without_trainable_rollouts_is_recorded_not_trained(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store.sqlite")
    engine = FakeEngine()
    trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=5e-3))
    loop = TrainingLoop(store, trainer, batch_runner(store, engine, broken=True), engine=engine,
                        config=LoopConfig(iterations=1, checkpoint_dir=tmp_path / "ckpt"))
    (record,) = loop.run()
    assert not record.updated and record.step == 0 and record.reward_mean is None and record.checkpoint is None
    assert engine.swaps == [] and "skipped" in record.metrics
    assert read_curve(store)[0].metrics["trajectories"]["dropped"] == {"no_reward": 9}
    store.close()
