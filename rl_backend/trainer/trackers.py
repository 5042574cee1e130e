"""Experiment trackers for `agl train --track tensorboard,wandb,mlflow`: each step's curves, logged by step number.

What is logged (under `train/`): reward, pass rate, entropy, KL, loss, grad norm, tokens/s, rollouts/min, staleness
(mean, max), stale rollouts dropped, trained rollouts and the step's wall time; whichever the step has (a skipped
update has no entropy).

- tensorboard: event files under `<run dir>/tensorboard` (`tensorboard --logdir <run dir>/tensorboard`).
- wandb: one W&B run per agl run (the agl run id is its id, so `agl train --resume` continues it); W&B reads its own
  WANDB_* variables (WANDB_PROJECT, default "agl"; WANDB_ENTITY, WANDB_MODE=offline, WANDB_DIR, WANDB_API_KEY...).
- mlflow: one MLflow run per agl run in the experiment MLFLOW_EXPERIMENT_NAME (default "agl"), at
  MLFLOW_TRACKING_URI (MLflow's own default otherwise).

Each package is imported only when its tracker is asked for; `check_trackers` says which `pip install` is missing
before a run starts.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rl_backend.trainer.curves import StepRecord

# tracker name -> (module that must be importable, what to install)
PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", "pip install wandb"),
    "mlflow": ("mlflow", "pip install mlflow"),
}


class TrackerError(ValueError):
    """An unknown tracker, or one whose package is not installed; the message says what to do."""


def parse_trackers(value: str | Iterable[str] | None) -> list[str]:
    """`"tensorboard, wandb"` (or a list) -> checked names, in order, without repeats."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = list(dict.fromkeys(n.strip().lower() for n in items if n.strip()))
    check_trackers(names)
    return names


def check_trackers(names: Iterable[str]) -> None:
    for name in names:
        if name not in PACKAGES:
            raise TrackerError(f"--track {name}: unknown tracker; use any of {', '.join(PACKAGES)}, comma-separated")
        module, install = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise TrackerError(f"--track {name} needs the {module} package, which is not installed: {install}")


def step_values(record: StepRecord) -> dict[str, float]:
    """The numbers of one step worth a curve, without the missing ones."""
    values: dict[str, Any] = {
        "reward": record.reward_mean, "pass_rate": record.pass_rate, "entropy": record.entropy, "kl": record.kl,
        "loss": record.loss, "grad_norm": record.grad_norm, "tokens_per_s": record.tokens_per_s,
        "rollouts_per_min": record.rollouts_per_min, "staleness_mean": record.staleness_mean,
        "staleness_max": record.staleness_max, "stale": record.metrics.get("stale", 0),
        "trained_rollouts": record.trained_rollouts, "wall_s": record.metrics.get("wall_s"),
    }
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class Tracker(Protocol):
    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"train/{key}", value, global_step=step)
        self.writer.flush()  # a killed run keeps its curves up to the last step

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_id: str, name: str, config: Mapping[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "agl", id=run_id, name=name,
                              config=dict(config), resume="allow")

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log({f"train/{k}": v for k, v in values.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, run_id: str, name: str, config: Mapping[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "agl"
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
        runs = self.client.search_runs([experiment_id], filter_string=f"tags.agl_run_id = '{run_id}'", max_results=1)
        if runs:  # agl train --resume: continue the same MLflow run
            self.run_id = runs[0].info.run_id
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=name, tags={"agl_run_id": run_id}).info.run_id
            for key, value in config.items():
                self.client.log_param(self.run_id, key, str(value)[:500])

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.client.log_metric(self.run_id, f"train/{key}", value, step=step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


@dataclass
class Trackers:
    """The trackers of one run: `log(record)` after each step, `close()` at the end."""

    trackers: list[Tracker] = field(default_factory=list)

    def log(self, record: StepRecord) -> None:
        values = step_values(record)
        for tracker in self.trackers:
            tracker.log(record.step, values)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def open_trackers(names: Iterable[str], *, run_dir: Path, run_id: str, name: str,
                  config: Mapping[str, Any]) -> Trackers:
    names = list(names)
    check_trackers(names)
    out = Trackers()
    try:
        for tracker in names:
            if tracker == "tensorboard":
                out.trackers.append(TensorBoardTracker(run_dir / "tensorboard"))
            elif tracker == "wandb":
                out.trackers.append(WandbTracker(run_id, name, config))
            else:
                out.trackers.append(MlflowTracker(run_id, name, config))
    except BaseException:
        out.close()
        raise
    return out
