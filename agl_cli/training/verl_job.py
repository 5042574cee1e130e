"""`agl train --backend verl`: the same training run as the torch backend's (agl_cli/training/sync_job.py), with verl's
trainer making the updates and verl's rollout servers serving the policy.

What differs from the torch backend is only the backend: `VerlTrainer` (rl_backend/trainer/verl_backend/trainer.py)
starts verl's workers and rollout servers, the gateway is told where those servers are (in-process, or the deployed
gateway's admin API in a cluster), verl syncs new weights into them, and the trained model is exported from verl's
checkpoint. Rollouts, trajectories, advantages, step rows, the before/after comparison and kill/resume are the
run's, as for the torch backend.

The run lives under the runs folder (AGL_HOME; in a cluster, on the checkpoint volume): `--resume` continues the
newest verl run of the same spec, from its newest checkpoint.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agl_cli.errors import ConfigError
from agl_cli.evaluation.services import RunServices
from agl_cli.runs.rundir import RunDir
from agl_cli.spec.schema import ExperimentSpec
from agl_cli.training.sync_job import TrainingRun, TrainOptions, trained_upstream
from rl_backend.gateway.config import POLICY_KEY_ENV

if TYPE_CHECKING:
    from rl_backend.trainer.interfaces import PolicyTrainer, WeightSink

TRAINED_ADAPTER_DIR = "trained-adapter"


def _int_env(name: str, default: int) -> int:
    text = os.environ.get(name)
    try:
        return default if not text else int(text)
    except ValueError:
        raise ConfigError(f"${name} must be an integer, got {text!r}") from None


def verl_settings(spec: ExperimentSpec, options: TrainOptions, *, device: str, policy_server: str,
                  tensor_parallel: int, gpu_memory_utilization: float, lora_rank: int,
                  tool_call_parser: str | None = None, rollout_dtype: str | None = None,
                  max_prompt_length: int | None = None, max_response_length: int | None = None) -> Any:
    """The VerlSettings of this spec and these options (the GPU topology from the environment a cluster gives the
    trainer pod: AGL_TRAIN_NODES, AGL_GPUS_PER_NODE). vLLM's tool-call parser: `tool_call_parser` (the flag), else the
    trained upstream's `tool_call_parser:`, else the model family's. Prompt and response lengths likewise: the flag,
    else the upstream's, else the defaults fitted to the model's context (verl_backend.config.fit_lengths)."""
    from rl_backend.trainer.verl_backend.config import (
        VerlSettings,
        default_attention,
        fit_lengths,
        model_max_len,
        model_path_for,
    )
    from rl_backend.trainer.verl_backend.vllm_tools import tool_call_parser as parser_for

    upstream = spec.upstreams[trained_upstream(spec)]
    model_path = model_path_for(str(upstream.model), spec.base_dir)
    limit = model_max_len(model_path)
    prompt, response = fit_lengths(max_prompt_length if max_prompt_length is not None else upstream.max_prompt_length,
                                   max_response_length if max_response_length is not None
                                   else upstream.max_response_length, limit)
    return VerlSettings(
        spec_name=spec.name, model_path=model_path, steps=options.steps,
        lr=options.lr, loss_agg=options.loss_agg, kl_coef=options.kl_coef,
        lora_rank=lora_rank if options.lora else 0, tensor_parallel=tensor_parallel,
        gpu_memory_utilization=gpu_memory_utilization, nnodes=_int_env("AGL_TRAIN_NODES", 1),
        gpus_per_node=_int_env("AGL_GPUS_PER_NODE", 1), device=device, policy_server=policy_server,
        attn_implementation=default_attention(),
        tool_call_parser=parser_for(model_path, tool_call_parser or upstream.tool_call_parser),
        rollout_dtype=rollout_dtype, temperature=options.temperature,
        max_prompt_length=prompt, max_response_length=response, model_max_len=limit,
    )


def render_config(settings: Any) -> tuple[str, Any]:
    """(the YAML overrides agl hands verl, the full config validated against verl's schema)."""
    from agl_cli.templates import render
    from rl_backend.trainer.verl_backend.config import TEMPLATE, VerlConfigError, validate, verl_version

    try:
        settings.check()
        text = render(TEMPLATE, s=settings, verl_version=verl_version())
        return text, validate(text, settings)
    except VerlConfigError as exc:
        raise ConfigError(str(exc)) from None


def newest_verl_run(spec_path: Path, runs_dir: Path | None) -> RunDir | None:
    """The newest verl training run of the spec at `spec_path`, if any (what `--resume` continues)."""
    from agl_cli.runs.rundir import RunsIndex

    runs = [r for r in RunsIndex.scan(runs_dir).select(kind="train", spec=spec_path)
            if (r.manifest.get("options") or {}).get("backend") == "verl"]
    return runs[-1].run if runs else None


class VerlTrainingRun(TrainingRun):
    """A training run whose trainer is verl's (see the module docstring)."""

    policy_served_by_trainer = True

    def __init__(self, *args: Any, verl_config: Any, settings: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.verl_config, self.settings = verl_config, settings
        self._verl: Any = None

    def _start_backend(self, stack: RunServices, checkpoints: Path) -> tuple[PolicyTrainer, WeightSink]:
        from rl_backend.trainer.loop import latest_checkpoint
        from rl_backend.trainer.verl_backend.trainer import VerlLaunchError, VerlTrainer, VerlWeightSink

        resume_from = latest_checkpoint(checkpoints)
        self.log(f"starting verl ({self.settings.device}, {self.settings.world_size} device(s), rollout servers: "
                 f"{self.settings.rollout_name})" + (f"; resuming from {resume_from.name}" if resume_from else ""))
        from agl_cli.training.async_job import GatewayGate

        gate = GatewayGate(stack.gateway) if stack.gateway is not None else None
        self._verl = VerlTrainer(self.verl_config, self.settings, log_fn=self.log, gate=gate)
        try:
            addresses = self._verl.start(resume_from=resume_from)
        except VerlLaunchError as exc:
            raise ConfigError(str(exc)) from None
        if self.settings.rollout_name == "vllm":
            parser = self.settings.tool_call_parser
            self.log(f"vLLM's tool-call parser: {parser} (the upstream's `tool_call_parser:` or --tool-call-parser "
                     "sets another)" if parser else "vLLM runs without a tool-call parser: agents cannot send `tools`")
        urls = [f"http://{address}/v1" for address in addresses]
        stack.set_endpoints(self.upstream, urls, self._verl.served_model)
        self.log(f"the policy ({self.upstream!r}) is served by {len(urls)} rollout server(s): {', '.join(urls)}")
        return self._verl, VerlWeightSink(self._verl, on_version=stack.set_model_version)

    def run(self, on_step: Callable[[Any], None]) -> dict[str, Any]:
        # The policy servers refuse calls without this key (vLLM's --api-key); the gateway sends it, no agent or
        # grader gets it (evaluation.AGL_CREDENTIALS). A cluster's trainer pod has one from its Secret.
        os.environ.setdefault(POLICY_KEY_ENV, secrets.token_urlsafe(32))
        return super().run(on_step)

    def _stop_backend(self) -> None:
        if self._verl is not None:
            self._verl.close()

    def _export(self, final: Path) -> dict[str, str]:
        from agl_cli.training.sync_job import TRAINED_DIR
        from rl_backend.trainer.verl_backend.export import export_trained

        adapter = self.run_dir.path / TRAINED_ADAPTER_DIR if self.settings.lora_rank else None
        return export_trained(final / "actor", self.run_dir.path / TRAINED_DIR, adapter)
