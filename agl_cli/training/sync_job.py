"""`agl train` on one machine: reinforcement learning of the served model through the unchanged agent.

Each iteration runs `group_size` rollouts of `tasks_per_step` training tasks through the same agent, grader and
gateway as `agl eval` (sampling at the training temperature), builds trajectories from the recorded token ids,
updates the policy (rl_backend.trainer), and swaps the new weights into the embedded server before the next batch
(the `sync` loop). Before the first and after the last update, the held-out split is evaluated with the agent's
own settings, so the run ends with a paired before/after comparison.

`TrainingRun` owns the whole job (services, held-out evaluations, export); the trainer it starts (rl_backend's
TorchTrainer, or verl's in verl_job.py) makes each update. The loop gets its rollouts from `TrainingBatches`,
agl's side of the loop's `BatchRollouts` interface.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agl_cli.errors import ConfigError
from agl_cli.evaluation.controllers import make_controller, run_then_close
from agl_cli.evaluation.runner import EvalRunner, PlannedRollout, make_plan
from agl_cli.evaluation.services import RunServices, running_services
from agl_cli.runs.rundir import RunDir
from agl_cli.spec.schema import ExperimentSpec
from agl_cli.spec.task_content import check_and_record
from agl_cli.spec.tasks import Task
from agl_cli.spec.variants import Variant, baseline
from rl_backend.store.db import RunStore

if TYPE_CHECKING:
    from rl_backend.trainer.interfaces import PolicyTrainer, WeightSink
    from rl_backend.trainer.loop import LoopConfig

TRAINED_DIR = "trained-model"


@dataclass
class TrainOptions:
    steps: int = 8
    tasks_per_step: int = 4
    group_size: int = 4
    lr: float = 1e-5
    temperature: float = 1.0
    lora: bool = False
    loss_agg: str = "rollout"
    kl_coef: float = 0.0
    train_split: str = "train"
    heldout_split: str = "val"
    heldout_limit: int = 40
    keep_checkpoints: int = 2
    loop: str = "sync"  # sync | collocated-async (agl_cli/training/async_job.py)
    max_staleness: int = 1  # collocated-async: a rollout served by weights more updates old is not trained on
    track: list[str] = field(default_factory=list)  # experiment trackers (rl_backend/trainer/trackers.py)
    backend: str = "torch"  # torch: this machine (rl_backend.trainer.torch_backend); verl: GPUs (agl train --backend verl)
    stop_on_collapse: bool = True  # stop when entropy collapsed and groups carry no signal (rl_backend.trainer.collapse)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def temperature_problem(options: TrainOptions) -> str | None:
    """Why the torch backend's loss cannot model tokens sampled at `options.temperature`, if it cannot. The engine
    records raw (temperature 1) logprobs; at another temperature the trainer recomputes the old logprobs at that
    temperature with the weights that sampled the batch, which only the sync loop still holds."""
    temperature = options.temperature
    if not (math.isfinite(temperature) and temperature > 0):
        return (f"--temperature {temperature:g}: training samples from the policy, which needs a temperature above "
                "0 (0 is greedy: every rollout of a group alike, nothing to learn from); use --temperature 1 (the "
                "default) or a value such as 0.7")
    if temperature != 1.0 and options.loop == "collocated-async":
        return (f"--temperature {temperature:g} with --loop collocated-async: the engine records raw (temperature 1) "
                "logprobs, and a stale rollout's tokens were sampled by weights the trainer no longer holds, so "
                f"neither the record nor a recompute describes tokens sampled at {temperature:g}; use --temperature 1 "
                "(the default) with collocated-async, or --loop sync")
    return None


def trained_upstream(spec: ExperimentSpec) -> str:
    """The embedded upstream whose weights are trained: the one `model:` routes to, else the only one."""
    embedded = [name for name, u in spec.upstreams.items() if u.kind == "embedded"]
    if spec.model and "/" in spec.model and spec.model.split("/", 1)[0] in embedded:
        return spec.model.split("/", 1)[0]
    if len(embedded) == 1:
        return embedded[0]
    if not embedded:
        raise ConfigError(
            "agl train (the embedded torch backend) trains a model agl serves itself, and this spec has no "
            "`kind: embedded` upstream",
            hint="add  upstreams: {local: {kind: embedded, model: smollm2-135m-instruct}}  and  "
            "model: local/smollm2-135m-instruct  (GPU clusters: agl train --on kubernetes)",
        )
    raise ConfigError(
        f"several embedded upstreams ({', '.join(embedded)}): set `model:` to the one to train, e.g. {embedded[0]}/..."
    )


def phase_variants(spec: ExperimentSpec) -> tuple[Variant, Variant]:
    """The baseline's settings under two names: held-out before training, and the training batches."""
    base = baseline(spec)
    return Variant("before", base.settings, f"{base.hash}-before"), Variant("train", base.settings, f"{base.hash}-train")


def after_variant(spec: ExperimentSpec, step: int) -> Variant:
    """Held-out after training, named by the update it measures: a resumed run that trains further measures anew."""
    base = baseline(spec)
    return Variant(f"after-step-{step}", base.settings, f"{base.hash}-after-{step}")


def training_batch(tasks: list[Task], variant: Variant, iteration: int, options: TrainOptions) -> list[PlannedRollout]:
    """Iteration i: the next `tasks_per_step` tasks (cycling), each with `group_size` fresh seeds, so every
    iteration's rollouts have keys of their own and a resumed run never mistakes them for finished ones."""
    count = min(options.tasks_per_step, len(tasks))
    start = (iteration * count) % len(tasks)
    chosen = [tasks[(start + k) % len(tasks)] for k in range(count)]
    seeds = range(iteration * options.group_size, (iteration + 1) * options.group_size)
    return [PlannedRollout(variant, task, seed) for task in chosen for seed in seeds]


def _latest_ids(store: RunStore, plan: list[PlannedRollout]) -> list[str]:
    wanted = {item.key for item in plan}
    return [r.id for r in store.rollouts(latest_only=True) if r.key in wanted]


def loop_config(spec: ExperimentSpec, options: TrainOptions, *, iterations: int, checkpoints: Path) -> LoopConfig:
    """The training loop's settings: the run's options, and what counts as a pass from agl.yaml, as everywhere."""
    from rl_backend.trainer.collapse import CollapseRule
    from rl_backend.trainer.loop import LoopConfig

    return LoopConfig(iterations=iterations, checkpoint_dir=checkpoints, keep_checkpoints=options.keep_checkpoints,
                      pass_threshold=spec.pass_threshold, collapse=CollapseRule(enabled=options.stop_on_collapse))


def overridden_message(fields: dict[str, int]) -> str:
    """The warning that the agent asked for sampling the loss cannot model, and what training did instead."""
    listed = ", ".join(f"{name} ({calls} calls)" for name, calls in fields.items())
    return (f"warning: the agent sent sampling settings that training calls do not keep: {listed}. Training samples "
            "from the policy's whole distribution at --temperature (top_p 1, no top_k, min_p, penalties, logit bias "
            "or constrained output), the distribution its loss models; `agl eval` and the held-out split send the "
            "agent's requests as they are")


def run_plan(runner: EvalRunner, plan: list[PlannedRollout]) -> None:
    """Every rollout of `plan` through the eval runner, to the end. Each plan closes its controller (the Kubernetes
    one deletes the plan's Jobs and ends its watch, which belongs to this plan's event loop), so a runner whose
    controller a previous plan closed gets a new one."""
    if getattr(runner.controller, "closed", False):
        runner.controller = make_controller(runner.spec, runner.run_dir.run_id)
    asyncio.run(run_then_close(runner.controller, lambda: runner.run(plan)))


@dataclass
class TrainingBatches:
    """The sync loop's rollouts (rl_backend.trainer.interfaces.BatchRollouts): iteration i runs `training_batch` of
    the tasks through the unchanged agent, numbered on from `first_iteration` (the iterations a resumed run did)."""

    runner: EvalRunner
    tasks: list[Task]
    variant: Variant
    options: TrainOptions
    first_iteration: int = 0

    def __call__(self, iteration: int) -> list[str]:
        plan = training_batch(self.tasks, self.variant, self.first_iteration + iteration, self.options)
        run_plan(self.runner, plan)
        return _latest_ids(self.runner.store, plan)


class TrainingRun:
    """Owns one `agl train` run: the services, the trainer, the loop, the before/after evaluation."""

    def __init__(self, spec: ExperimentSpec, run: RunDir, options: TrainOptions, train_tasks: list[Task],
                 heldout: list[Task], *, log: Callable[[str], None]) -> None:
        self.spec, self.run_dir, self.options = spec, run, options
        self.train_tasks, self.heldout = train_tasks, heldout
        self.log = log
        self.upstream = trained_upstream(spec)

    # The model being trained is served by the trainer itself (verl's rollout servers), not loaded by the stack.
    policy_served_by_trainer = False

    def _start_backend(self, stack: RunServices, checkpoints: Path) -> tuple[PolicyTrainer, WeightSink]:
        """(the trainer, where its new weights go): here the torch trainer and the embedded server's engine."""
        from rl_backend.serving.model_store import resolve_model_dir
        from rl_backend.trainer.loop import latest_checkpoint
        from rl_backend.trainer.loss import LossConfig
        from rl_backend.trainer.torch_backend import LoraSettings, TorchTrainer, TrainerConfig

        if self.upstream not in stack.embedded:
            raise ConfigError(
                f"upstream {self.upstream!r} is not served in this process ($AGL_GATEWAY_URL sends its calls "
                "elsewhere), and the torch backend trains the weights of a model it serves itself",
                hint="unset AGL_GATEWAY_URL, or train with --backend verl",
            )
        engine = stack.embedded[self.upstream].engine
        config = TrainerConfig(
            lr=self.options.lr,
            loss=LossConfig(loss_agg=self.options.loss_agg, kl_coef=self.options.kl_coef),  # type: ignore[arg-type]
            lora=LoraSettings() if self.options.lora else None,
            logit_temperature=self.options.temperature,  # the loss models the distribution the tokens came from
        )
        resume_from = latest_checkpoint(checkpoints)
        if resume_from is not None:
            self.log(f"resuming from checkpoint {resume_from.name}")
            return TorchTrainer.from_checkpoint(resume_from, config), engine
        model = self.spec.upstreams[self.upstream].model
        return TorchTrainer.from_pretrained(resolve_model_dir(str(model)), config), engine

    def _stop_backend(self) -> None:
        """Release what _start_backend started (nothing for the torch trainer)."""

    def _export(self, final: Path) -> dict[str, str]:
        """The trained model of checkpoint `final` as a Hugging Face folder under the run (TRAINED_DIR)."""
        trained_dir = self.run_dir.path / TRAINED_DIR
        shutil.rmtree(trained_dir, ignore_errors=True)
        shutil.copytree(final / "model", trained_dir)
        return {"model": str(trained_dir)}

    def run(self, on_step: Callable[[Any], None]) -> dict[str, Any]:
        from rl_backend.trainer.curves import read_curve
        from rl_backend.trainer.loop import latest_checkpoint

        before, during = phase_variants(self.spec)
        checkpoints = self.run_dir.path / "checkpoints"
        store = self.run_dir.open_store()
        # Like with like: a resume after the task file changed is refused before anything runs (the held-out
        # before/after comparison would pair answers to different tasks).
        manifest = self.run_dir.manifest()
        check_and_record(store, self.run_dir, manifest, self.train_tasks + self.heldout,
                         tasks_path=str(self.spec.resolve(self.spec.tasks.path)),
                         start_again=f"agl train {manifest.get('spec_path') or 'agl.yaml'}")
        for variant in (before, during):
            store.upsert_variant(variant.name, variant.hash, variant.settings)
        policy = self.upstream if self.policy_served_by_trainer else None
        with running_services(self.spec, store, log=self.log, policy=policy) as stack:
            trainer, engine = self._start_backend(stack, checkpoints)
            try:
                after = self._train(stack, store, trainer, engine, on_step, before, during, checkpoints)
            finally:
                self._stop_backend()
        curve = read_curve(store)
        overridden = store.sampling_overridden()
        store.close()
        final = latest_checkpoint(checkpoints)
        exported = self._export(final) if final is not None else {}
        self._write_metrics(curve)
        stopped = curve[-1].metrics.get("stopped") if curve else None
        return {"curve": [c.to_json() for c in curve], "trained_model": exported.get("model"),
                "trained_adapter": exported.get("adapter"), "after_variant": after.name,
                "stopped_early": {"after_iteration": len(curve), "of": self.options.steps, "reason": stopped}
                if stopped and len(curve) < self.options.steps else None,
                "sampling_overridden": overridden}

    def _train(self, stack: RunServices, store: RunStore, trainer: PolicyTrainer, engine: WeightSink,
               on_step: Callable[[Any], None], before: Variant, during: Variant, checkpoints: Path) -> Variant:
        """Held-out before, the training loop, held-out after; returns the after variant."""
        from rl_backend.trainer.curves import read_curve
        from rl_backend.trainer.loop import TrainingLoop, restore_missing_step

        evaluator = self._runner(stack, store, overrides=None)
        self.log(f"held-out {self.options.heldout_split} split before training: {len(self.heldout)} tasks")
        run_plan(evaluator, make_plan([before], self.heldout, 1))
        restore_missing_step(store, checkpoints)  # killed between a checkpoint and its row
        done = len(read_curve(store))
        sampler = self._runner(stack, store, overrides=self.sampling_overrides())
        batches = TrainingBatches(sampler, self.train_tasks, during, self.options, first_iteration=done)
        on_step = self._warn_overridden(store, on_step)
        loop = TrainingLoop(store, trainer, batches, engine=engine, on_step=on_step,
                            config=loop_config(self.spec, self.options, iterations=max(0, self.options.steps - done),
                                               checkpoints=checkpoints))
        if self.options.loop == "collocated-async":
            from agl_cli.training.async_job import train_collocated_async

            train_collocated_async(
                loop, runner=sampler, gateway=stack.gateway, tasks=self.train_tasks, variant=during,
                group_size=self.options.group_size, groups_per_step=min(self.options.tasks_per_step,
                                                                        len(self.train_tasks)),
                max_staleness=self.options.max_staleness, iterations=max(0, self.options.steps - done),
                concurrency=self.spec.concurrency)
        else:
            loop.run()
        after = after_variant(self.spec, trainer.step)
        store.upsert_variant(after.name, after.hash, after.settings)
        self.log(f"held-out {self.options.heldout_split} split after training ({after.name})")
        run_plan(evaluator, make_plan([after], self.heldout, 1))
        return after

    def sampling_overrides(self) -> dict[str, Any]:
        """What the gateway sets on every training call, whatever the agent asks: the training temperature, top_p 1,
        and only the request fields that leave sampling alone (rl_backend.gateway.training_fields). The loss sees
        the policy's whole distribution; a token drawn from a narrower or reshaped one would bias its gradient."""
        from rl_backend.gateway.training_fields import KNOB

        return {"temperature": self.options.temperature, "top_p": 1.0, KNOB: True}

    def _warn_overridden(self, store: RunStore, on_step: Callable[[Any], None]) -> Callable[[Any], None]:
        """`on_step`, and once per run (the first step whose calls had some) which of the agent's sampling
        fields the gateway overrode on training calls."""
        warned = False

        def step(record: Any) -> None:
            nonlocal warned
            on_step(record)
            if not warned and (fields := store.sampling_overridden()):
                warned = True
                self.log(overridden_message(fields))

        return step

    def _runner(self, stack: RunServices, store: RunStore, overrides: dict[str, Any] | None) -> EvalRunner:
        return EvalRunner(self.spec, self.run_dir, store, stack, make_controller(self.spec, self.run_dir.run_id),
                          gateway_overrides=overrides)

    def _write_metrics(self, curve: list[Any]) -> None:
        """The curves the report draws: one JSON object per step."""
        lines = [
            json.dumps({"step": c.step, "reward": c.reward_mean, "pass_rate": c.pass_rate, "entropy": c.entropy,
                        "kl": c.kl, "tokens_per_s": c.tokens_per_s, "rollouts_per_min": c.rollouts_per_min,
                        "staleness": c.staleness_mean, "staleness_max": c.staleness_max,
                        "stale": c.metrics.get("stale", 0), "wall_s": c.metrics.get("wall_s"), "updated": c.updated})
            for c in curve
        ]
        (self.run_dir.path / "train_metrics.jsonl").write_text("".join(line + "\n" for line in lines))
