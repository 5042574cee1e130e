"""`agl spend [agl.yaml]`: what the runs in the runs folder have spent, together and run by run, against a budget:
rollouts launched and the USD cost of model calls. Given a spec, only its runs, against its `budget:` (all its runs
together with `scope: experiment`; with `scope: run` each run has the budget of its own, so nothing is "left" of it
across runs). A rollout a run reused from an earlier one (the result cache) was paid for
once, by the earlier run: it is counted apart (`reused_rollouts`, `reused_usd`), never launched or spent again.
A call without a price makes a cost unknown (`usd` is then null, and `priced_usd` what is known to be spent at least).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors

_TIME_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d")


def since_epoch(text: str | None) -> float:
    """Seconds since the epoch, or a local time like 2025-01-31T09:30."""
    from agl_cli.errors import UsageError

    if not text:
        return 0.0
    try:
        return float(text)
    except ValueError:
        pass
    for fmt in _TIME_FORMATS:
        try:
            return time.mktime(time.strptime(text, fmt))
        except ValueError:
            continue
    raise UsageError(f"--since {text!r}: give seconds since the epoch or a local time like 2025-01-31T09:30")


def _budget(spec_file: Path | None, usd_flag: float | None, rollouts_flag: int | None) -> dict[str, Any]:
    """The budget spend is measured against: the flags', else the spec's `budget:` with its scope."""
    if usd_flag is not None or rollouts_flag is not None:
        return {"usd": usd_flag, "rollouts": rollouts_flag, "scope": "given", "source": "flags"}
    if spec_file is None:
        return {"usd": None, "rollouts": None, "scope": "given", "source": None}
    from agl_cli.spec.schema import load_spec

    budget = load_spec(spec_file).budget
    return {"usd": budget.usd, "rollouts": budget.rollouts, "scope": budget.scope,
            "source": str(spec_file.resolve())}


def _left(budget: dict[str, Any], rollouts: int, priced: float) -> dict[str, Any]:
    """What is left across these runs: nothing to say of a per-run budget (scope run) summed over runs."""
    if budget["scope"] == "run":
        return {"usd": None, "rollouts": None}
    return {"usd": None if budget["usd"] is None else round(budget["usd"] - priced, 6),
            "rollouts": None if budget["rollouts"] is None else budget["rollouts"] - rollouts}


@handle_errors
def spend_command(
    config: Annotated[Optional[Path], typer.Argument(help="An experiment spec (agl.yaml or its folder): only its runs, against its `budget:`.", show_default=False)] = None,  # noqa: UP045,E501
    since: Annotated[Optional[str], typer.Option(help="Only runs created at or after this time: seconds since the epoch, or a local time like 2025-01-31T09:30.")] = None,  # noqa: UP045,E501
    spec: Annotated[Optional[Path], typer.Option(help="Only runs of this agl.yaml, against its `budget:` (the same as the argument).")] = None,  # noqa: UP045,E501
    budget_usd: Annotated[Optional[float], typer.Option(help="The ceiling on model cost, in USD (instead of the spec's).")] = None,  # noqa: UP045,E501
    budget_rollouts: Annotated[Optional[int], typer.Option(help="The ceiling on rollouts launched (instead of the spec's).")] = None,  # noqa: UP045,E501
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where runs live (default .agl/runs or $AGL_HOME/runs).")] = None,  # noqa: UP045,E501
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """What has been spent across runs (rollouts launched, model cost in USD) and what is left of a budget;
    `over_budget` once either ceiling is reached. Check it before each new eval, compare or optimize."""
    from agl_cli.console import print_json, print_rows, stderr_console
    from agl_cli.errors import UsageError
    from agl_cli.metrics.fmt import usd
    from agl_cli.runs.experiment_budget import spent

    if config is not None and spec is not None:
        raise UsageError("give the spec once: as the argument (agl spend agl.yaml) or as --spec")
    spec_file = config if config is not None else spec
    if spec_file is not None and spec_file.is_dir():
        spec_file = spec_file / "agl.yaml"
    # A spec moved or deleted since still names its runs; only its budget cannot be read then.
    budget = _budget(spec_file if spec_file is not None and spec_file.is_file() else None, budget_usd,
                     budget_rollouts)
    found = spent(runs_dir, spec=spec_file, since=since_epoch(since))
    runs, rollouts, priced, unpriced = found.runs, found.rollouts, found.priced_usd, found.unpriced_calls
    # An experiment's budget covers every run of its spec, whatever --since shows.
    basis = spent(runs_dir, spec=spec_file) if since and budget["scope"] == "experiment" else found
    limited = budget["scope"] != "run"
    over = limited and ((budget["usd"] is not None and basis.priced_usd >= budget["usd"]) or (
        budget["rollouts"] is not None and basis.rollouts >= budget["rollouts"]))
    doc = {
        "runs_dir": str(found.root), "spec": str(spec_file.resolve()) if spec_file is not None else None,
        "runs": runs, "rollouts": rollouts,
        "usd": found.usd, "priced_usd": round(priced, 6), "unpriced_calls": unpriced,
        "reused_rollouts": sum(r["reused_rollouts"] for r in runs),
        "budget": {k: budget[k] for k in ("usd", "rollouts", "scope", "source")},
        "left": _left(budget, basis.rollouts, basis.priced_usd),
        "over_budget": over,
        "skipped": [{"run_dir": str(s.path), "reason": s.reason} for s in found.skipped],
    }
    if json_output:
        print_json(doc)
        return
    title = f"spend of the runs of {spec_file}" if spec_file is not None else f"spend of the runs in {found.root}"
    out = print_rows(title, ("run", "kind", "rollouts", "usd", "reused rollouts", "reused usd"),
                     [(r["run_id"], r["kind"] or "", str(r["rollouts"]), usd(r["usd"], unpriced_calls=r["unpriced_calls"]),
                       str(r["reused_rollouts"]), usd(r["reused_usd"])) for r in runs])
    out.print(f"total: {rollouts} rollouts launched, {usd(doc['usd'], unpriced_calls=unpriced)}", markup=False)
    for line in _budget_lines(doc):
        out.print(line, markup=False)
    for s in found.skipped:
        stderr_console().print(f"skipped {s.path.name}: {s.reason}", markup=False)


def _budget_lines(doc: dict[str, Any]) -> list[str]:
    """Spent and left of each ceiling, or why nothing is left to show."""
    from agl_cli.metrics.fmt import usd

    budget, left = doc["budget"], doc["left"]
    if budget["usd"] is None and budget["rollouts"] is None:
        if doc["spec"] and not Path(doc["spec"]).is_file():
            return [f"no budget: {doc['spec']} is not there to read one from (its runs are listed all the same)"]
        if doc["spec"]:
            return ["no budget: give one with --budget-usd / --budget-rollouts, or set `budget:` in agl.yaml"]
        return ["against the budget of agl.yaml here: agl spend agl.yaml"] if Path("agl.yaml").is_file() else []
    if budget["scope"] == "run":
        ceilings = ", ".join(x for x in (f"${budget['usd']:g}" if budget["usd"] is not None else "",
                                         f"{budget['rollouts']} rollouts" if budget["rollouts"] is not None else "") if x)
        return [f"budget: {ceilings} for each run on its own (budget.scope: run), so nothing is left or spent of it "
                "across runs; for one ceiling over every run of this spec, set `scope: experiment` under `budget:`"]
    lines = []
    if budget["usd"] is not None:
        spent_usd = usd(budget["usd"] - left["usd"])
        if doc["unpriced_calls"]:
            spent_usd = f"at least {spent_usd} ({doc['unpriced_calls']} calls without a price)"
        rest = usd(left["usd"]) if left["usd"] >= 0 else f"none ({usd(-left['usd'])} over)"
        lines.append(f"budget: {spent_usd} spent of ${budget['usd']:g}, {rest} left")
    if budget["rollouts"] is not None:
        lines.append(f"budget: {budget['rollouts'] - left['rollouts']} of {budget['rollouts']} rollouts launched, "
                     f"{max(left['rollouts'], 0)} left")
    if doc["over_budget"]:
        lines.append("over budget: stop here and report; raising the budget is the user's decision")
    return lines
