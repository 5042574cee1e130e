"""`agl eval`: run an unchanged agent over a task set, every model call through the gateway, and summarise."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agl_cli.cli_support import handle_errors
from rl_backend.version import installed_version

if TYPE_CHECKING:
    from agl_cli.evaluation.runner import PlannedRollout
    from agl_cli.runs.rundir import RunDir
    from agl_cli.spec.schema import ExperimentSpec
    from agl_cli.spec.variants import Variant
    from agl_cli.spec.volume import Volume
    from rl_backend.store.db import RunStore


def _prepare_new(
    config: Path, variant_names: list[str], limit: int | None, seeds: int | None, split: str | None,
    runs_dir: Path | None, volume: Volume | None = None,
) -> tuple[ExperimentSpec, RunDir, list[Variant], list[PlannedRollout]]:
    from agl_cli.console import stderr_console
    from agl_cli.errors import UsageError
    from agl_cli.evaluation.agent_version import describe_agent
    from agl_cli.evaluation.preflight import check_commands
    from agl_cli.evaluation.runner import make_plan
    from agl_cli.runs.experiment_budget import limit_to_experiment
    from agl_cli.runs.rundir import RunDir, git_sha, runs_root
    from agl_cli.spec.prices import check_budget_prices
    from agl_cli.spec.schema import load_spec
    from agl_cli.spec.tasks import load_tasks, select_tasks, task_set_hash
    from agl_cli.spec.variants import baseline, distinct, parse_variant

    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    spec = load_spec(config)
    if volume is not None:
        spec.volume = volume  # the run's copy of the spec keeps it, so its report and `agl compare` use it too
    check_budget_prices(spec, spec.budget.usd)  # before the run exists: nothing to clean up
    check_commands(spec, spec_path=config / "agl.yaml" if config.is_dir() else config)
    limit_to_experiment(spec, config / "agl.yaml" if config.is_dir() else config, runs_dir, log=stderr_console().print)
    tasks = select_tasks(load_tasks(spec), split=split, limit=limit)
    variants, same = distinct([parse_variant(spec, name) for name in variant_names] or [baseline(spec)])
    for dropped, kept in same:
        stderr_console().print(f"variant {dropped.name} does what {kept.name} does (a knob left alone, or limited to "
                               f"models it never calls): measured once, as {kept.name}", markup=False)
    seed_count = seeds if seeds is not None else spec.seeds
    if seed_count < 1:
        raise UsageError(f"--seeds must be at least 1, got {seed_count}")
    plan = make_plan(variants, tasks, seed_count)
    spec_path = config / "agl.yaml" if config.is_dir() else config
    version = describe_agent(spec, spec_path.resolve())
    run = RunDir.create(
        runs_root(runs_dir),
        spec_data=spec.model_dump(mode="json", exclude_none=True),
        manifest={
            "kind": "eval",
            "spec_path": str(spec_path.resolve()),
            "spec_name": spec.name,
            "git_sha": git_sha(spec.base_dir),
            "split": split,
            "limit": limit,
            "seeds": seed_count,
            "variants": [{"name": v.name, "settings": v.settings, "hash": v.hash} for v in variants],
            "task_ids": [t.id for t in tasks],
            "tasks_hash": task_set_hash(tasks),
            "agl_version": installed_version(),
            "agent_version": version.digest,
            "status": "running",
        },
    )
    version.write(run.path)
    return spec, run, variants, plan


def _prepare_resume(
    reference: str, runs_dir: Path | None
) -> tuple[ExperimentSpec, RunDir, list[Variant], list[PlannedRollout]]:
    from agl_cli.console import stderr_console
    from agl_cli.errors import UsageError
    from agl_cli.evaluation.preflight import check_commands
    from agl_cli.evaluation.runner import make_plan
    from agl_cli.metrics.run import run_volume
    from agl_cli.runs.experiment_budget import limit_to_experiment
    from agl_cli.runs.rundir import find_run
    from agl_cli.spec.schema import load_spec
    from agl_cli.spec.tasks import load_tasks
    from agl_cli.spec.variants import make_variant

    run = find_run(reference, runs_dir)
    manifest = run.manifest()
    if manifest.get("kind") != "eval":
        raise UsageError(
            f"run {run.run_id} is a {manifest.get('kind')} run, not an eval",
            hint=f"resume it with: agl {'optimize' if manifest.get('kind') == 'study' else manifest.get('kind')} "
            f"--resume {run.run_id}",
        )
    run.require(manifest, "spec_path", "task_ids", "variants", "seeds")
    spec = load_spec(Path(manifest["spec_path"]))
    spec.volume = run_volume(run.path) or spec.volume  # a --volume the run was started with holds on resume
    check_commands(spec, spec_path=Path(manifest["spec_path"]))
    limit_to_experiment(spec, Path(manifest["spec_path"]), runs_dir, exclude=run.path, log=stderr_console().print)
    by_id = {t.id: t for t in load_tasks(spec)}
    missing = [tid for tid in manifest["task_ids"] if tid not in by_id]
    if missing:
        raise UsageError(
            f"run {run.run_id} used tasks that are no longer in {spec.tasks.path}: {', '.join(missing[:5])}",
            hint="restore the task file, or start a new run",
        )
    variants = [make_variant(spec, v["settings"]) for v in manifest["variants"]]
    changed = [v.name for v, old in zip(variants, manifest["variants"], strict=True) if v.hash != old["hash"]]
    if changed:
        raise UsageError(
            f"run {run.run_id}: variant {changed[0]} is no longer what it was (a prompt file or knob changed)",
            hint="resuming would mix two different variants; start a new run",
        )
    tasks = [by_id[tid] for tid in manifest["task_ids"]]
    return spec, run, variants, make_plan(variants, tasks, int(manifest["seeds"]))


def execute_eval(
    spec: ExperimentSpec, run: RunDir, variants: list[Variant], plan: list[PlannedRollout], *, quiet: bool,
    use_cache: bool = True, reuse_failures: bool = False,
) -> dict[str, Any]:
    """Run the plan into the run's store and summarise it. A store or disk that refuses a write (locked by another
    process, full, read-only) stops the run with an error that says so: what finished is kept, and the run is
    marked interrupted, to resume once the cause is gone."""
    from agl_cli.runs.rundir import stopped_by_failure

    try:
        return _execute_eval(spec, run, variants, plan, quiet=quiet, use_cache=use_cache,
                             reuse_failures=reuse_failures)
    except Exception as exc:
        error = stopped_by_failure(run, exc, f"agl eval --resume {run.run_id}")
        if error is None:
            raise
        raise error from None


def _execute_eval(
    spec: ExperimentSpec, run: RunDir, variants: list[Variant], plan: list[PlannedRollout], *, quiet: bool,
    use_cache: bool, reuse_failures: bool,
) -> dict[str, Any]:
    store = run.open_store()
    try:
        return _run_plan(spec, run, store, variants, plan, quiet=quiet, use_cache=use_cache,
                         reuse_failures=reuse_failures)
    finally:
        store.close()


def _run_plan(
    spec: ExperimentSpec, run: RunDir, store: RunStore, variants: list[Variant], plan: list[PlannedRollout], *,
    quiet: bool, use_cache: bool, reuse_failures: bool,
) -> dict[str, Any]:
    import asyncio
    import sys
    from collections import Counter

    from agl_cli.console import stderr_console
    from agl_cli.evaluation.controllers import make_controller, run_then_close
    from agl_cli.evaluation.progress import RolloutProgress
    from agl_cli.evaluation.reuse import ReuseReport
    from agl_cli.evaluation.runner import EvalRunner
    from agl_cli.evaluation.services import running_services
    from agl_cli.metrics.cost import cost_fields
    from agl_cli.metrics.run import measure_run
    from agl_cli.runs.run_spend import own_usd, reused_among, run_spend
    from agl_cli.spec.task_content import check_and_record

    console = stderr_console()
    manifest = run.manifest()
    # Like with like: a resume after the task file changed is refused before anything runs (agl_cli.spec.task_content).
    check_and_record(store, run, manifest, list({item.task.id: item.task for item in plan}.values()),
                     tasks_path=str(spec.resolve(spec.tasks.path)),
                     start_again=f"agl eval {manifest.get('spec_path') or 'agl.yaml'}")
    for variant in variants:
        store.upsert_variant(variant.name, variant.hash, variant.settings)
    store.set_meta("plan_size", len(plan))
    reuse = ReuseReport(enabled=False)
    if use_cache and manifest.get("agent_version"):
        from agl_cli.evaluation.agent_version import AgentVersion
        from agl_cli.optimize.cache import ResultCache

        cache = ResultCache(run.path.parent, manifest["agent_version"], exclude=run.path, reuse_failures=reuse_failures)
        reused = cache.import_into(store, plan, run_id=run.run_id)
        reuse = cache.explain(spec, store, plan, current=AgentVersion.read(run.path))
        if reused:
            console.print(
                f"reused {reused} finished rollouts of earlier runs with the same agent, variant, task and seed "
                "(--no-cache runs them again)"
            )
        for line in reuse.lines():
            console.print(line, markup=False)
    console.print(f"run {run.run_id}: {len(plan)} rollouts, {len(variants)} variant(s), concurrency {spec.concurrency}")
    interrupted = False
    spend_limit = None
    max_usd = spec.budget.run_usd()
    if max_usd is not None:
        from rl_backend.gateway.budget import SpendLimit

        spend_limit = SpendLimit(max_usd, spent_usd=own_usd(store),
                                 hint="raise budget.usd in agl.yaml and resume the run")
    with running_services(spec, store, log=console.print, spend_limit=spend_limit) as services:
        controller = make_controller(spec, run.run_id)
        runner = EvalRunner(spec, run, store, services, controller, log=console.print)
        todo = runner.pending(plan)
        reused_rollouts = reused_among(store, [item.key for item in plan], skip={item.key for item, _ in todo})
        done_before = len(plan) - len(todo) - len(reused_rollouts)
        if done_before:
            console.print(f"resuming: {done_before} rollouts this run already finished are kept, {len(todo)} to run")
        with RolloutProgress(console, total=len(plan), done=done_before, quiet=quiet) as progress:
            for rollout, source in reused_rollouts:
                progress.on_reused(rollout, source)
            runner.on_event = progress.on_event
            try:
                asyncio.run(run_then_close(controller, lambda: runner.run(plan)))
            except KeyboardInterrupt:
                interrupted = True
    planned_keys: dict[str, list[str]] = {v.name: [] for v in variants}
    for item in plan:
        planned_keys[item.variant.name].append(item.key)
    summaries = measure_run(store, planned_keys, k=int(manifest.get("seeds") or 1), pass_threshold=spec.pass_threshold)
    reused_by_variant = Counter(r.variant for r, _ in reused_among(store, [item.key for item in plan]))
    not_reused = reuse.by_variant()
    spend = run_spend(store)
    finished = sum(s.finished for s in summaries)
    status = "interrupted" if interrupted else "budget_reached" if runner.stopped_for_budget else "completed"
    manifest["status"] = status
    from agl_cli.spec.secret_env import short_secret_note

    notes = [note] if (note := short_secret_note(spec)) else []
    if notes:
        manifest["notes"] = notes  # the report shows them among its caveats
    run.write_manifest(manifest)
    if interrupted:
        console.print(
            f"interrupted: {finished} of {len(plan)} rollouts finished and are kept. "
            f"Resume with: agl eval --resume {run.run_id}"
        )
        sys.stdout.flush()
    elif runner.stopped_for_budget:
        console.print(f"stopped at the budget: {finished} of {len(plan)} rollouts ran")
    return {
        "run_id": run.run_id,
        "run_dir": str(run.path),
        "status": status,
        "volume": spec.volume.as_dict() if spec.volume is not None else None,
        "variants": [{**s.summary_json(), **cost_fields(s, spec.volume), "reused": reused_by_variant.get(s.name, 0),
                      "not_reused": not_reused.get(s.name, {})} for s in summaries],
        "reuse": reuse.as_json(),
        "spend": spend.as_json(),
        "notes": notes,
        "_summaries": summaries,
        "_spend": spend,
    }


def _write_report(run: RunDir) -> dict[str, str]:
    """Best effort: a report that cannot be written never fails the evaluation it describes."""
    from agl_cli.console import stderr_console

    try:
        from agl_cli.report import write_report

        paths = write_report(run.path)
    except Exception as exc:  # noqa: BLE001 - reported, and the run's data is safe in the store
        stderr_console().print(f"report not written: {exc}")
        return {}
    written = {p.suffix[1:]: str(p) for p in paths if p.stem == "report"}
    if "html" in written:
        stderr_console().print(f"report: {written['html']}")
    return written


@handle_errors
def eval_command(
    config: Annotated[Path | None, typer.Argument(help="The experiment spec (agl.yaml or its folder).")] = None,
    variant: Annotated[
        list[str] | None,
        typer.Option("--variant", "-v", help="`baseline` or knob=value[,knob=value]; repeat for several."),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N tasks (of the split).")] = None,
    seeds: Annotated[int | None, typer.Option(help="Runs per task (default: the spec's `seeds`).")] = None,
    split: Annotated[str | None, typer.Option(help="Only tasks of this split (e.g. val or test), or of several (val,train).")] = None,  # noqa: E501
    resume: Annotated[str | None, typer.Option(help="Finish this run instead of starting one.")] = None,
    runs_dir: Annotated[Path | None, typer.Option(help="Where runs live (default .agl/runs or $AGL_HOME/runs).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No per-rollout progress.")] = False,
    concurrency: Annotated[int | None, typer.Option(help="Rollouts at once (default: the spec's).")] = None,
    baseline: Annotated[str | None, typer.Option(help="A run to judge this one against (paired, same tasks).")] = None,
    fail_on_regression: Annotated[
        bool, typer.Option(help="With --baseline: exit 3 when the paired interval says this run is worse.")
    ] = False,
    report: Annotated[bool, typer.Option(help="Write the Markdown and HTML report into the run folder.")] = True,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Run every rollout, even ones done before.")] = False,
    reuse_failures: Annotated[bool, typer.Option(
        "--reuse-failures", help="Also reuse earlier rollouts that ended without a reward by the agent's own doing "
        "(crash, timeout, no output); by default only scored rollouts are reused.")] = False,
    volume: Annotated[str | None, typer.Option(
        help="Tasks the agent handles in production, e.g. 40000/month (default: the spec's `volume:`): adds the "
        "cost per month.")] = None,
    no_knobs: Annotated[bool, typer.Option(
        "--no-knobs", help="Also measure the agent with every knob left alone (variant `no-knobs`), the spec's "
        "baseline or not; alone, it is the only variant.")] = False,
) -> None:
    """Evaluate the agent over the tasks and print accuracy, errors, latency, tokens and cost per variant."""
    from agl_cli.console import print_json, print_table, stderr_console, stdout_console
    from agl_cli.display import print_missing_reasons, print_model_warnings, variant_table
    from agl_cli.errors import UsageError
    from agl_cli.evaluation.interrupts import TermAsInterrupt
    from agl_cli.metrics.fmt import usd
    from agl_cli.spec.volume import parse_volume

    volume_given = parse_volume(volume) if volume is not None else None
    if resume is not None:
        if (config is not None or variant or limit is not None or seeds is not None or split is not None
                or volume is not None or no_knobs):
            raise UsageError("--resume RUN takes no spec, --variant, --no-knobs, --limit, --seeds, --split or --volume: "
                             "the run "
                             "has them")
        spec, run, variants, plan = _prepare_resume(resume, runs_dir)
    else:
        if config is None:
            raise UsageError("give the experiment spec: agl eval path/to/agl.yaml (or --resume RUN)")
        from agl_cli.spec.variants import NO_KNOBS

        names = [*(variant or []), *([NO_KNOBS] if no_knobs else [])]
        spec, run, variants, plan = _prepare_new(config, names, limit, seeds, split, runs_dir, volume_given)
    if fail_on_regression and baseline is None:
        raise UsageError("--fail-on-regression needs --baseline RUN, the run to compare against")
    baseline_run = None
    if baseline is not None:
        from agl_cli.runs.rundir import find_run

        baseline_run = find_run(baseline, runs_dir)  # before spending anything: a typo fails fast
    if concurrency is not None:
        if concurrency < 1:
            raise UsageError(f"--concurrency must be at least 1, got {concurrency}")
        spec.concurrency = concurrency
    with run.hold(), TermAsInterrupt() as stop:  # one process at a time runs this run; SIGTERM acts as Ctrl-C
        result = execute_eval(spec, run, variants, plan, quiet=quiet, use_cache=not no_cache,
                              reuse_failures=reuse_failures)
        summaries = result.pop("_summaries")
        spend = result.pop("_spend")
        if report:
            result["report"] = _write_report(run)
    gate: tuple[bool, str] | None = None
    if baseline_run is not None:
        from agl_cli.report import regression_verdict

        gate = regression_verdict(baseline_run, run)
        result["regression"] = {"baseline": baseline_run.run_id, "is_regression": gate[0], "explanation": gate[1]}
    if json_output:
        print_json(result)
    else:
        out = stdout_console()
        print_table(out, variant_table(summaries, title=f"run {run.run_id} ({spec.name})", volume=spec.volume))
        print_missing_reasons(out, summaries)
        out.print(f"this run launched {spend.launched} rollouts and spent "
                  f"{usd(spend.priced_usd, unpriced_calls=spend.unpriced_calls)}", markup=False)
        if spend.reuse_line():
            out.print(spend.reuse_line(), markup=False)
        stderr_console().print(f"run stored in {run.path}")
    print_model_warnings(stderr_console(), summaries)
    if gate is not None:
        stderr_console().print(("REGRESSION: " if gate[0] else "no regression: ") + gate[1])
    if result["status"] == "interrupted":
        raise typer.Exit(stop.exit_code)
    if gate is not None and gate[0] and fail_on_regression:
        raise typer.Exit(3)
    if not any(s.accuracy.n for s in summaries):
        stderr_console().print("no rollout produced a reward; see the reasons above")
        raise typer.Exit(1)
