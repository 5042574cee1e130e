"""verl's PPO trainer, driven by agl's training loop: verl does what verl does, agl supplies the rollouts.

verl's `RayPPOTrainer` owns the machinery: the hybrid actor/rollout/reference worker group on Ray (FSDP engine),
the rollout servers as Ray actors (`LLMServerManager`: vLLM replicas on GPUs, one per tensor-parallel group; agl's
embedded engine on a CPU, see embedded_policy.py), the weight sync into them (`CheckpointEngineManager`), the
old-logprob recompute, the reference policy (in the actor for LoRA, without the adapter), the rollout correction,
the actor update, and the checkpoint layout with `save_checkpoint`/`load_checkpoint`. `AglPPOTrainer` subclasses it
and replaces only what agl does differently: no dataset (the unchanged agent samples through agl's gateway, which
forwards the policy's calls to the replicas' OpenAI servers), and one optimizer step per epoch over the whole batch
of whole rollouts (agl's rollout normalization is over the batch; see loss.py).

`VerlTrainer` is the `PolicyTrainer` agl's `TrainingLoop` (rl_backend/trainer/loop.py) asks for, and
`VerlWeightSink` its `WeightSink` (both in rl_backend/trainer/interfaces.py), so the loop, its step rows, curves and
kill/resume logic are the same for both backends. A checkpoint is `step-<n>/actor/` in verl's own layout (sharded
model, optimizer and extra state, `huggingface/` with the servable model, LoRA metadata) plus agl's
`trainer_state.json`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rl_backend.gateway.config import POLICY_KEY_ENV
from rl_backend.trainer.batch import TrainBatch
from rl_backend.trainer.interfaces import Gate
from rl_backend.trainer.verl_backend.config import VerlSettings
from rl_backend.trainer.verl_backend.listen import POLICY_HOST_ENV, own_ray_policy_host
from rl_backend.trainer.verl_backend.plugins import SETUP_HOOK, register_all
from rl_backend.trainer.verl_backend.ray_head import RayHeadError, pinned_ports, start_head

log = logging.getLogger(__name__)


class VerlLaunchError(RuntimeError):
    """The cluster verl would run on cannot hold what the config asks for; the message says what to change."""


def _trainer_class() -> type:
    from omegaconf import open_dict
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, Role
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    class AglPPOTrainer(RayPPOTrainer):
        def _create_dataloader(self, *args: Any, **kwargs: Any) -> None:
            # No dataset: each step's prompts are whatever the agent sends through the gateway.
            self.train_dataloader = None
            self.total_training_steps = int(self.config.trainer.total_training_steps)
            with open_dict(self.config):
                self.config.actor_rollout_ref.actor.optim.total_training_steps = self.total_training_steps

        def init_workers(self) -> None:
            """verl's own pieces, minus the dataset-driven agent loop and reward loop agl does not use."""
            from verl.checkpoint_engine import CheckpointEngineManager
            from verl.single_controller.ray import RayClassWithInitArgs
            from verl.single_controller.ray.base import create_colocated_worker_cls
            from verl.utils.config import omega_conf_to_dataclass
            from verl.workers.rollout.llm_server import LLMServerManager

            self.resource_pool_manager.create_resource_pool()
            role = Role.ActorRolloutRef if Role.ActorRolloutRef in self.role_worker_mapping else Role.ActorRollout
            pool = self.resource_pool_manager.get_resource_pool(role)
            worker = RayClassWithInitArgs(cls=self.role_worker_mapping[role], config=self.config.actor_rollout_ref,
                                          role=str(role))
            group = self.ray_worker_group_cls(resource_pool=pool,
                                              ray_cls_with_init=create_colocated_worker_cls(class_dict={str(role): worker}),
                                              device_name=self.device_name)
            self.actor_rollout_wg = group.spawn(prefix_set={str(role)})[str(role)]
            self.actor_rollout_wg.init_model()
            # The reference policy lives in the actor's worker: a model of its own (full fine-tuning) or the actor
            # without its LoRA adapter; verl's _compute_ref_log_prob picks the call.
            self.ref_policy_wg = self.actor_rollout_wg
            self.async_rollout_mode = True
            self.llm_server_manager = LLMServerManager.create(config=self.config, worker_group=self.actor_rollout_wg,
                                                              rollout_resource_pool=pool)
            manager: Any = CheckpointEngineManager(
                config=omega_conf_to_dataclass(self.config.actor_rollout_ref.rollout.checkpoint_engine),
                actor_wg=self.actor_rollout_wg, replicas=self.llm_server_manager.get_replicas())
            self.checkpoint_manager = manager
            manager.sleep_replicas()

        def _update_actor(self, batch: Any) -> Any:
            """verl's update, with one mini-batch: the whole batch (verl would cut it in ppo_mini_batch_size * n
            rows, but agl's rows are sequences, several per rollout when a trajectory does not merge)."""
            from verl import DataProto

            actor = self.config.actor_rollout_ref.actor
            data = left_right_2_no_padding(batch.to_tensordict())
            tu.assign_non_tensor(
                data, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
                global_batch_size=int(batch.meta_info["n_sequences"]), mini_batch_size=len(batch),
                epochs=int(actor.ppo_epochs), seed=int(actor.data_loader_seed),
                dataloader_kwargs={"shuffle": False}, compute_loss=True,
            )
            output = tu.get(self.actor_rollout_wg.update_actor(data), "metrics")
            return DataProto.from_single_dict(data={}, meta_info={"metrics": output})

    return AglPPOTrainer


def _resource_pool_manager(settings: VerlSettings) -> Any:
    from verl.plugin.platform import get_platform
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager, Role

    class AglResourcePoolManager(ResourcePoolManager):
        def _check_resource_available(self) -> None:
            import ray

            resource = get_platform().ray_resource_name()
            have = sum(node.get(resource, 0) for node in ray._private.state.available_resources_per_node().values())
            need = sum(sum(nodes) for nodes in self.resource_pool_spec.values())
            if have < need:
                raise VerlLaunchError(f"verl needs {need} {resource} ({settings.nnodes} node(s) x "
                                      f"{settings.gpus_per_node}) in the Ray cluster, which has {have:g} free")

    role = Role.ActorRolloutRef if settings.kl_coef > 0 and not settings.lora_rank else Role.ActorRollout
    # One process per device: FSDP runs the actor, the rollout adapter and the reference in the same process, so
    # each bundle needs one CPU and one device (verl's default asks for 3 to 10 CPUs per device).
    mapping: Any = {role: "global_pool"}  # verl annotates the mapping's keys as int; they are Roles
    manager = AglResourcePoolManager(resource_pool_spec={"global_pool": [settings.gpus_per_node] * settings.nnodes},
                                     mapping=mapping, max_colocate_count=1)
    return manager, role


# verl's KL estimate between the sampled and the recomputed logprobs past which a step says so: float32 servers on a
# CPU agree to ~1e-7, bfloat16 ones on GPUs to ~1e-3.
KL_WARNING = 0.01


def _init_ray(init: Callable[[], Any], say: Callable[[str], None], attempts: int = 3) -> None:
    """`init()` (ray.init), again when a local Ray's node misses the 30 s Ray gives it to register (a fixed limit
    in Ray, which a loaded machine's start-up can exceed).

    SIGTERM keeps the handler it had: Ray's driver init installs its own (`sys.exit`, and a C++ failure handler
    that aborts the process), so the SIGTERM a pod gets when its train is stopped would kill the trainer before the
    rollout controller's `close()` deletes its Jobs. agl's own (agl_cli.evaluation.interrupts: SIGTERM as Ctrl-C) must stay."""
    import ray

    previous = signal.getsignal(signal.SIGTERM)
    try:
        for attempt in range(1, attempts + 1):
            try:
                init()
                return
            except Exception as exc:
                if attempt == attempts or "timed out during startup" not in str(exc):
                    raise
                say(f"Ray's node did not register within Ray's 30 s start-up limit (a loaded machine?): starting it "
                    f"again ({attempt + 1} of {attempts})")
                ray.shutdown()
    finally:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


class VerlTrainer:
    """The trainer agl's TrainingLoop drives (step, train_step, save_checkpoint, serving_state_dict), over verl."""

    def __init__(self, cfg: Any, settings: VerlSettings, *, log_fn: Callable[[str], None] | None = None,
                 gate: Gate | None = None) -> None:
        """`gate` holds the policy's calls at the gateway while the rollout servers are asleep (from the update's
        start until the new weights are synced): a call that reached a sleeping vLLM would find no weights."""
        self.cfg, self.settings = cfg, settings
        self.log = log_fn or log.info
        self.step = 0
        self.gate = gate
        self._held = False
        self._ppo: Any = None

    # ---- lifecycle ---------------------------------------------------------------------------------------------

    def start(self, resume_from: Path | None = None) -> list[str]:
        """Start Ray (unless already), verl's workers and rollout servers, load `resume_from` (a step-<n>
        checkpoint folder) when given, and serve the trainer's weights; returns the servers' addresses."""
        import ray
        from verl.utils import hf_tokenizer

        from rl_backend.trainer.verl_backend.worker import AglActorRolloutRefWorker

        if self.settings.device == "cpu":
            os.environ["VERL_PLATFORM"] = "cpu"
        register_all()
        if not ray.is_initialized():
            env = {k: os.environ[k] for k in ("VERL_PLATFORM", "AGL_POLICY_THREADS", "AGL_MODEL_CACHE",
                                              "TOKENIZERS_PARALLELISM") if k in os.environ}
            if os.environ.get(POLICY_KEY_ENV):
                # vLLM's OpenAI server then refuses calls without this key (the gateway sends it).
                env["VLLM_API_KEY"] = os.environ[POLICY_KEY_ENV]
            cluster = os.environ.get("RAY_ADDRESS") or None
            num_cpus = self.settings.ray_num_cpus
            if cluster is None:
                # A Ray of this process's own: the rollout servers listen on loopback (Ray itself will not use a
                # loopback node address), since only this machine's gateway calls them; in a trainer Job's pod, on
                # the pod's address, which the deployed gateway calls.
                env[POLICY_HOST_ENV] = own_ray_policy_host(os.environ)
                try:
                    ports = pinned_ports(os.environ)
                    if ports is not None:  # a trainer Job's pod: Ray's listeners outside the gateway's ports
                        cluster, num_cpus = start_head(ports, num_cpus), None
                        self.log(f"started Ray's head with its ports pinned ({', '.join(sorted(ports.values()))})")
                except RayHeadError as exc:
                    raise VerlLaunchError(str(exc)) from None
            _init_ray(lambda: ray.init(address=cluster, num_cpus=num_cpus,
                                       runtime_env={"worker_process_setup_hook": SETUP_HOOK, "env_vars": env},
                                       include_dashboard=False, log_to_driver=True),
                      self.log)
        pool, role = _resource_pool_manager(self.settings)
        tokenizer = hf_tokenizer(self.settings.model_path)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        self._ppo = _trainer_class()(config=self.cfg, tokenizer=tokenizer,
                                     role_worker_mapping={role: ray.remote(AglActorRolloutRefWorker)},
                                     resource_pool_manager=pool, device_name=self.settings.device)
        self._ppo.init_workers()
        if resume_from is not None:
            self.load_checkpoint(resume_from)
        self._ppo.global_steps = self.step
        self.sync_weights()
        return self.addresses

    @property
    def addresses(self) -> list[str]:
        """host:port of each rollout server (one per replica), in replica order."""
        return list(self._ppo.llm_server_manager.get_addresses())

    @property
    def served_model(self) -> str:
        """The model name the rollout servers answer to: vLLM serves the model's path, the embedded server its
        own name for it."""
        if self.settings.rollout_name == "vllm":
            return self.settings.model_path
        import ray

        handle = self._ppo.llm_server_manager.get_replicas()[0].server_handle
        return str(ray.get(handle.served_model.remote()))

    def sync_weights(self) -> None:
        """verl's weight sync: the actor's weights into every rollout server (they wake up to serve them); then the
        policy's calls held since the servers went to sleep flow again, recorded as served by the new weights."""
        self._ppo.checkpoint_manager.update_weights(self.step)
        if self._held and self.gate is not None:
            self._held = False
            resumed = self.gate.resume(f"step-{self.step}")
            if resumed.get("calls_held"):
                self.log(f"{resumed['calls_held']} policy call(s) waited for the step-{self.step} weights")

    def sleep_replicas(self) -> None:
        """The rollout servers give their device memory to the update (vLLM's level-2 sleep discards the weights):
        the gateway first stops admitting the policy's calls and lets those in flight finish; sync_weights lets
        them flow again."""
        if self.gate is not None and not self._held:
            self.gate.pause()
            self._held = True
        self._ppo.checkpoint_manager.sleep_replicas()

    def close(self) -> None:
        import ray

        if self._ppo is not None and self.settings.rollout_name != "vllm":
            for replica in self._ppo.llm_server_manager.get_replicas():
                for server in replica.servers:
                    ray.get(server.shutdown.remote())
        if ray.is_initialized() and not os.environ.get("RAY_ADDRESS"):
            ray.shutdown()

    # ---- the loop's trainer interface -------------------------------------------------------------------------

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One update on `batch` the way verl's fit() makes one, from its recompute of the old logprobs on."""
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
        from verl.utils.debug.metrics import calculate_debug_metrics

        from rl_backend.trainer.verl_backend.data import fill_unrecorded, pad_rows, step_metrics, to_data_proto

        ppo = self._ppo
        self.sleep_replicas()  # the update gets the device memory the servers held
        rows = pad_rows(batch.rows, self.settings.world_size, self.pad_id)
        data = to_data_proto(rows, pad_id=self.pad_id, loss_agg=self.settings.loss_agg,
                             meta={"n_sequences": len(batch.rows)})
        data.meta_info["global_token_num"] = data.batch["attention_mask"].sum(dim=-1).tolist()
        old, _mfu = ppo._compute_old_log_prob(data)
        entropys = old.batch.pop("entropys")
        data = data.union(old)
        metrics: dict[str, float] = {"unrecorded_logprob_tokens": float(fill_unrecorded(data))}
        mask = data.batch["response_mask"].bool()
        if mask.any():
            metrics["entropy"] = float(entropys[mask].float().mean())
        if ppo.use_reference_policy:
            data = data.union(ppo._compute_ref_log_prob(data))
        metrics.update(step_metrics(calculate_debug_metrics(data)))
        data, correction = compute_rollout_correction_and_add_to_batch(data, self.cfg.algorithm.rollout_correction)
        metrics.update(step_metrics(correction))
        if metrics.get("rollout_corr_kl", 0.0) > KL_WARNING:
            self.log(f"warning: the logprobs the policy server returned while sampling differ from the trainer's "
                     f"(verl's rollout_corr_kl {metrics['rollout_corr_kl']:.3g}): tokens drawn under a grammar "
                     "(a `tool_choice` naming a tool, `required`, `strict` tools, `response_format`) or sampling "
                     "settings the loss does not model; the rollout correction truncates their weights")
        out = ppo._update_actor(data)
        metrics.update(step_metrics(out.meta_info["metrics"]))
        self.step += 1
        ppo.global_steps = self.step
        metrics.update(step=float(self.step), rollouts=float(batch.totals.n_rollouts),
                       trained_tokens=float(batch.totals.trained_tokens), sequences=float(len(batch.rows)))
        return {k: v for k, v in metrics.items() if not math.isnan(v)}

    def save_checkpoint(self, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """verl's checkpoint of the actor under `directory/actor`, then agl's trainer_state.json (written last:
        its presence marks the checkpoint complete)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self._ppo.actor_rollout_wg.save_checkpoint(str(path / "actor"), None, self.step, max_ckpt_to_keep=None)
        state = {"step": self.step, "backend": "verl", "model_path": self.settings.model_path, **(extra or {})}
        (path / "trainer_state.json").write_text(json.dumps(state, default=str))
        return path

    def load_checkpoint(self, directory: Path) -> None:
        """verl's load_checkpoint of the actor (model, optimizer, scheduler, RNG), and agl's step."""
        state = json.loads((directory / "trainer_state.json").read_text())
        self._ppo.actor_rollout_wg.load_checkpoint(str(directory / "actor"), del_local_after_load=False)
        self.step = int(state["step"])
        self.log(f"resumed verl's actor from {directory} (step {self.step})")

    def serving_state_dict(self) -> dict[str, Any]:
        """Nothing to hand over: verl syncs the weights into the rollout servers itself (VerlWeightSink)."""
        return {}


class VerlWeightSink:
    """The loop's serving engine: after an update, verl's weight sync; `on_version` tells whoever records calls
    (the gateway) which weights now serve."""

    def __init__(self, trainer: VerlTrainer, on_version: Callable[[str], None] | None = None) -> None:
        self.trainer = trainer
        self.on_version = on_version or (lambda version: None)
        self.model_version = f"step-{trainer.step}"
        self.on_version(self.model_version)

    def load_state_dict(self, state_dict: Mapping[str, Any], version: str, timeout_s: float | None = None) -> None:
        self.trainer.sync_weights()
        self.model_version = version
        self.on_version(version)
