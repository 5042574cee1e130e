"""The synchronous training loop: run a batch of rollouts, train once on it, serve the new weights, record, repeat.

Each iteration:
  1. `run_batch(iteration)` (a BatchRollouts, interfaces.py) runs tasks × group size rollouts through the gateway
     (the agent unchanged) and returns their ids once all have finished; their calls (token ids, logprobs, model
     version) are in the run store.
  2. trajectories on exact token ids (trajectory.py), GRPO advantages per rollout (advantage.py),
  3. one policy update by the PolicyTrainer (torch_backend.py or verl's; rollout-normalized loss by default),
  4. the new weights go to the WeightSink (`load_state_dict(state_dict, version)`) as version `step-<n>`, so the
     next batch samples from them,
  5. a checkpoint (kept: the last `keep_checkpoints`) and one `train_steps` row in the store (curves.py).
Steps 2-5 are `TrainingLoop.train_on(rollout_ids)`, which the collocated-async loop (async_loop.py) shares.
A collapsed run (entropy fallen, then no learning signal: collapse.py) stops there: `TrainingLoop.stopped` says
why, and so does the last step's row (`metrics.stopped`); `LoopConfig.collapse` turns the check off.

Nothing is in flight while training (run_batch has returned), so the sync loop's staleness is 0; it is measured from
the calls' recorded model versions anyway, which catches an engine that was not updated.

Resume: `TorchTrainer.from_checkpoint(latest_checkpoint(dir))`, then a new TrainingLoop; on start the loop pushes the
trainer's weights to the engine when the engine serves another version. A checkpoint holds its step's record, so a
kill between the checkpoint and the store's row is repaired by `restore_missing_step` before resuming.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_backend.rewards import DEFAULT_PASS_THRESHOLD, passed
from rl_backend.store.db import RunStore
from rl_backend.store.records import Rollout
from rl_backend.trainer.advantage import Singletons, grpo_advantages
from rl_backend.trainer.batch import make_batch
from rl_backend.trainer.collapse import CollapseRule, collapse_reason
from rl_backend.trainer.curves import StepRecord, read_curve, record_step
from rl_backend.trainer.interfaces import BatchRollouts, PolicyTrainer, WeightSink
from rl_backend.trainer.trajectory import MergeMode, RolloutTrajectory, default_group, trajectories_from_store

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class LoopConfig:
    iterations: int = 10
    checkpoint_dir: Path | None = None
    keep_checkpoints: int = 2
    pass_threshold: float = DEFAULT_PASS_THRESHOLD  # agl.yaml's: a rollout passes at a reward of at least this
    merge: MergeMode = "previous"
    norm_by_std: bool = True
    singletons: Singletons = "zero"
    max_seq_len: int | None = None
    min_trained_rollouts: int = 1  # fewer trainable rollouts: the iteration is recorded but no update is made
    swap_timeout_s: float | None = 600.0
    collapse: CollapseRule = field(default_factory=CollapseRule)  # when to stop a collapsed run (collapse.py)


def version_name(step: int) -> str:
    return f"step-{step}"


def version_step(version: str | None) -> int | None:
    """The trainer step a model version names: "base" is 0, "step-<n>" is n, anything else unknown."""
    if version == "base":
        return 0
    match = re.fullmatch(r"step-(\d+)", version or "")
    return int(match.group(1)) if match else None


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint under `directory` (step-<n> folders), or None."""
    found = [(version_step(p.name), p) for p in directory.glob("step-*") if (p / "trainer_state.json").is_file()]
    steps = [(s, p) for s, p in found if s is not None]
    return max(steps)[1] if steps else None


def restore_missing_step(store: RunStore, directory: Path) -> StepRecord | None:
    """Write the `train_steps` row of the newest checkpoint when the store lacks it (the process died between the
    checkpoint and the row); returns the restored record, or None when nothing was missing."""
    latest = latest_checkpoint(directory)
    if latest is None:
        return None
    state = json.loads((latest / "trainer_state.json").read_text())
    saved = state.get("step_record")
    if not isinstance(saved, dict):
        return None  # an older checkpoint without its record: nothing to restore from
    if any(r.updated and r.step == saved["step"] for r in read_curve(store)):
        return None
    record = StepRecord(**saved)
    record.metrics["restored_from_checkpoint"] = True
    record_step(store, record)
    log.warning("restored the record of step %d from checkpoint %s", record.step, latest.name)
    return record


@dataclass
class _Timings:
    values: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.values[name] = round(now - since, 4)
        return now


class TrainingLoop:
    def __init__(
        self,
        store: RunStore,
        trainer: PolicyTrainer,
        run_batch: BatchRollouts,
        *,
        engine: WeightSink | None = None,
        config: LoopConfig | None = None,
        group_of: Callable[[Rollout], str] = default_group,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> None:
        self.store = store
        self.trainer = trainer
        self.run_batch = run_batch
        self.engine = engine
        self.config = config or LoopConfig()
        self.group_of = group_of
        self.on_step = on_step or (lambda record: None)
        self.stopped: str | None = None  # why the loop stopped before its last iteration (a collapse)

    @property
    def version(self) -> str:
        return version_name(self.trainer.step)

    def sync_engine(self) -> float:
        """Serve the trainer's current weights unless the engine already does; returns the seconds it took."""
        if self.engine is None or self.engine.model_version == self.version:
            return 0.0
        started = time.perf_counter()
        self.engine.load_state_dict(self.trainer.serving_state_dict(), self.version, self.config.swap_timeout_s)
        return time.perf_counter() - started

    def run(self) -> list[StepRecord]:
        if self.trainer.step > 0:
            self.sync_engine()  # resumed from a checkpoint: serve what was trained
        records = []
        for i in range(self.config.iterations):
            records.append(self.iterate(i))
            if self.stopped:
                break
        return records

    def iterate(self, iteration: int) -> StepRecord:
        started_at = time.time()
        mark = time.perf_counter()
        rollout_ids = list(self.run_batch(iteration))
        return self.train_on(rollout_ids, iteration=iteration, started_at=started_at,
                             rollout_s=time.perf_counter() - mark)

    def train_on(
        self,
        rollout_ids: Sequence[str],
        *,
        iteration: int,
        started_at: float,
        rollout_s: float,
        metrics: Mapping[str, Any] | None = None,
        after_sync: Callable[[], None] | None = None,
    ) -> StepRecord:
        """One update on finished rollouts (shared by the sync and the collocated-async loops): trajectories,
        advantages, the update, the new weights served, a checkpoint, the `train_steps` row.

        `rollout_s` is the time the rollouts had (rollouts/min is computed from it); `metrics` are added to the
        record's; `after_sync` runs as soon as the engine serves the new weights (or the update was skipped), before
        the checkpoint is written, so a paused gateway can let calls flow again while the checkpoint is saved.
        """
        cfg = self.config
        t = _Timings({"rollout_s": round(rollout_s, 4)})
        mark = time.perf_counter()
        trajs, report = trajectories_from_store(self.store, rollout_ids, group_of=self.group_of, merge=cfg.merge)
        adv = grpo_advantages(trajs, norm_by_std=cfg.norm_by_std, singletons=cfg.singletons)
        batch = make_batch(trajs, adv.advantages, max_seq_len=cfg.max_seq_len)
        mark = t.add("build_s", mark)
        rewards = [r.reward for r in (self.store.get_rollout(rid) for rid in rollout_ids) if r and r.reward is not None]
        staleness = self._staleness(trajs)
        extra: dict[str, Any] = {
            "iteration": iteration,
            "trajectories": report.summary(),
            "advantages": adv.summary(),
            "rewards_missing": len(rollout_ids) - len(rewards),
            "truncated_tokens": batch.truncated_tokens,
            "rollout_ids": list(rollout_ids),
        }
        extra.update(metrics or {})
        train: dict[str, float] = {}
        updated = False
        if batch.rows and batch.totals.n_rollouts >= cfg.min_trained_rollouts:
            before = self.trainer.step
            train = self.trainer.train_step(batch)
            updated = self.trainer.step != before
            mark = t.add("train_s", mark)
            if updated:
                t.values["sync_s"] = round(self.sync_engine(), 4)
                mark = time.perf_counter()
            else:
                extra["skipped"] = f"every optimizer step had a non-finite gradient ({train.get('skipped_steps')})"
        else:
            extra["skipped"] = f"{batch.totals.n_rollouts} trainable rollouts (< {cfg.min_trained_rollouts})"
        if after_sync is not None:
            after_sync()
        if not updated:
            log.warning("iteration %d: no update: %s", iteration, extra["skipped"])
        extra["train"] = train
        extra["timings"] = t.values
        record = StepRecord(
            step=self.trainer.step,
            model_version=self.version,
            updated=updated,
            started_at=started_at,
            ended_at=time.time(),
            rollouts=len(rollout_ids),
            trained_rollouts=batch.totals.n_rollouts,
            reward_mean=sum(rewards) / len(rewards) if rewards else None,
            pass_rate=sum(passed(r, cfg.pass_threshold) for r in rewards) / len(rewards) if rewards else None,
            entropy=train.get("entropy"),
            kl=train.get("kl"),  # to the reference; None without one (ppo_kl, sampling vs new policy, is in metrics)
            loss=train.get("loss"),
            grad_norm=train.get("grad_norm"),
            tokens_per_s=train.get("tokens_per_s"),
            rollouts_per_min=60.0 * len(rollout_ids) / rollout_s if rollout_s > 0 else None,
            staleness_mean=sum(staleness) / len(staleness) if staleness else None,
            staleness_max=max(staleness) if staleness else None,
            metrics=extra,
        )
        if updated and cfg.checkpoint_dir is not None:
            # The checkpoint carries its own step record: a process killed between the checkpoint and the row
            # below leaves a checkpoint whose row `restore_missing_step` writes on resume (the step is then neither
            # lost nor trained twice).
            record.checkpoint = str(cfg.checkpoint_dir / self.version)
            self._checkpoint(train, record)
            t.add("checkpoint_s", mark)
        record.ended_at = time.time()
        record.metrics["wall_s"] = round(record.ended_at - started_at, 4)
        # The step's own row says the run stopped there, so a report (or a resume) reads why.
        reason = collapse_reason([*read_curve(self.store), record], cfg.collapse)
        if reason:
            record.metrics["stopped"] = reason
            self.stopped = reason
            log.warning("iteration %d: stopping: %s", iteration, reason)
        record_step(self.store, record)
        self.on_step(record)
        return record

    def _staleness(self, trajs: Sequence[RolloutTrajectory]) -> list[int]:
        """Per trained call: how many updates behind the policy being trained its sampling weights were."""
        out = []
        for traj in trajs:
            for seq in traj.sequences:
                for version in seq.model_versions:
                    step = version_step(version)
                    if step is not None:
                        out.append(self.trainer.step - step)
        return out

    def _checkpoint(self, train: Mapping[str, float], record: StepRecord) -> Path:
        directory = self.config.checkpoint_dir
        assert directory is not None
        extra = {"model_version": self.version, "metrics": train, "step_record": record.to_json()}
        path = self.trainer.save_checkpoint(directory / self.version, extra)
        steps = sorted(
            (s, p) for p in directory.glob("step-*") if p.is_dir() and (s := version_step(p.name)) is not None
        )
        for _, old in steps[: max(0, len(steps) - self.config.keep_checkpoints)]:
            shutil.rmtree(old, ignore_errors=True)
        return Path(path)
