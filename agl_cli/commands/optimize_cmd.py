"""`agl optimize`: search the knobs on the validation split under a hard budget, confirm the winner on the
held-out test split, write it as `agl.best.yaml` with its diff, and show the frontier the user chooses from, priced
at their volume."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors
from agl_cli.metrics.fmt import pct, seconds, usd

if TYPE_CHECKING:
    from rich.console import Console


class Strategy(str, Enum):
    grid = "grid"
    racing = "racing"
    reflect = "reflect"


def _check_positive(name: str, value: float | None, *, allow_zero: bool = False) -> None:
    from agl_cli.errors import UsageError

    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise UsageError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value:g}")


def _print_projection(out: Console, doc: dict[str, Any]) -> None:
    per = doc["per_rollout"]
    out.print(f"dry run: {len(doc['variants'])} variants, strategy {doc['strategy']}, {doc['tasks']['search']} search "
              f"tasks, {doc['tasks']['confirm']} confirm tasks, {doc['seeds']} seed(s); "
              f"{doc['cached_rollouts']} rollouts already in the cache")
    if per["source"] == "none":
        out.print("no per-rollout cost or time known (no history for this agent version, and --pilot 0)")
    else:
        cost = "cost unknown (calls without a price)" if per["cost_usd"] is None else usd(per["cost_usd"])
        out.print(f"per rollout (from {per['source']}, n={per['n']}): {cost}, {per['input_tokens']:.0f} in / "
                  f"{per['output_tokens']:.0f} out tokens, {seconds(per['duration_s'], digits=1)}")
    for name, entry in doc["projected"].items():
        line = f"  {name.replace('_', ' ')}: {entry['rollouts']} rollouts ({entry['to_run']} to run)"
        if "cost_usd" in entry:
            cost = "cost unknown" if entry["cost_usd"] is None else usd(entry["cost_usd"])
            line += (f", {cost}, {entry['input_tokens'] + entry['output_tokens']:,} tokens, "
                     f"about {entry['time_s'] / 60:.1f} min at concurrency {doc['concurrency']}")
        out.print(line, markup=False)
    budget = doc["budget"]
    if budget["usd"] is not None or budget["rollouts"] is not None:
        money = "no USD limit" if budget["usd"] is None else f"${budget['usd']:g}"
        rollouts = "no rollout limit" if budget["rollouts"] is None else f"{budget['rollouts']} rollouts"
        out.print(f"budget: {money}, {rollouts} (a hard ceiling: launching stops there)")
    if doc.get("pilot_study"):
        out.print(f"pilot kept in study {doc['pilot_study']}: `agl optimize --resume {doc['pilot_study']}` runs it")


def _print_reflect(out: Console, reflect: dict[str, Any] | None) -> None:
    if not reflect:
        return
    for p in reflect["proposals"]:
        state = "accepted" if p["accepted"] else f"{p['status']}: {p['reason']}"
        out.print(f"proposal {p['n']} (parent {p['parent']}): {p['variant'] or 'no variant'}, {state}", markup=False)
    front = ", ".join(f"{m['name']} ({m['tasks_best']} tasks)" for m in reflect["pareto_front"])
    spent = reflect["proposer_cost_usd"]
    spent_text = "an unknown amount (its model has no price)" if spent is None else usd(spent)
    out.print(f"reflect front: {front or '—'}; proposer spent {spent_text}", markup=False)
    if reflect.get("stopped"):
        out.print(f"reflect stopped: {reflect['stopped']}", markup=False)


def _cost_cells(row: dict[str, Any], volume: dict[str, Any] | None) -> list[str]:
    """Cost per task and, with a volume, per month, each with its interval; unknown as "— (N unpriced calls)"."""
    unpriced = row.get("unpriced_calls") or 0
    per_task = row["cost_usd_per_task"]
    cells = [usd(per_task["mean"], per_task["ci95"], unpriced_calls=unpriced)]
    if volume is not None:
        monthly = row.get("cost_usd_per_month") or {}
        cells.append(usd(monthly.get("mean"), monthly.get("ci95"), unpriced_calls=unpriced))
    return cells


def _month_heading(volume: dict[str, Any]) -> str:
    from agl_cli.metrics.cost import month_column
    from agl_cli.spec.volume import Volume

    return month_column(Volume(tasks=volume["tasks"], per=volume["per"]))


def _print_frontier(out: Console, doc: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    from agl_cli.console import print_table
    from agl_cli.optimize.frontier import step_text

    front = doc.get("frontier")
    if not front or not front["members"]:
        return
    if not front["choice"]:
        out.print(f"frontier: {front['most_accurate']} is both the most accurate and the cheapest good "
                  "configuration; no trade-off to put to the user", markup=False)
        return
    volume = front["volume"]
    table = Table(title=f"frontier on {front['split']}: what no other configuration beats on "
                        f"{', '.join(front['objectives'])}", title_justify="left")
    columns = ["variant", "accuracy [95% CI]", "n", "cost/task [95% CI]"]
    columns += [_month_heading(volume)] if volume is not None else []
    for column in [*columns, "p95", "end"]:
        table.add_column(column, justify="left" if column in ("variant", "end") else "right")
    for member in front["members"]:
        acc = member["accuracy"]
        table.add_row(Text(member["name"]), pct(acc["mean"], acc["ci95"]), str(acc["n"]),
                      *_cost_cells(member, volume), seconds(member["latency_p95_s"], digits=1),
                      Text(", ".join(member["ends"])))
    print_table(out, table)
    for step in front["steps"]:
        out.print(f"  {step['from']} -> {step['to']}: {step_text(step)}", markup=False)
    if front.get("held_out"):
        held = front["held_out"]
        out.print(f"  on {held['split']} (held out): {held['from']} -> {held['to']}: {step_text(held)}", markup=False)
    if volume is None:
        out.print("  (set `volume:` in agl.yaml, or --volume 40000/month, to price this per month)", markup=False)


def _print_report(out: Console, doc: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    from agl_cli.commands.compare_cmd import sentence
    from agl_cli.console import print_table

    table = Table(title=f"study {doc['study_id']} ({doc['strategy']}, {doc['splits']['search']['name']})",
                  title_justify="left")
    k = doc["seeds"]
    volume = doc.get("volume")
    columns = ["variant", "status", "n", "accuracy [95% CI]", f"pass^{k}", "cost/task [95% CI]"]
    columns += [_month_heading(volume)] if volume is not None else []
    for column in (*columns, "p95", "front"):
        table.add_column(column, justify="left" if column in ("variant", "status") else "right")
    for row in doc["variants"]:
        acc = row["accuracy"]
        status = "kept" if not row["dropped"] else f"out r{row['dropped']['round']}"
        table.add_row(
            Text(row["name"]), Text(status), str(row["n_tasks"]), pct(acc["mean"], acc["ci95"]),
            pct(row["pass_k"]["mean"], digits=0), *_cost_cells(row, volume),
            seconds(row["latency_p95_s"], digits=1),
            "*" if row["pareto"] else "",
        )
    print_table(out, table)
    _print_frontier(out, doc)
    winner = doc.get("winner")
    if winner:
        out.print(f"winner: {winner['name']}", markup=False)
    for key in ("validation", "confirmation"):
        if doc.get(key):
            out.print(sentence(f"{key} ({doc[key]['split']})", doc[key]), markup=False)
    _print_reflect(out, doc.get("reflect"))
    for message in doc.get("messages", []):
        out.print(f"note: {message}", markup=False)
    out.print(f"recommendation: {doc.get('recommendation')}", markup=False)
    if doc.get("best_config"):
        out.print(f"written: {doc['best_config']['path']}", markup=False)
        out.print(doc["best_config"]["diff"], markup=False, end="")
    spend = doc["spend"]
    spent = (f"{usd(spend['priced_usd'])} and {spend['unpriced_calls']} calls without a price (an unknown amount)"
             if spend.get("unpriced_calls") else usd(spend["usd"]))
    out.print(f"spent {spent} on {spend['rollouts']} rollouts; {spend['reused_from_cache']} reused", markup=False)


@handle_errors
def optimize_command(
    config: Annotated[Optional[Path], typer.Argument(help="The experiment spec (agl.yaml or its folder).")] = None,  # noqa: UP045
    strategy: Annotated[Optional[Strategy], typer.Option(help="grid, racing (default past 2 variants), or reflect (an LLM proposer rewrites a prompt file; needs `proposer:` in agl.yaml).")] = None,  # noqa: UP045,E501
    variant: Annotated[Optional[list[str]], typer.Option("--variant", "-v", help="A candidate: knob=value[,knob=value]; repeatable.")] = None,  # noqa: UP045,E501
    across: Annotated[Optional[list[str]], typer.Option(help="Search every combination of these knobs (comma-separated or repeated), the other knobs at the baseline: --across model re-tests the models under the setting kept so far.")] = None,  # noqa: UP045,E501
    base: Annotated[Optional[str], typer.Option(help="The study's baseline, knob=option[,knob=option]: the setting kept so far, judged and confirmed against (default: each knob's first option).")] = None,  # noqa: UP045,E501
    option: Annotated[Optional[list[str]], typer.Option("--option", help="Add an option to a declared knob for this study: knob=VALUE (a value, or a file for a file-valued knob); repeatable.")] = None,  # noqa: UP045,E501
    candidate: Annotated[Optional[list[str]], typer.Option(help="A candidate file for a file-valued knob: PATH or knob=PATH.")] = None,  # noqa: UP045,E501
    grid: Annotated[bool, typer.Option("--grid", help="Every combination of the knobs' options (the default source).")] = False,  # noqa: E501
    sample: Annotated[Optional[int], typer.Option(help="A seeded random sample of N grid variants.")] = None,  # noqa: UP045
    sample_seed: Annotated[int, typer.Option(help="Seed of --sample.")] = 0,
    budget_usd: Annotated[Optional[float], typer.Option(help="Hard ceiling on model spend (default: the spec's budget.usd).")] = None,  # noqa: UP045,E501
    max_rollouts: Annotated[Optional[int], typer.Option(help="Hard ceiling on rollouts launched (default: budget.rollouts).")] = None,  # noqa: UP045,E501
    max_cost_per_task: Annotated[Optional[float], typer.Option(help="Constraint: mean USD per task at most this.")] = None,  # noqa: UP045,E501
    max_p95_latency: Annotated[Optional[float], typer.Option(help="Constraint: p95 seconds per task at most this.")] = None,  # noqa: UP045,E501
    seeds: Annotated[Optional[int], typer.Option(help="Runs per task (default: the spec's seeds).")] = None,  # noqa: UP045
    volume: Annotated[Optional[str], typer.Option(help="Tasks the agent handles in production, e.g. 40000/month (default: the spec's `volume:`): prices the frontier per month.")] = None,  # noqa: UP045,E501
    search_split: Annotated[str, typer.Option(help="The split the search runs on.")] = "val",
    confirm_split: Annotated[str, typer.Option(help="The held-out split the winner is confirmed on.")] = "test",
    first_batch: Annotated[Optional[int], typer.Option(help="Racing: tasks in the first round (default 1/16, >= 8).")] = None,  # noqa: UP045,E501
    limit: Annotated[Optional[int], typer.Option(help="Search on a seeded sample of N tasks of the search split.")] = None,  # noqa: UP045,E501
    confirm_limit: Annotated[Optional[int], typer.Option(help="Confirm on a seeded sample of N held-out tasks.")] = None,  # noqa: UP045,E501
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not reuse rollouts of earlier runs.")] = False,
    reuse_failures: Annotated[bool, typer.Option("--reuse-failures", help="Also reuse earlier rollouts that ended without a reward by the agent's own doing (crash, timeout, no output); by default only scored rollouts are reused.")] = False,  # noqa: E501
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Project rollouts, tokens, cost and time; run nothing big.")] = False,  # noqa: E501
    pilot: Annotated[int, typer.Option(help="--dry-run without history: pilot this many baseline tasks (0: none).")] = 3,
    resume: Annotated[Optional[str], typer.Option(help="Continue this study (budget flags may be raised).")] = None,  # noqa: UP045
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where runs live (default .agl/runs or $AGL_HOME/runs).")] = None,  # noqa: UP045,E501
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No per-rollout progress (rounds and spend still show).")] = False,  # noqa: E501
) -> None:
    """Find the best variant on the validation split within a hard budget, confirm it on the test split."""
    from agl_cli.console import print_json, stderr_console, stdout_console
    from agl_cli.errors import UsageError
    from agl_cli.optimize.study import StudyOptions, create, prepare, reopen
    from agl_cli.runs.experiment_budget import limit_to_experiment
    from agl_cli.runs.rundir import runs_root
    from agl_cli.spec.volume import parse_volume

    _check_positive("--budget-usd", budget_usd, allow_zero=True)
    _check_positive("--max-rollouts", max_rollouts)
    _check_positive("--max-cost-per-task", max_cost_per_task, allow_zero=True)
    _check_positive("--max-p95-latency", max_p95_latency)
    _check_positive("--first-batch", first_batch)
    _check_positive("--limit", limit)
    _check_positive("--confirm-limit", confirm_limit)
    _check_positive("--pilot", pilot, allow_zero=True)
    console = stderr_console()
    if resume is not None:
        chosen = [config, strategy, variant, candidate, sample, max_cost_per_task, max_p95_latency, seeds, first_batch,
                  limit, confirm_limit, across, base, option, volume]
        if (any(x for x in chosen) or grid or dry_run or reuse_failures or search_split != "val"
                or confirm_split != "test"):
            raise UsageError("--resume STUDY takes no spec or search options, only --budget-usd and --max-rollouts: "
                             "the study has the rest")
        study = reopen(resume, runs_dir)
        limit_to_experiment(study.spec, study.spec_path, runs_dir, exclude=study.run.path, log=console.print)
        if budget_usd is not None:
            study.options.budget_usd = budget_usd
        if max_rollouts is not None:
            study.options.max_rollouts = max_rollouts
        use_cache = not study.options.no_cache
    else:
        if config is None:
            raise UsageError("give the experiment spec: agl optimize path/to/agl.yaml (or --resume STUDY)")
        options = StudyOptions(
            strategy=strategy.value if strategy else None, variants=list(variant or []), grid=grid, sample=sample,
            sample_seed=sample_seed, budget_usd=budget_usd, max_rollouts=max_rollouts,
            max_cost_per_task=max_cost_per_task, max_p95_latency=max_p95_latency, seeds=seeds,
            search_split=search_split, confirm_split=confirm_split, first_batch=first_batch, no_cache=no_cache,
            limit=limit, confirm_limit=confirm_limit, reuse_failures=reuse_failures,
            across=[k.strip() for text in across or [] for k in text.split(",") if k.strip()], base=base,
            volume=parse_volume(volume).model_dump() if volume is not None else None,
        )
        study = prepare(config, options, list(candidate or []), Path.cwd(), list(option or []))
        limit_to_experiment(study.spec, study.spec_path, runs_dir, log=console.print)
        use_cache = not no_cache
        if dry_run:
            from agl_cli.optimize.projection import dry_run as project

            doc = project(study, runs_root(runs_dir), pilot=pilot, runs_dir=runs_dir, quiet=quiet, console=console)
            if json_output:
                print_json(doc)
            else:
                _print_projection(stdout_console(), doc)
            return
        create(study, runs_dir)
    from agl_cli.commands.eval_cmd import _write_report
    from agl_cli.evaluation.interrupts import TermAsInterrupt
    from agl_cli.optimize.engine import execute_study
    from agl_cli.runs.rundir import stopped_by_failure

    # One process at a time runs this study (a second one is refused with this one's pid); SIGTERM acts as Ctrl-C.
    with study.run.hold(), TermAsInterrupt() as stop:
        if resume is not None:
            manifest = study.run.manifest()
            console.print(f"resuming study {study.run.run_id} (status {manifest.get('status')}): finished rollouts "
                          "are kept, decisions are replayed from the store")
        try:
            report = execute_study(study, quiet=quiet, use_cache=use_cache)
        except Exception as exc:  # a store or disk that refused a write: said clearly, the study resumable
            error = stopped_by_failure(study.run, exc, f"agl optimize --resume {study.run.run_id}")
            if error is None:
                raise
            raise error from None
        if report["status"] != "interrupted":
            report["report"] = _write_report(study.run)
    if report["status"] == "interrupted":
        console.print(f"interrupted; nothing finished is lost. Resume with: agl optimize --resume {study.run.run_id}")
        if json_output:
            print_json(report)
        raise typer.Exit(stop.exit_code)
    if json_output:
        print_json(report)
    else:
        _print_report(stdout_console(), report)
        console.print(f"study stored in {study.run.path}")
    if report.get("winner") is None:
        console.print("no variant produced a reward; see `agl eval` on one variant for the reasons")
        raise typer.Exit(1)
