"""Launching the verl backend on GPUs: the policy server, then agl's training run with verl as the trainer.

UNTESTED for lack of a GPU (vLLM and verl's FSDP engine need CUDA). Reached only after
runtime.missing_requirements() found CUDA, vLLM, Ray and verl. The run lives under AGL_HOME (in a cluster: on the
checkpoint volume) so a restarted pod with --resume continues the newest verl run of the same spec.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_backend.trainer.verl_backend.config import VerlSettings


def _run_dir(config: Path, spec: Any, options: Any, resume: bool) -> Any:
    from agl_cli.commands.train_cmd import _new_run
    from agl_cli.rundir import runs_root

    if resume:
        from agl_cli.rundir import RunDir

        root = runs_root(None)
        spec_path = str((config / "agl.yaml" if config.is_dir() else config).resolve())
        for folder in sorted(root.glob("*"), reverse=True):  # run ids sort by time
            if not (folder / "manifest.json").is_file():
                continue
            run = RunDir(folder)
            manifest = run.manifest()
            if (manifest.get("kind") == "train" and manifest.get("spec_path") == spec_path
                    and (manifest.get("options") or {}).get("backend") == "verl"):
                return run
    return _new_run(config, options, None)[1]


def run_on_gpus(config: Path, spec: Any, options: Any, settings: VerlSettings, verl_config: Any, *,
                log: Callable[[str], None], on_step: Callable[[Any], None]) -> dict[str, Any]:
    from agl_cli.tasks import load_tasks, select_tasks
    from agl_cli.training import Trainer
    from rl_backend.trainer.verl_backend.driver import PolicySink, VerlTrainer
    from rl_backend.trainer.verl_backend.policy import PolicyServer, PolicyServerConfig

    run = _run_dir(config, spec, options, settings.resume)
    server = None
    if not os.environ.get("AGL_POLICY_URL"):
        server = PolicyServer(PolicyServerConfig(
            model_path=settings.model_path, served_name=_served_name(spec), port=int(os.environ.get("AGL_POLICY_PORT") or 8000),
            tensor_parallel=settings.tensor_parallel, gpu_memory_utilization=settings.gpu_memory_utilization,
            max_model_len=settings.max_prompt_length + settings.max_response_length,
            lora_rank=settings.lora_rank), log_path=run.path / "vllm.log")
        log(f"starting the vLLM policy server on port {server.config.port} ({settings.model_path})")
        server.start(_initial_adapter(settings, run.path) if settings.lora_rank else None)
        os.environ["AGL_POLICY_URL"] = server.url  # the stack's gateway forwards the embedded upstream here
    tasks = load_tasks(spec)

    class _VerlRun(Trainer):
        def _trainer(self, checkpoints: Path) -> Any:
            return VerlTrainer(verl_config, settings)

        def _engine(self, stack: Any) -> Any:
            if server is None:
                raise RuntimeError("AGL_POLICY_URL names a policy server agl did not start: it cannot push weights")
            return PolicySink(server)

    trainer = _VerlRun(spec, run, options, select_tasks(tasks, split=options.train_split, limit=None),
                       select_tasks(tasks, split=options.heldout_split, limit=options.heldout_limit), log=log)
    try:
        return trainer.run(on_step)
    finally:
        if server is not None:
            server.stop()


def _served_name(spec: Any) -> str:
    from agl_cli.training import trained_upstream

    return str(spec.upstreams[trained_upstream(spec)].model)


def _initial_adapter(settings: VerlSettings, folder: Path) -> Path:
    """A LoRA adapter whose delta is zero (peft initialises B to 0): vLLM serves the base model under the adapter's name."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    target = folder / "initial-adapter"
    if not (target / "adapter_config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(settings.model_path)
        peft = get_peft_model(model, LoraConfig(r=settings.lora_rank, lora_alpha=settings.lora_alpha,
                                                target_modules="all-linear", task_type="CAUSAL_LM"))
        peft.save_pretrained(str(target))
    return target
