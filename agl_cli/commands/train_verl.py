"""`agl train CONFIG --backend verl [--resume] [--dry-run]`: training on GPUs with verl, what the trainer image runs.

The same rollouts, trajectories, GRPO advantages and rollout-normalized loss as the torch backend; verl's FSDP
engine makes the update and a vLLM server the trainer starts serves the policy (rl_backend/trainer/verl_backend/).
Settings come from the options and from the environment `agl train --on kubernetes` gives the trainer pod
(rl_backend/provision/plan.py: trainer_env): AGL_CHECKPOINT_DIR, AGL_TRAIN_NODES, AGL_GPUS_PER_NODE,
AGL_POLICY_PORT, AGL_GATEWAY_URL, AGL_GATEWAY_ADMIN_TOKEN; AGL_POLICY_URL when the policy is served elsewhere.

On stdout: one JSON object per training step (a line with a `step` key: what rl_backend/provision/metrics.py reads
from the trainer's log), or with --dry-run the rendered verl config. Progress goes to stderr.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from agl_cli.cli_support import handle_errors

ENV_KEYS = ("AGL_CHECKPOINT_DIR", "AGL_TRAIN_NODES", "AGL_GPUS_PER_NODE", "AGL_POLICY_PORT", "AGL_POLICY_URL",
            "AGL_GATEWAY_URL", "AGL_HOME")
STEP_KEYS = ("reward_mean", "pass_rate", "loss", "entropy", "kl", "grad_norm", "tokens_per_s", "rollouts_per_min",
             "trained_rollouts", "rollouts", "updated", "model_version", "checkpoint")


def step_row(record: Any) -> dict[str, Any]:
    """The JSON object printed for one step (a rl_backend.trainer.curves.StepRecord)."""
    row: dict[str, Any] = {"step": record.step}
    for key in STEP_KEYS:
        value = getattr(record, key, None)
        row[key] = str(value) if isinstance(value, Path) else value
    return row


def step_line(record: Any) -> str:
    return json.dumps(step_row(record), default=str, separators=(",", ":"))


def _int_env(name: str, default: int) -> int:
    from agl_cli.errors import ConfigError

    text = os.environ.get(name)
    try:
        return default if not text else int(text)
    except ValueError:
        raise ConfigError(f"${name} must be an integer, got {text!r}") from None


def settings_for(spec: Any, options: Any, *, resume: bool, tensor_parallel: int, gpu_memory_utilization: float,
                 lora_rank: int) -> Any:
    from agl_cli.training import trained_upstream
    from rl_backend.trainer.verl_backend.config import VerlSettings, model_path_for

    upstream = spec.upstreams[trained_upstream(spec)]
    return VerlSettings(
        spec_name=spec.name, model_path=model_path_for(str(upstream.model), spec.base_dir), steps=options.steps,
        tasks_per_step=options.tasks_per_step, group_size=options.group_size, lr=options.lr,
        temperature=options.temperature, loss_agg=options.loss_agg, kl_coef=options.kl_coef,
        lora_rank=lora_rank if options.lora else 0, tensor_parallel=tensor_parallel,
        gpu_memory_utilization=gpu_memory_utilization, nnodes=_int_env("AGL_TRAIN_NODES", 1),
        gpus_per_node=_int_env("AGL_GPUS_PER_NODE", 1),
        checkpoint_dir=os.environ.get("AGL_CHECKPOINT_DIR") or str(Path(".agl") / "verl-checkpoints"),
        keep_checkpoints=options.keep_checkpoints, resume=resume,
    )


@handle_errors
def verl_command(
    config: Annotated[Path, typer.Argument(help="The experiment spec (agl.yaml or its folder).")],
    backend: Annotated[str, typer.Option(help="verl (this command); torch is `agl train CONFIG`.")] = "verl",
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest checkpoint in $AGL_CHECKPOINT_DIR, if any.")] = False,  # noqa: E501
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the verl config (validated against verl's schema) and exit.")] = False,  # noqa: E501
    steps: Annotated[int, typer.Option(help="Policy updates to make in all.")] = 8,
    tasks_per_step: Annotated[int, typer.Option(help="Training tasks per update.")] = 4,
    group_size: Annotated[int, typer.Option(help="Rollouts per task per update (the GRPO group).")] = 4,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 1e-5,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of training rollouts.")] = 1.0,
    lora: Annotated[bool, typer.Option(help="Train a LoRA adapter (hot-loaded into vLLM) instead of all weights.")] = False,  # noqa: E501
    lora_rank: Annotated[int, typer.Option(help="LoRA rank, with --lora.")] = 16,
    loss_agg: Annotated[str, typer.Option(help="rollout, token-mean or seq-mean-token-mean.")] = "rollout",
    kl_coef: Annotated[float, typer.Option(help="Weight of the KL penalty to the starting model.")] = 0.0,
    tensor_parallel: Annotated[int, typer.Option(help="vLLM tensor parallel size of the policy server.")] = 1,
    gpu_memory_utilization: Annotated[float, typer.Option(help="Share of GPU memory vLLM may take (the trainer shares the GPUs).")] = 0.4,  # noqa: E501
    json_output: Annotated[bool, typer.Option("--json", help="With --dry-run: one JSON document (config, settings, environment).")] = False,  # noqa: E501
) -> None:
    """Train with verl on GPUs (the trainer image's entry point)."""
    import sys

    from agl_cli.console import print_json, stderr_console
    from agl_cli.errors import ConfigError, UsageError
    from agl_cli.spec import load_spec
    from agl_cli.training import TrainOptions
    from rl_backend.trainer.verl_backend.config import VerlConfigError, rendered_config
    from rl_backend.trainer.verl_backend.runtime import launch_hint, missing_requirements

    console = stderr_console()
    if backend != "verl":
        raise UsageError(f"--backend {backend!r}: this is the verl backend; leave out --backend for torch")
    if group_size < 2:
        raise UsageError("--group-size must be at least 2: a group of one rollout has no advantage to learn from")
    spec = load_spec(config)
    options = TrainOptions(steps=steps, tasks_per_step=tasks_per_step, group_size=group_size, lr=lr,
                           temperature=temperature, lora=lora, loss_agg=loss_agg, kl_coef=kl_coef, backend="verl")
    settings = settings_for(spec, options, resume=resume, tensor_parallel=tensor_parallel,
                            gpu_memory_utilization=gpu_memory_utilization, lora_rank=lora_rank)
    try:
        text, full = rendered_config(settings)
    except VerlConfigError as exc:
        raise ConfigError(str(exc)) from None
    if dry_run:
        if json_output:
            from omegaconf import OmegaConf

            print_json({"settings": settings.to_dict(), "overrides": text,
                        "config": OmegaConf.to_container(full, resolve=False),
                        "environment": {k: os.environ.get(k) for k in ENV_KEYS}})
        else:
            sys.stdout.write(text)
        console.print("verl config rendered and validated against verl's schema; nothing was launched (--dry-run)")
        return
    missing = missing_requirements()
    if missing:
        raise UsageError(f"the verl backend cannot launch here: missing {', '.join(missing)}",
                         hint=launch_hint(str(config)))
    from rl_backend.trainer.verl_backend.launch import run_on_gpus  # pragma: no cover - needs CUDA and vLLM

    run_on_gpus(config, spec, options, settings, full, log=console.print,
                on_step=lambda record: print(step_line(record), flush=True))
