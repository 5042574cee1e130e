"""agl's embedded engine as a verl rollout server: what serves the policy when there is no GPU (and so no vLLM).

verl's hybrid engine has two halves for every rollout backend, and this module fills both for `agl_embedded`:
- `EmbeddedReplica` (a verl `RolloutReplica`, driver side): launches one `EmbeddedPolicyServer` Ray actor per
  replica on the node of its workers; its address is what the gateway forwards the policy's calls to.
- `EmbeddedRollout` (a verl `BaseRollout`, inside each actor worker): verl's weight sync (`update_weights`, the
  "naive" checkpoint engine of colocated training) hands it the new weights, which it sends to its replica's server.
  A LoRA run with `lora.merge: false` sends only the adapter: the server keeps the base weights and serves
  base + scale * B @ A (the adapter hot-load); merged or full weights replace the served ones (the full reload).

The server is agl's OpenAI-compatible embedded server (rl_backend/serving): token ids and logprobs like vLLM's, and
the model version of the weights it served, so the gateway records exactly what trajectories need.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any

ROLLOUT_NAME = "agl_embedded"
SERVER_PREFIX = "agl_policy_server_"


def server_name(replica_rank: int) -> str:
    return f"{SERVER_PREFIX}{replica_rank}"


def merge_adapter(base: Mapping[str, Any], adapter: Mapping[str, Any], peft_config: Mapping[str, Any]) -> dict[str, Any]:
    """The served weights for a LoRA adapter: W = W_base + (alpha / r) * B @ A for each adapted linear layer.

    Adapter keys are peft's (`...q_proj.lora_A.weight`, possibly under `base_model.model.`); the base keys are the
    model's own (`...q_proj.weight`). Raises ValueError when an adapter layer has no base weight to add to."""
    rank = int(peft_config.get("r") or peft_config.get("lora_rank") or 0)
    alpha = float(peft_config.get("lora_alpha") or rank or 1)
    if rank <= 0:
        raise ValueError(f"a LoRA adapter needs a rank > 0 in its config, got {dict(peft_config)}")
    scale = alpha / rank
    pairs: dict[str, dict[str, Any]] = {}
    for key, tensor in adapter.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in key:
                layer = key.split(marker)[0].removeprefix("base_model.model.")
                pairs.setdefault(layer, {})[part] = tensor
    if not pairs:
        raise ValueError(f"the adapter has no lora_A/lora_B weights (keys such as {sorted(adapter)[:3]})")
    merged = dict(base)
    for layer, ab in pairs.items():
        target = f"{layer}.weight"
        if target not in base or set(ab) != {"lora_A", "lora_B"}:
            raise ValueError(f"adapter layer {layer!r} has no base weight {target!r} (or lacks lora_A/lora_B)")
        # verl's sync hands the adapter over as CPU tensors; the base lives where the server's model runs (a GPU)
        device = base[target].device
        delta = (ab["lora_B"].to(device).float() @ ab["lora_A"].to(device).float()) * scale
        merged[target] = (base[target].float() + delta).to(base[target].dtype)
    return merged


class EmbeddedPolicyServer:
    """The body of the policy server actor: an embedded server on this node, and weight swaps into it."""

    def __init__(self, model_path: str, threads: int | None = None) -> None:
        from rl_backend.serving.server import start_embedded_server
        from rl_backend.trainer.verl_backend.listen import policy_host

        host = policy_host()
        self.server = start_embedded_server(model=model_path, host=host, port=0, threads=threads)
        engine = self.server.engine
        # The base weights, kept for the adapter hot-load (the served weights change with every merged adapter).
        self._base = {k: v.detach().clone() for k, v in engine.loaded.model.state_dict().items()}

    def address(self) -> str:
        """host:port of the OpenAI-compatible server (the gateway calls http://<address>/v1)."""
        return self.server.base_url.removeprefix("http://")

    def served_model(self) -> str:
        return str(self.server.model)

    def model_version(self) -> str:
        return str(self.server.engine.model_version)

    def load_weights(self, tensors: dict[str, Any], version: str, peft_config: dict[str, Any] | None = None) -> None:
        """Serve `tensors` as `version`: a LoRA adapter merged onto the base weights, else model weights."""
        if peft_config:
            tensors = merge_adapter(self._base, tensors, peft_config)
        self.server.engine.load_state_dict(tensors, version)

    # verl drives a replica's servers through these; the embedded engine holds no device memory worth freeing.
    def sleep(self) -> None:
        return None

    def wake_up(self) -> None:
        return None

    def clear_kv_cache(self) -> None:
        return None

    def release_kv_cache(self) -> None:
        return None

    def resume_kv_cache(self) -> None:
        return None

    def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    def resume_generation(self) -> None:
        return None

    def shutdown(self) -> None:
        self.server.stop()


@functools.cache
def _replica_class() -> type:
    from verl.workers.rollout.replica import RolloutReplica

    class EmbeddedReplica(RolloutReplica):
        """One embedded policy server per replica, on the node of the replica's first worker."""

        def rollout_worker_use_gpu(self) -> bool:
            return False

        async def launch_servers(self) -> None:
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            from verl.plugin.platform import get_platform
            from verl.utils.config import omega_conf_to_dataclass
            from verl.utils.device import get_resource_name

            from rl_backend.trainer.verl_backend.cpu import PLATFORM

            platform = get_platform()
            node_id, devices = await self.workers[0].__ray_call__.remote(
                lambda worker: (ray.get_runtime_context().get_node_id(),
                                ray.get_runtime_context().get_accelerator_ids().get(get_resource_name(), [])))
            env: dict[str, str] = {}
            if platform.device_name != PLATFORM:
                # On the device of the replica's first worker, as verl places its vLLM servers: Ray would hide
                # every GPU from an actor that asks for none.
                env = {**{var: "1" for var in platform.ray_noset_envvars()},
                       platform.visible_devices_envvar(): ",".join(map(str, devices))}
            threads = int(os.environ["AGL_POLICY_THREADS"]) if os.environ.get("AGL_POLICY_THREADS") else None
            server = ray.remote(EmbeddedPolicyServer).options(
                name=server_name(self.replica_rank), num_cpus=0, max_concurrency=4, runtime_env={"env_vars": env},
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            ).remote(model_path=omega_conf_to_dataclass(self.model_config).local_path, threads=threads)
            self.servers = [server]
            self._server_handle = server
            self._server_address = await server.address.remote()

    return EmbeddedReplica


@functools.cache
def _rollout_class() -> type:
    from verl.workers.rollout.base import BaseRollout

    class EmbeddedRollout(BaseRollout):
        """The worker-side half: forwards verl's weight sync to this replica's policy server."""

        def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
            super().__init__(config, model_config, device_mesh)
            size = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                    * self.config.pipeline_model_parallel_size)
            rank = int(os.environ.get("RANK", "0"))
            self.replica_rank = rank // size if replica_rank < 0 else replica_rank
            self.sends = rank % size == 0  # one rank per replica talks to its server
            self._server: Any = None

        async def resume(self, tags: list[str]) -> None:
            return None

        async def release(self) -> None:
            return None

        async def update_weights(self, weights: Iterable[Any], wire_format: str = "named_tensors",
                                 **kwargs: Any) -> None:
            if wire_format != "named_tensors":
                raise ValueError(f"the embedded policy server takes named tensors, not {wire_format!r}")
            # Every rank consumes the generator: with FSDP it gathers each tensor across ranks as it goes.
            tensors = {name: tensor.detach().to("cpu").clone() for name, tensor in weights}
            if not self.sends:
                return
            import ray

            if self._server is None:
                self._server = ray.get_actor(server_name(self.replica_rank))
            peft = kwargs.get("peft_config")
            peft_dict = dict(peft.to_dict() if hasattr(peft, "to_dict") else peft) if peft else None
            step = kwargs.get("global_steps")
            await self._server.load_weights.remote(tensors, f"step-{step or 0}", peft_dict)

    return EmbeddedRollout


EMBEDDED_ROLLOUT_FQN = f"{__name__}.EmbeddedRollout"


def __getattr__(name: str) -> Any:
    # verl's rollout registry imports the worker-side class by its dotted name; built lazily so that importing
    # this module does not import verl.
    if name == "EmbeddedRollout":
        return _rollout_class()
    if name == "EmbeddedReplica":
        return _replica_class()
    raise AttributeError(name)
