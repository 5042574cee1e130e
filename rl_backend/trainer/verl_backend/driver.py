"""The GPU path of `agl train --backend verl`: the torch backend's loop with verl's FSDP engine as the trainer and
a vLLM server as the policy the agent samples from.

  agent (unchanged) -> agl gateway (records token ids, logprobs) -> vLLM OpenAI server (PolicyServer, AGL_POLICY_URL)
  recorded calls -> trajectories -> GRPO advantages per rollout -> rows (rl_backend.trainer, as the torch backend)
  rows -> DataProto (data.py) -> verl TrainingWorker group (Ray, FSDP) with ppo_loss + `agl_rollout` (loss.py)
  new weights -> vLLM: LoRA adapter hot-loaded, or the server restarted on the new Hugging Face folder (policy.py)

The rollouts, the before/after held-out evaluation, the store and the step rows are agl_cli.training.Trainer's; only
the trainer object and the weight sink differ. On a cluster the gateway is the deployed one (AGL_GATEWAY_URL, whose
`kind: embedded` upstream it forwards to AGL_POLICY_URL, the policy Service); on one machine it is the one the stack
starts in this process (agl_cli/stack.py), forwarding the same way.

UNTESTED for lack of a GPU: everything in this module runs only after runtime.missing_requirements() is empty. The
pieces it is built from (config, DataProto, loss, verl's ppo_loss on our data) are tested on a CPU in
tests/test_verl_backend.py. Old logprobs the gateway did not record are not recomputed here (the torch backend does):
their tokens are left out of the loss and counted in the `unrecorded_logprob_tokens` metric.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from rl_backend.trainer.batch import TrainBatch, split_by_rollout
from rl_backend.trainer.verl_backend.config import VerlSettings
from rl_backend.trainer.verl_backend.policy import PolicyServer

# The loss registry is per process: every Ray worker that trains registers `agl_rollout` when it starts.
RAY_RUNTIME_ENV = {"worker_process_setup_hook": "rl_backend.trainer.verl_backend.loss.register"}


class VerlTrainer:
    """TorchTrainer's interface (step, train_step, save_checkpoint, serving_state_dict) over verl's worker group."""

    def __init__(self, cfg: Any, settings: VerlSettings, pad_id: int = 0) -> None:
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import TrainingWorkerConfig
        from verl.workers.engine_workers import TrainingWorker

        from rl_backend.trainer.verl_backend.loss import register

        register()
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, runtime_env=RAY_RUNTIME_ENV)
        self.settings, self.pad_id, self.step = settings, pad_id, 0
        ref = cfg.actor_rollout_ref
        self.actor_config = omega_conf_to_dataclass(ref.actor)
        worker_config = TrainingWorkerConfig(
            model_type="language_model", model_config=omega_conf_to_dataclass(ref.model),
            engine_config=omega_conf_to_dataclass(ref.actor.fsdp_config),
            optimizer_config=omega_conf_to_dataclass(ref.actor.optim),
            checkpoint_config=omega_conf_to_dataclass(ref.actor.checkpoint),
        )
        pool = RayResourcePool([settings.gpus_per_node] * settings.nnodes)
        # Methods of TrainingWorker are bound onto the group at run time (verl's @register): typed as Any.
        group = RayWorkerGroup(pool, RayClassWithInitArgs(ray.remote(TrainingWorker), config=worker_config))
        self.workers: Any = cast(Any, group)
        self.workers.reset()
        self.dp_size = settings.nnodes * settings.gpus_per_node
        self.workers.set_loss_fn(self._loss_fn())
        self.checkpoint_root = Path(settings.checkpoint_dir) / "verl"

    def _loss_fn(self) -> Any:
        import functools

        from verl.workers.utils.losses import ppo_loss

        return functools.partial(ppo_loss, self.actor_config)

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        from rl_backend.trainer.verl_backend.data import step_metrics

        totals: dict[str, list[float]] = {}
        for mini in split_by_rollout(batch, 1):  # one optimizer step per epoch over whole rollouts (config.py)
            out = self.workers.train_mini_batch(self._tensordict(mini))
            out = out.get() if hasattr(out, "get") and not isinstance(out, Mapping) else out
            metrics = step_metrics(out[0]["metrics"] if isinstance(out, list) else out["metrics"])
            for key, value in metrics.items():
                totals.setdefault(key, []).append(value)
        self.step += 1
        result = {k: sum(v) / len(v) for k, v in totals.items()}
        result.update(step=float(self.step), rollouts=float(batch.totals.n_rollouts),
                      trained_tokens=float(batch.totals.trained_tokens), sequences=float(len(batch.rows)))
        return result

    def _tensordict(self, mini: TrainBatch) -> Any:
        from tensordict import NonTensorData
        from verl.workers.utils.padding import left_right_2_no_padding

        from rl_backend.trainer.batch import TrainRow
        from rl_backend.trainer.verl_backend.data import RECOMPUTE, to_data_proto

        rows = list(mini.rows)
        while len(rows) % self.dp_size:  # every data-parallel rank gets the same number of rows; padding trains nothing
            rows.append(TrainRow("agl-padding", [self.pad_id, self.pad_id], [0, 1], [0.0, 0.0], 0.0, 0.0))
        dp = to_data_proto(rows, pad_id=self.pad_id, loss_agg=self.settings.loss_agg)
        td = dp.batch
        td["response_mask"] = td["response_mask"] * (~td.pop(RECOMPUTE)).long()
        td = left_right_2_no_padding(td)
        for key, value in (("mini_batch_size", len(rows)), ("epochs", self.settings.ppo_epochs),
                           ("dp_size", self.dp_size), ("batch_num_tokens", mini.totals.trained_tokens),
                           ("global_batch_size", mini.totals.n_sequences),
                           # verl's engine divides the logits by this (no default): 1.0 because the gateway records
                           # the policy's raw logprobs, which is what the loss must compare against.
                           ("temperature", 1.0)):
            td[key] = NonTensorData(value)
        return td

    def save_checkpoint(self, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
        import json

        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self.workers.save_checkpoint(str(path / "actor"), global_step=self.step)
        (path / "trainer_state.json").write_text(json.dumps({"step": self.step, "backend": "verl", **(extra or {})},
                                                            default=str))
        return path

    def serving_state_dict(self) -> dict[str, Any]:
        """Not tensors: where the weights to serve were written (the WeightSink below reads the folder)."""
        folder = self.checkpoint_root / f"serving-step-{self.step}"
        self.save_checkpoint(folder)
        return {"folder": folder / "actor"}


class PolicySink:
    """rl_backend.trainer.loop.WeightSink over the vLLM policy server."""

    def __init__(self, server: PolicyServer) -> None:
        self.server = server
        self.model_version = "base"

    def load_state_dict(self, state_dict: Mapping[str, Any], version: str, timeout_s: float | None = None) -> None:
        folder = Path(state_dict["folder"])
        adapters = sorted(p.parent for p in folder.rglob("adapter_config.json"))
        if self.server.config.lora_rank and adapters:
            self.server.push_adapter(adapters[0])
        else:
            hf = folder / "huggingface"
            if not (hf / "config.json").is_file():
                raise RuntimeError(f"verl wrote no Hugging Face model under {hf}: cannot serve the new weights")
            self.server.push_full_weights(hf)
        self.model_version = version
