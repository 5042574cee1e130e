"""What the training loops ask of the world around them, as small protocols the caller fills in. The loops
(loop.py, async_loop.py) know nothing of agents, graders, specs or the command line: `agl_cli` (training.py,
train_async.py, verl_training.py) hands them these.

- `PolicyTrainer`  makes one policy update from a batch and keeps checkpoints (torch_backend.TorchTrainer on this
                   machine, verl_backend.trainer.VerlTrainer over verl)
- `WeightSink`     where new weights go to be served (serving.engine.Engine; verl's rollout servers through
                   verl_backend.trainer.VerlWeightSink)
- `BatchRollouts`  the sync loop's rollout source: runs iteration i's rollouts to the end, returns their ids
- `RolloutSource`  the collocated-async loop's rollout source: rollouts keep running, handed over group by group
- `Gate`           the gateway's pause around an update of the collocated-async loop

Pure typing: nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rl_backend.trainer.batch import TrainBatch


class PolicyTrainer(Protocol):
    @property
    def step(self) -> int:
        """Updates made so far (a resumed trainer starts at its checkpoint's): the served version is step-<n>."""

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy update over `batch`; `step` moves only when the weights did. Returns the update's metrics."""

    def serving_state_dict(self) -> Mapping[str, Any]:
        """The current weights for the WeightSink (empty when the sink syncs them itself)."""

    def save_checkpoint(self, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """A complete checkpoint at `directory` (its trainer_state.json, written last, holds `extra`)."""


class WeightSink(Protocol):
    """Where the loop sends new weights, named by version, so the next rollouts sample from them."""

    @property
    def model_version(self) -> str: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], version: str, timeout_s: float | None = None) -> None: ...


class BatchRollouts(Protocol):
    """The sync loop's rollouts: iteration i's batch, run to the end; returns the ids of its finished rollouts,
    whose calls (token ids, logprobs, model version) are in the run store by then."""

    def __call__(self, iteration: int) -> Sequence[str]: ...


@dataclass(frozen=True)
class RolloutGroup:
    """One GRPO group whose rollouts have all finished (successfully or not)."""

    key: str
    rollout_ids: tuple[str, ...]


class RolloutSource(Protocol):
    def start(self) -> None:
        """Begin launching rollouts; they run until stop()."""

    def next_groups(self, count: int, timeout_s: float | None) -> list[RolloutGroup]:
        """Block until `count` complete groups are in and hand over the oldest `count` (each exactly once)."""

    def stop(self) -> None:
        """Cancel what is in flight and stop launching."""


class Gate(Protocol):
    """What the loop needs from the gateway: a pause that drains calls in flight, and a resume."""

    def pause(self) -> dict[str, Any]:
        """Stop admitting model calls and wait for those in flight; returns what happened (drained, seconds)."""

    def resume(self, model_version: str) -> dict[str, Any]:
        """Admit calls again (now served by `model_version`); returns what happened during the pause."""
