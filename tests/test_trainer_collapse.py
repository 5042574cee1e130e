"""A collapsed training run stops instead of spending its remaining steps: the trial's run went from entropy 2.0 to
0.5 by step 4 and then had "no learning signal" for every step left. The loops run on real stores, trajectories and
GRPO advantages (verl's core_algos) from the toy task's rollouts; the trainer is scripted (the PolicyTrainer
protocol) so that its entropy follows the trial's curve, which a tiny random model would not."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("verl") is None:  # found, not imported: importing verl configures logging
    pytest.skip("verl is not installed", allow_module_level=True)

from rl_backend.store.db import RunStore  # noqa: E402
from rl_backend.trainer.async_loop import AsyncConfig, AsyncTrainingLoop  # noqa: E402
from rl_backend.trainer.batch import TrainBatch  # noqa: E402
from rl_backend.trainer.collapse import CollapseRule, collapse_reason  # noqa: E402
from rl_backend.trainer.curves import StepRecord, read_curve  # noqa: E402
from rl_backend.trainer.interfaces import RolloutGroup  # noqa: E402
from rl_backend.trainer.loop import LoopConfig, TrainingLoop  # noqa: E402
from rl_backend.trainer.toy import make_tasks, run_rollouts, tiny_llama  # noqa: E402

pytestmark = pytest.mark.usefixtures("two_torch_threads")

TRIAL_ENTROPY = [2.0, 1.2, 0.7, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]


class ScriptedTrainer:
    """A PolicyTrainer whose updates report the trial's entropy curve; it trains nothing (no weights to serve)."""

    def __init__(self, entropy: Sequence[float]) -> None:
        self.entropy = list(entropy)
        self._step = 0
        self.batches: list[int] = []

    @property
    def step(self) -> int:
        return self._step

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        self.batches.append(batch.totals.n_rollouts)
        value = self.entropy[min(self._step, len(self.entropy) - 1)]
        self._step += 1
        return {"entropy": value, "loss": 0.0}

    def serving_state_dict(self) -> dict[str, Any]:
        return {}

    def save_checkpoint(self, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / "trainer_state.json").write_text(json.dumps({"step": self._step, **(extra or {})}))
        return path


class Toy:
    """Toy rollouts recorded in the store as the gateway would; from iteration `flat_from` on, every rollout of a
    group gets the same reward (no learning signal), before that each group holds a 0 and a 1."""

    def __init__(self, store: RunStore, flat_from: int) -> None:
        self.store, self.flat_from = store, flat_from
        self.model = tiny_llama().eval()
        self.tasks = make_tasks()
        self.made = 0
        self.loop: TrainingLoop | None = None  # whose weights "sampled" the rollouts: they are never stale

    def batch(self, iteration: int) -> list[str]:
        version = self.loop.version if self.loop is not None else "base"
        toy = run_rollouts(self.model, self.tasks, 4, step=iteration, version=version, id_prefix=f"i{iteration}-")
        for k, rollout in enumerate(toy.rollouts):
            rollout.reward = 1.0 if iteration >= self.flat_from else float(k % 2)
            self.store.put_rollout(rollout)
            self.store.insert_calls(toy.calls[rollout.id])
        self.made += 1
        return [r.id for r in toy.rollouts]


def sync_loop(tmp_path: Path, *, flat_from: int, entropy: Sequence[float] = TRIAL_ENTROPY,
              rule: CollapseRule | None = None) -> tuple[TrainingLoop, Toy, RunStore]:
    store = RunStore(tmp_path / "store.sqlite")
    toy = Toy(store, flat_from)
    loop = TrainingLoop(store, ScriptedTrainer(entropy), toy.batch,
                        config=LoopConfig(iterations=10, checkpoint_dir=tmp_path / "ckpt",
                                          collapse=rule or CollapseRule()))
    toy.loop = loop
    return loop, toy, store


def test_a_collapsed_run_stops_and_says_why(tmp_path: Path) -> None:
    loop, toy, store = sync_loop(tmp_path, flat_from=2)
    records = loop.run()
    # Iterations 3 and 4 had no signal and entropy is at 0.5 of 2.0 by then: stop after 4 of 10.
    assert len(records) == 4 and toy.made == 4
    assert loop.stopped and "entropy fell from 2.00 to 0.50" in loop.stopped
    assert "last 2 iterations every group's rollouts scored the same" in loop.stopped
    curve = read_curve(store)
    assert [c.metrics.get("stopped") for c in curve] == [None, None, None, loop.stopped]
    assert curve[-1].metrics["advantages"]["zero_signal_groups"] == curve[-1].metrics["advantages"]["groups"] == 2
    store.close()


def test_the_rule_can_be_turned_off(tmp_path: Path) -> None:
    loop, toy, store = sync_loop(tmp_path, flat_from=2, rule=CollapseRule(enabled=False))
    assert len(loop.run()) == 10 and loop.stopped is None and toy.made == 10
    store.close()


def test_no_signal_with_entropy_still_high_is_not_a_collapse(tmp_path: Path) -> None:
    """Groups that all score alike while the policy still samples widely (tasks too hard or too easy for now) go on."""
    loop, _, store = sync_loop(tmp_path, flat_from=0, entropy=[2.0, 1.9, 1.8, 1.9] * 3)
    assert len(loop.run()) == 10 and loop.stopped is None
    store.close()


def test_entropy_fallen_while_groups_still_differ_is_not_a_collapse(tmp_path: Path) -> None:
    loop, _, store = sync_loop(tmp_path, flat_from=99)
    assert len(loop.run()) == 10 and loop.stopped is None
    store.close()


class ToySource:
    """The collocated-async loop's RolloutSource over the toy batches: each request makes the groups it asks for."""

    def __init__(self, toy: Toy) -> None:
        self.toy, self.calls = toy, 0

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def next_groups(self, count: int, timeout_s: float | None) -> list[RolloutGroup]:
        ids = self.toy.batch(self.calls)
        self.calls += 1
        by_task: dict[str, list[str]] = {}
        for rid in ids:
            rollout = self.toy.store.get_rollout(rid)
            assert rollout is not None
            by_task.setdefault(f"{rollout.variant}/{rollout.task_id}", []).append(rid)
        return [RolloutGroup(key, tuple(group)) for key, group in by_task.items()][:count]


class OpenGate:
    def pause(self) -> dict[str, Any]:
        return {"drained": True}

    def resume(self, model_version: str) -> dict[str, Any]:
        return {"model_version": model_version}


def test_the_collocated_async_loop_stops_the_same_way(tmp_path: Path) -> None:
    loop, toy, store = sync_loop(tmp_path, flat_from=2)
    records = AsyncTrainingLoop(loop, ToySource(toy), OpenGate(),
                                AsyncConfig(iterations=10, groups_per_step=2)).run()
    assert len(records) == 4 and loop.stopped and toy.made == 4
    store.close()


def _record(entropy: float | None, groups: int, zero: int) -> StepRecord:
    return StepRecord(step=1, model_version="step-1", updated=True, started_at=0.0, ended_at=1.0, rollouts=8,
                      trained_rollouts=8, entropy=entropy,
                      metrics={"advantages": {"groups": groups, "zero_signal_groups": zero}})


def test_the_rule_on_records() -> None:
    rule = CollapseRule(patience=2)
    fell = [_record(2.0, 2, 0), _record(0.9, 2, 2)]
    assert collapse_reason(fell, rule) is None  # one iteration without signal is not yet a streak
    assert collapse_reason([*fell, _record(None, 2, 2)], rule)  # a skipped update keeps the last entropy
    assert collapse_reason([*fell, _record(0.9, 0, 0)], rule) is None  # no group at all says nothing
    assert collapse_reason([*fell, _record(0.9, 2, 1)], rule) is None  # one group still differs
    with pytest.raises(ValueError):
        CollapseRule(entropy_ratio=1.5)
