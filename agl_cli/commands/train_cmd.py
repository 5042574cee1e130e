"""`agl train`: train the served model's weights through the unchanged agent, then judge it on held-out tasks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agl_cli.cli_support import handle_errors

if TYPE_CHECKING:
    from agl_cli.runs.rundir import RunDir
    from agl_cli.training.sync_job import TrainOptions


def _new_run(config: Path, options: TrainOptions, runs_dir: Path | None) -> tuple[Any, RunDir]:
    from agl_cli.console import stderr_console
    from agl_cli.evaluation.preflight import check_commands
    from agl_cli.optimize.cache import agent_version
    from agl_cli.runs.experiment_budget import limit_to_experiment
    from agl_cli.runs.rundir import RunDir, git_sha, runs_root
    from agl_cli.spec.schema import load_spec

    spec = load_spec(config)
    spec_path = config / "agl.yaml" if config.is_dir() else config
    check_commands(spec, spec_path=spec_path)
    limit_to_experiment(spec, spec_path, runs_dir, log=stderr_console().print)
    run = RunDir.create(
        runs_root(runs_dir),
        spec_data=spec.model_dump(mode="json", exclude_none=True),
        manifest={
            "kind": "train", "spec_path": str(spec_path.resolve()), "spec_name": spec.name,
            "git_sha": git_sha(spec.base_dir), "agent_version": agent_version(spec, spec_path.resolve()),
            "options": options.as_dict(),
            "split": options.heldout_split, "status": "running",
        },
    )
    return spec, run


def _resume(reference: str, runs_dir: Path | None) -> tuple[Any, RunDir, TrainOptions]:
    from agl_cli.console import stderr_console
    from agl_cli.errors import UsageError
    from agl_cli.evaluation.preflight import check_commands
    from agl_cli.runs.experiment_budget import limit_to_experiment
    from agl_cli.runs.rundir import find_run
    from agl_cli.spec.schema import load_spec
    from agl_cli.training.sync_job import TrainOptions

    run = find_run(reference, runs_dir)
    manifest = run.manifest()
    if manifest.get("kind") != "train":
        raise UsageError(f"run {run.run_id} is a {manifest.get('kind')} run, not a training run")
    run.require(manifest, "spec_path", "options")
    spec = load_spec(Path(manifest["spec_path"]))
    check_commands(spec, spec_path=Path(manifest["spec_path"]))
    limit_to_experiment(spec, Path(manifest["spec_path"]), runs_dir, exclude=run.path, log=stderr_console().print)
    return spec, run, TrainOptions(**manifest["options"])


def _before_after(run: RunDir, after_name: str) -> dict[str, Any] | None:
    from agl_cli.commands.compare_cmd import compare_sides, load_side, sentence

    try:
        before = load_side(f"{run.run_id}:before", run, "before", None)
        after = load_side(f"{run.run_id}:{after_name}", run, after_name, None)
    except Exception:  # noqa: BLE001 - no held-out rollouts finished: nothing to judge, said by the caller
        return None
    doc = compare_sides(before, [after])[0]
    doc["sentence"] = sentence("trained vs base", doc)
    return doc


def step_printer(console: Any, tracking: Any) -> Callable[[Any], None]:
    """What each training step prints on stderr (and logs to the trackers)."""

    def on_step(record: Any) -> None:
        tracking.log(record)
        reward = "—" if record.reward_mean is None else f"{record.reward_mean:.2f}"
        console.print(f"step {record.step}: reward {reward}, trained {record.trained_rollouts}/{record.rollouts} "
                      f"rollouts, loss {record.loss if record.loss is not None else '—'}, "
                      f"entropy {record.entropy if record.entropy is not None else '—'}"
                      + (f", staleness max {record.staleness_max}, {record.metrics.get('stale', 0)} stale dropped"
                         if record.metrics.get("loop") == "collocated-async" else "")
                      + ("" if record.updated else f" (no update: {record.metrics.get('skipped')})"), markup=False)
        groups = record.metrics.get("advantages", {})
        if groups.get("groups") and groups.get("zero_signal_groups") == groups["groups"]:
            # GRPO learns only from differences inside a group: this step moved nothing.
            console.print(f"  no learning signal: in each of the {groups['groups']} groups every rollout scored the "
                          "same; a lower --temperature, a larger --group-size or easier training tasks give GRPO "
                          "something to compare", markup=False)

    return on_step


def stopped_message(stopped: dict[str, Any]) -> str:
    """Why training stopped before its last step, and what that says about the agent's failures."""
    left = stopped["of"] - stopped["after_iteration"]
    return (f"training stopped after iteration {stopped['after_iteration']} of {stopped['of']}: {stopped['reason']}. "
            f"The remaining {left} would not change the weights, so they were not run; the held-out comparison "
            "judges what was trained. Reinforcement learning sharpens what the model already does sometimes "
            "(format, protocol, when to stop, using tools); it does not add facts it lacks: see what the remaining "
            "failures are with `agl advise`. To train on anyway: --no-stop-on-collapse")


def finish_run(run: RunDir, outcome: dict[str, Any]) -> dict[str, Any]:
    """After a training run: its held-out before/after comparison, the manifest marked completed, the report, and
    the result document (what --json prints)."""
    from agl_cli.commands.eval_cmd import _write_report
    from agl_cli.training.sync_job import TRAINED_DIR

    comparison = _before_after(run, outcome["after_variant"])
    manifest = run.manifest()
    manifest["status"] = "completed"
    manifest["sampling_overridden"] = outcome.get("sampling_overridden") or {}
    run.write_manifest(manifest)
    trained = outcome["trained_model"]
    return {
        "run_id": run.run_id, "run_dir": str(run.path), "steps": outcome["curve"],
        "stopped_early": outcome.get("stopped_early"), "comparison": comparison,
        # The agent's request fields training calls overrode (rl_backend.gateway.training_fields), calls per field.
        "sampling_overridden": outcome.get("sampling_overridden") or {},
        "trained_model": trained, "trained_adapter": outcome.get("trained_adapter"),
        "model_knob": {"upstream": {"trained": {"kind": "embedded", "model": trained}}, "value": f"trained/{TRAINED_DIR}"}
        if trained else None,
        "report": _write_report(run),
    }


def _check_track(track: str | None) -> list[str] | None:
    from agl_cli.errors import UsageError
    from rl_backend.trainer.trackers import TrackerError, parse_trackers

    if track is None:
        return None
    try:
        return parse_trackers(track)
    except TrackerError as exc:
        raise UsageError(str(exc)) from None


def _open_trackers(names: list[str], run: RunDir) -> Any:
    from rl_backend.trainer.trackers import open_trackers

    manifest = run.manifest()
    return open_trackers(_check_track(",".join(names)) or [], run_dir=run.path, run_id=run.run_id,
                         name=f"{manifest.get('spec_name', 'agl')}-{run.run_id}", config=manifest.get("options", {}))


@handle_errors
def train_command(
    config: Annotated[Path | None, typer.Argument(help="The experiment spec (agl.yaml or its folder).")] = None,
    steps: Annotated[int | None, typer.Option(help="Policy updates to make in all (default 8; with --resume: "
                                                   "raise it to train further).")] = None,
    tasks_per_step: Annotated[int, typer.Option(help="Training tasks per update.")] = 4,
    group_size: Annotated[int, typer.Option(help="Rollouts per task per update (the GRPO group).")] = 4,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 1e-5,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of training rollouts, above 0 (the loss recomputes the old logprobs at it; 1 only with --loop collocated-async).")] = 1.0,  # noqa: E501
    lora: Annotated[bool, typer.Option(help="Train a LoRA adapter instead of all weights.")] = False,
    loss_agg: Annotated[
        str, typer.Option(help="rollout (per-rollout normalization), token-mean or seq-mean-token-mean.")
    ] = "rollout",
    kl_coef: Annotated[float, typer.Option(help="Weight of the KL penalty to the starting model.")] = 0.0,
    train_split: Annotated[str, typer.Option(help="The split trained on.")] = "train",
    heldout_split: Annotated[str, typer.Option(help="The split judged on, before and after.")] = "val",
    heldout_limit: Annotated[int, typer.Option(help="Held-out tasks evaluated before and after.")] = 40,
    loop: Annotated[str, typer.Option(
        help="sync: collect a batch, update, serve the new weights. collocated-async: rollouts keep running; the "
             "gateway pauses (calls held) only while the policy updates on the same device.")] = "sync",
    max_staleness: Annotated[int, typer.Option(
        help="collocated-async: rollouts whose calls were served by weights more than this many updates old are "
             "not trained on.")] = 1,
    track: Annotated[str | None, typer.Option(
        help="Log each step's curves to experiment trackers, comma-separated: tensorboard (<run>/tensorboard), "
             "wandb (honours WANDB_* variables: WANDB_PROJECT, WANDB_MODE=offline, WANDB_DIR...), mlflow "
             "(MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME).")] = None,
    stop_on_collapse: Annotated[bool | None, typer.Option(
        "--stop-on-collapse/--no-stop-on-collapse",
        help="Stop when the policy has collapsed: its entropy fell to half the first update's or less, and for 2 "
             "iterations in a row every group's rollouts scored the same (no learning signal left). On by default; "
             "with --resume, changes the run's setting.", show_default=False)] = None,
    resume: Annotated[str | None, typer.Option(help="Continue this training run from its last checkpoint.")] = None,
    runs_dir: Annotated[Path | None, typer.Option(help="Where runs live.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Train the model the agent calls (GRPO on exact token ids through the gateway), then compare it with the base."""
    from agl_cli.console import print_json, stderr_console, stdout_console
    from agl_cli.errors import UsageError
    from agl_cli.evaluation.interrupts import TermAsInterrupt
    from agl_cli.spec.tasks import load_tasks, select_tasks
    from agl_cli.training.sync_job import TRAINED_DIR, TrainingRun, TrainOptions, temperature_problem

    console = stderr_console()
    if loop not in ("sync", "collocated-async"):
        raise UsageError(f"--loop {loop}: use sync or collocated-async")
    if max_staleness < 0:
        raise UsageError(f"--max-staleness must be 0 or more, got {max_staleness}")
    trackers = _check_track(track)
    if resume is not None:
        if config is not None:
            raise UsageError("--resume RUN takes no spec: the run has it")
        spec, run, options = _resume(resume, runs_dir)
        if (problem := temperature_problem(options)) is not None:  # a run made before the check
            raise UsageError(problem)
        if steps is not None:
            options.steps = steps
        if trackers is not None:
            options.track = trackers
        if stop_on_collapse is not None:
            options.stop_on_collapse = stop_on_collapse
        if steps is not None or trackers is not None or stop_on_collapse is not None:
            manifest = run.manifest()
            manifest["options"] = options.as_dict()
            run.write_manifest(manifest)
    else:
        if config is None:
            raise UsageError("give the experiment spec: agl train path/to/agl.yaml (or --resume RUN)")
        steps = 8 if steps is None else steps
        for name, value in (("--steps", steps), ("--tasks-per-step", tasks_per_step), ("--group-size", group_size),
                            ("--heldout-limit", heldout_limit)):
            if value < 1:
                raise UsageError(f"{name} must be at least 1, got {value}")
        if group_size < 2:
            raise UsageError("--group-size must be at least 2: a group of one rollout has no advantage to learn from")
        options = TrainOptions(steps=steps, tasks_per_step=tasks_per_step, group_size=group_size, lr=lr,
                               temperature=temperature, lora=lora, loss_agg=loss_agg, kl_coef=kl_coef,
                               train_split=train_split, heldout_split=heldout_split, heldout_limit=heldout_limit,
                               loop=loop, max_staleness=max_staleness, track=trackers or [],
                               stop_on_collapse=stop_on_collapse is not False)
        if loss_agg not in ("rollout", "token-mean", "seq-mean-token-mean"):
            raise UsageError(f"--loss-agg {loss_agg!r}: use rollout, token-mean or seq-mean-token-mean")
        if (problem := temperature_problem(options)) is not None:
            raise UsageError(problem)
        spec, run = _new_run(config, options, runs_dir)
    # One process at a time trains this run (a second one is refused with this one's pid); SIGTERM acts as Ctrl-C.
    with run.hold(), TermAsInterrupt() as stop:
        tasks = load_tasks(spec)
        train_tasks = select_tasks(tasks, split=options.train_split, limit=None)
        heldout = select_tasks(tasks, split=options.heldout_split, limit=options.heldout_limit)
        console.print(f"training run {run.run_id}: {options.steps} updates × {options.tasks_per_step} tasks × "
                      f"{options.group_size} rollouts; held-out {len(heldout)} {options.heldout_split} tasks")

        tracking = _open_trackers(options.track, run)

        on_step = step_printer(console, tracking)

        training = TrainingRun(spec, run, options, train_tasks, heldout, log=console.print)
        try:
            outcome = training.run(on_step)
        except KeyboardInterrupt:
            console.print(f"interrupted; continue with: agl train --resume {run.run_id}")
            raise typer.Exit(stop.exit_code) from None
        finally:
            tracking.close()
        result = finish_run(run, outcome)
        if result["stopped_early"]:
            console.print(stopped_message(result["stopped_early"]), markup=False)
        comparison = result["comparison"]
        trained = outcome["trained_model"]
    if json_output:
        print_json(result)
        return
    out = stdout_console()
    out.print(comparison["sentence"] if comparison else "no held-out rollout finished: nothing to compare", markup=False)
    if trained:
        out.print(f"trained model: {trained}", markup=False)
        out.print("use it as a value of the `model` knob:\n"
                  f"  upstreams:\n    trained: {{kind: embedded, model: {trained}}}\n"
                  f"  knobs:\n    model: {{values: [{spec.model or 'local/smollm2-135m-instruct'}, trained/{TRAINED_DIR}], "
                  "via: gateway}", markup=False)
