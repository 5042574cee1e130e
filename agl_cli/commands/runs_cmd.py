"""`agl runs`: the runs in the runs folder, oldest first, and `agl runs RUN`: one run's rollouts (the newest attempt of
each variant, task and seed) with what their model calls used, per model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors

if TYPE_CHECKING:
    from agl_cli.runs.rundir import RunDir, RunsIndex


def _listing(index: RunsIndex, *, kind: str | None, spec: Path | None, agent_version: str | None) -> dict[str, Any]:
    rows = [{
        "run_id": r.run_id, "kind": r.kind, "status": r.status, "spec": r.spec_path,
        "split": r.manifest.get("split"), "created_at": r.created_at,
        "variants": [str(v.get("name")) for v in r.manifest.get("variants", []) if isinstance(v, dict)],
    } for r in index.select(kind=kind, spec=spec, agent_version=agent_version)]
    return {"runs_dir": str(index.root), "runs": rows,
            "skipped": [{"run_dir": str(s.path), "reason": s.reason} for s in index.skipped]}


def _run_document(target: RunDir) -> dict[str, Any]:
    """The run's manifest facts and its rollouts, each with its calls' use per `upstream/model` (secrets removed)."""
    from agl_cli.report.redact import scrub, scrub_text
    from agl_cli.runs.rundir import IndexedRun

    manifest = target.manifest()
    store = target.open_store(read_only=True)
    try:
        rollouts = store.rollouts(latest_only=True)
        groups = store.model_calls()
    finally:
        store.close()
    used: dict[str, dict[str, dict[str, Any]]] = {}
    for g in groups:
        if g.rollout_id is None:
            continue
        entry = used.setdefault(g.rollout_id, {}).setdefault(g.served, dict.fromkeys(
            ("calls", "failed_calls", "input_tokens", "output_tokens", "latency_s", "priced_usd", "unpriced_calls"), 0))
        entry["calls"] += g.calls
        entry["failed_calls"] += g.calls if g.failed else 0
        for name in ("input_tokens", "output_tokens", "latency_s", "priced_usd", "unpriced_calls"):
            entry[name] += getattr(g, name)
    docs = []
    for r in rollouts:
        doc = r.model_dump(mode="json")
        for name in ("output", "error", "stdout_tail", "stderr_tail"):
            doc[name] = scrub_text(doc[name]) if doc[name] else doc[name]
        doc["grader_detail"] = scrub(doc["grader_detail"])
        doc["duration_s"] = r.duration_s
        doc["calls"] = {model: {**u, "cost_usd": None if u["unpriced_calls"] else u["priced_usd"]}
                        for model, u in sorted(used.get(r.id, {}).items())}
        docs.append(doc)
    return {
        "run_id": target.run_id, "run_dir": str(target.path), "kind": manifest.get("kind"),
        "status": IndexedRun(target, manifest).status, "spec": manifest.get("spec_path"), "split": manifest.get("split"),
        "created_at": manifest.get("created_at"), "rollouts": docs,
    }


@handle_errors
def runs_command(
    run: Annotated[Optional[str], typer.Argument(help="One run: its id, a unique id prefix, its folder, or `latest` (default: list every run).", show_default=False)] = None,  # noqa: UP045,E501
    kind: Annotated[Optional[str], typer.Option(help="Only runs of this kind: eval, study, train.")] = None,  # noqa: UP045
    spec: Annotated[Optional[Path], typer.Option(help="Only runs of this agl.yaml.")] = None,  # noqa: UP045
    agent_version: Annotated[Optional[str], typer.Option(help="Only runs of this agent version (see a run's manifest).")] = None,  # noqa: UP045,E501
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where runs live (default .agl/runs or $AGL_HOME/runs).")] = None,  # noqa: UP045,E501
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """List runs: id, kind, status, spec; runs whose manifest is damaged are named apart, with the reason. With RUN,
    that run's rollouts: status, reward or why none, and their model calls' tokens, cost and latency per model."""
    from agl_cli.console import print_json, print_rows, stderr_console
    from agl_cli.errors import UsageError
    from agl_cli.runs.rundir import RunsIndex, find_run

    if run is not None:
        if kind or spec or agent_version:
            raise UsageError("give either one RUN or filters (--kind, --spec, --agent-version), not both")
        doc = _run_document(find_run(run, runs_dir))
        if json_output:
            print_json(doc)
            return
        rows = []
        for r in doc["rollouts"]:
            calls = sum(u["calls"] for u in r["calls"].values())
            unknown = any(u["cost_usd"] is None for u in r["calls"].values())
            cost = "—" if unknown else f"${sum(u['cost_usd'] for u in r['calls'].values()):.4f}"
            reward = f"{r['reward']:g}" if r["reward"] is not None else f"none ({r['failure'] or r['status']})"
            rows.append((r["id"], r["variant"], r["task_id"], str(r["seed"]), r["split"] or "", r["status"], reward,
                         str(calls), cost))
        print_rows(f"run {doc['run_id']} ({doc['kind']}): the newest attempt of each rollout",
                   ("rollout", "variant", "task", "seed", "split", "status", "reward", "calls", "cost"), rows)
        return

    index = RunsIndex.scan(runs_dir)
    listing = _listing(index, kind=kind, spec=spec, agent_version=agent_version)
    if json_output:
        print_json(listing)
        return
    print_rows(f"runs in {index.root}", ("run", "kind", "status", "split", "variants", "spec"),
               [(row["run_id"], row["kind"] or "", row["status"] or "", row["split"] or "all",
                 ", ".join(row["variants"]), row["spec"] or "") for row in listing["runs"]])
    for skipped in index.skipped:
        stderr_console().print(f"skipped {skipped.path.name}: {skipped.reason}", markup=False)
