"""`agl advise`: the readiness verdict for weight training, from what the run store already measured."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from agl_cli.cli_support import handle_errors

MARKS = {"pass": "ok", "warn": "warn", "fail": "NO", "unknown": "?"}


@handle_errors
def advise_command(
    target: Annotated[str, typer.Argument(metavar="CONFIG_OR_STUDY",
                                          help="agl.yaml (or its folder), or a study or run id.", show_default=False)],
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where runs live (default .agl/runs or $AGL_HOME/runs).")] = None,  # noqa: UP045,E501
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Say whether weight training is warranted (`train` or `not yet`), each criterion measured against its threshold."""
    from rich.table import Table
    from rich.text import Text

    from agl_cli.advise import advise, probe_compute
    from agl_cli.advise_evidence import gather
    from agl_cli.console import print_json, print_table, stdout_console
    from agl_cli.spec import load_spec

    evidence = gather(target, runs_dir)
    spec = load_spec(evidence.spec_path)
    document = advise(spec, evidence, probe_compute(spec))
    if json_output:
        print_json(document)
        return
    out = stdout_console()
    counts = document["evidence"]
    table = Table(title=f"ready to train? {spec.name} ({counts['runs']} runs, {counts['rollouts']} rollouts, "
                        f"{counts['journal_entries']} journal entries)", title_justify="left")
    for column in ("", "criterion", "measured", "threshold"):
        table.add_column(column)
    for c in document["criteria"]:
        table.add_row(Text(MARKS[c["status"]]), Text(c["title"]), Text(c["detail"]), Text(c["threshold"]))
    print_table(out, table)
    out.print(f"verdict: {document['verdict']}", markup=False)
    for warning in document["warnings"]:
        out.print(f"warning: {warning}", markup=False)
    for step in document["next_steps"]:
        out.print(f"first: {step}", markup=False)
