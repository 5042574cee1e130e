"""The collocated-async loop on the toy task: rollouts keep being sampled on a thread while the tiny model trains.

The toy source samples each group in two phases (call 1, later call 2), so a group can straddle an update; a "slow"
group now and then waits two updates before its second call, which makes it too stale to train on. The toy gate
behaves like the gateway: while paused, a new call waits (held) until resume; pause waits for calls in flight.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("verl") is None:  # found, not imported: importing verl configures logging
    pytest.skip("verl is not installed", allow_module_level=True)

from rl_backend.store.db import RunStore  # noqa: E402
from rl_backend.store.records import RewardSource, Rollout, RolloutStatus  # noqa: E402
from rl_backend.trainer.async_loop import AsyncConfig, AsyncTrainingLoop, rollout_staleness  # noqa: E402
from rl_backend.trainer.curves import read_curve  # noqa: E402
from rl_backend.trainer.interfaces import RolloutGroup  # noqa: E402
from rl_backend.trainer.loop import LoopConfig, TrainingLoop  # noqa: E402
from rl_backend.trainer.torch_backend import TorchTrainer, TrainerConfig  # noqa: E402
from rl_backend.trainer.toy import BOS, TOOL, ToyTask, call_record, make_tasks, sample_next, tiny_llama  # noqa: E402

pytestmark = pytest.mark.usefixtures("two_torch_threads")


class ToyGate:
    """The gateway's pause/drain/resume, for calls made on the source's thread."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.paused = False
        self.in_flight = 0
        self.held = 0  # calls that arrived during a pause and waited for the resume
        self.pauses = 0

    def call(self) -> Any:
        gate = self

        class _Call:
            def __enter__(self) -> None:
                with gate.cv:
                    if gate.paused:
                        gate.held += 1
                        gate.cv.notify_all()  # a test may wait for a call to be held
                    gate.cv.wait_for(lambda: not gate.paused)
                    gate.in_flight += 1

            def __exit__(self, *exc: object) -> None:
                with gate.cv:
                    gate.in_flight -= 1
                    gate.cv.notify_all()

        return _Call()

    def pause(self) -> dict[str, Any]:
        with self.cv:
            self.paused, self.pauses = True, self.pauses + 1
            drained = self.cv.wait_for(lambda: self.in_flight == 0, timeout=10)
        return {"drained": drained}

    def resume(self, model_version: str) -> dict[str, Any]:
        with self.cv:
            self.paused = False
            self.cv.notify_all()
        return {"model_version": model_version}


class GatedEngine:
    """A FakeEngine that fails the test if weights are swapped while the gate lets calls through."""

    def __init__(self, gate: ToyGate) -> None:
        self.gate = gate
        self.model = tiny_llama().eval()
        self.model_version = "base"
        self.swaps: list[str] = []

    def load_state_dict(self, state_dict: Mapping[str, Any], version: str, timeout_s: float | None = None) -> None:
        assert self.gate.paused and self.gate.in_flight == 0, "weights swapped while calls could be served"
        self.model.load_state_dict(dict(state_dict), strict=True)
        self.model_version = version
        self.swaps.append(version)


@dataclass
class ToyGroup:
    number: int
    task: ToyTask
    slow: bool
    first: list[tuple[list[int], int, float, str]] = field(default_factory=list)  # prompt, token, logprob, version
    phase_one_at_update: int = 0
    completed_at_update: int | None = None
    handed_at_update: int | None = None

    def rid(self, k: int) -> str:
        return f"g{self.number}-{self.task.id}-{k}"


class ToySource:
    """Keeps `open_groups` groups in progress; a group's second calls come on a later tick than its first."""

    def __init__(self, store: RunStore, engine: GatedEngine, gate: ToyGate, *, group_size: int = 4,
                 open_groups: int = 3, slow_every: int = 5) -> None:
        self.store, self.engine, self.gate = store, engine, gate
        self.group_size, self.open_groups, self.slow_every = group_size, open_groups, slow_every
        self.tasks = make_tasks()
        self.cv = threading.Condition()
        self.complete: deque[ToyGroup] = deque()
        self.groups: list[ToyGroup] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.gen = torch.Generator().manual_seed(0)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping = True
        with self.gate.cv:
            self.gate.paused = False
            self.gate.cv.notify_all()
        self.thread.join(10)

    def next_groups(self, count: int, timeout_s: float | None) -> list[RolloutGroup]:
        with self.cv:
            self.cv.wait_for(lambda: len(self.complete) >= count, timeout=timeout_s)
            out = [self.complete.popleft() for _ in range(min(count, len(self.complete)))]
        for g in out:
            g.handed_at_update = len(self.engine.swaps)
        return [RolloutGroup(f"g{g.number}", tuple(g.rid(k) for k in range(self.group_size))) for g in out]

    def _run(self) -> None:
        in_progress: deque[ToyGroup] = deque()
        while not self.stopping:
            with self.cv:
                waiting = len(self.complete) >= 2 * self.open_groups  # backpressure, as the real source has
            if waiting:
                time.sleep(0.002)
                continue
            while len(in_progress) < self.open_groups:
                n = len(self.groups)
                group = ToyGroup(n, self.tasks[n % len(self.tasks)], slow=self.slow_every > 0 and n % self.slow_every == 1)
                self.groups.append(group)
                in_progress.append(group)
            group = in_progress.popleft()
            if group.slow and group.first and len(self.engine.swaps) < group.phase_one_at_update + 2:
                in_progress.append(group)  # a straggler: its second calls come two updates later
                time.sleep(0.001)
                continue
            with self.gate.call():
                if self.stopping:
                    return
                self._advance(group)
            if group.completed_at_update is None:
                in_progress.append(group)
            else:
                with self.cv:
                    self.complete.append(group)
                    self.cv.notify_all()

    def _advance(self, group: ToyGroup) -> None:
        version = self.engine.model_version
        if not group.first:
            prompts = [[BOS, group.task.prompt_token] for _ in range(self.group_size)]
            sampled = sample_next(self.engine.model, prompts, self.gen)
            group.first = [(p, tok, lp, version) for p, (tok, lp) in zip(prompts, sampled, strict=True)]
            group.phase_one_at_update = len(self.engine.swaps)
            return
        prompts = [p + [tok, TOOL] for p, tok, _, _ in group.first]
        second = sample_next(self.engine.model, prompts, self.gen)
        now = time.time()
        for k, ((p1, a, lp_a, v1), p2, (b, lp_b)) in enumerate(zip(group.first, prompts, second, strict=True)):
            rid = group.rid(k)
            self.store.insert_calls([call_record(rid, 0, p1, [a], [lp_a], v1, now),
                                     call_record(rid, 1, p2, [b], [lp_b], version, now + 0.001)])
            self.store.put_rollout(Rollout(
                id=rid, key=f"toy/g{group.number}/{k}", variant="toy", task_id=group.task.id, seed=k,
                status=RolloutStatus.succeeded, reward=0.5 * (a == group.task.first) + 0.5 * (b == group.task.second),
                reward_source=RewardSource.grader,
            ))
        group.completed_at_update = len(self.engine.swaps)


def test_async_loop_trains_with_bounded_staleness_carries_groups_over_and_pauses(tmp_path: Path) -> None:
    started = time.process_time()
    store = RunStore(tmp_path / "store.sqlite")
    gate = ToyGate()
    engine = GatedEngine(gate)
    trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=5e-3))
    paused_during_update: list[bool] = []
    real_step = trainer.train_step

    def watched_step(batch: Any) -> dict[str, float]:
        paused_during_update.append(gate.paused and gate.in_flight == 0)
        with gate.cv:  # the first update lasts until the source's next call arrives and is held (a state, not a sleep)
            gate.cv.wait_for(lambda: gate.held > 0, timeout=30)
        return real_step(batch)

    trainer.train_step = watched_step  # type: ignore[method-assign]
    source = ToySource(store, engine, gate)
    loop = TrainingLoop(store, trainer, lambda i: [], engine=engine, group_of=lambda r: r.key.rsplit("/", 1)[0],
                        config=LoopConfig(checkpoint_dir=tmp_path / "ckpt", pass_threshold=0.5))
    records = AsyncTrainingLoop(loop, source, gate, AsyncConfig(iterations=6, groups_per_step=2,
                                                                max_staleness=1)).run()

    assert [r.step for r in records] == [1, 2, 3, 4, 5, 6] and all(r.updated for r in records)
    assert engine.swaps == [f"step-{n}" for n in range(1, 7)]
    assert paused_during_update == [True] * 6 and gate.pauses == 6
    assert gate.held > 0, "no call arrived during an update: the gate was never exercised"

    # Staleness: every trained rollout within K = 1, the stragglers dropped and counted.
    trained: list[str] = []
    for r in records:
        ids = r.metrics["rollout_ids"]
        trained += ids
        assert all((rollout_staleness(store, rid, r.step - 1) or 0) <= 1 for rid in ids)
        assert all((rollout_staleness(store, rid, r.step - 1) or 0) > 1 for rid in r.metrics["stale_rollout_ids"])
        assert r.staleness_max is not None and r.staleness_max <= 1
        assert r.metrics["stale"] == len(r.metrics["stale_rollout_ids"])
    assert sum(r.metrics["stale"] for r in records) > 0, "no straggler was dropped"
    assert any(r.staleness_max == 1 for r in records), "no rollout straddled an update"

    # Carry-over: groups handed over in completion order, each once, some after the update they completed at.
    handed = [g for g in source.groups if g.handed_at_update is not None]
    dropped = [rid for r in records for rid in r.metrics["stale_rollout_ids"]]
    assert len(trained) == len(set(trained)) and not set(trained) & set(dropped)
    assert sorted(trained + dropped) == sorted(g.rid(k) for g in handed for k in range(4))
    assert len(handed) >= 12  # 2 usable groups per update, more when stragglers were dropped
    assert any(g.handed_at_update is not None and g.completed_at_update is not None
               and g.handed_at_update > g.completed_at_update for g in handed), "no group carried over"

    curve = read_curve(store)
    assert [c.step for c in curve] == [1, 2, 3, 4, 5, 6]
    assert all(c.staleness_mean is not None and c.metrics["loop"] == "collocated-async" for c in curve)
    assert all(c.metrics["wall_s"] > 0 and c.metrics["pause"]["drained"] for c in curve)
    store.close()
    assert time.process_time() - started < 120  # CPU-seconds: about 60 s on 2 busy cores


def test_a_kill_between_checkpoint_and_row_is_repaired_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rl_backend.trainer.loop as loop_module
    from rl_backend.trainer.loop import restore_missing_step
    from rl_backend.trainer.toy import stored_batches

    store = RunStore(tmp_path / "store.sqlite")
    trainer = TorchTrainer(tiny_llama(), TrainerConfig(lr=5e-3))
    tasks = make_tasks()

    run_batch = stored_batches(store, trainer, tasks, 4)

    ckpt = tmp_path / "ckpt"
    loop = TrainingLoop(store, trainer, run_batch, config=LoopConfig(iterations=1, checkpoint_dir=ckpt))
    loop.run()
    real_record_step = loop_module.record_step

    def die(store: Any, record: Any) -> None:
        raise KeyboardInterrupt("killed after the checkpoint, before the row")

    monkeypatch.setattr(loop_module, "record_step", die)
    with pytest.raises(KeyboardInterrupt):
        loop.iterate(1)
    monkeypatch.setattr(loop_module, "record_step", real_record_step)
    assert [c.step for c in read_curve(store)] == [1] and (ckpt / "step-2" / "trainer_state.json").is_file()

    restored = restore_missing_step(store, ckpt)
    assert restored is not None and restored.step == 2 and restored.checkpoint == str(ckpt / "step-2")
    curve = read_curve(store)
    assert [c.step for c in curve] == [1, 2] and curve[1].metrics["restored_from_checkpoint"]
    assert curve[1].metrics["rollout_ids"] and curve[1].reward_mean is not None
    assert restore_missing_step(store, ckpt) is None  # idempotent
    store.close()
