"""`agl report RUN_OR_STUDY`: write a run's, study's or training run's report as Markdown and/or HTML."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from agl_cli.cli_support import handle_errors


class Format(str, Enum):
    md = "md"
    html = "html"
    both = "both"


@handle_errors
def report_command(
    run: Annotated[str, typer.Argument(metavar="RUN_OR_STUDY", show_default=False,
                                       help="A run or study: its id, a unique id prefix, its folder, or `latest`.")],
    format_: Annotated[Format, typer.Option("--format", "-f", help="md (GitHub Markdown + SVG files), html (one "
                                            "self-contained file) or both.")] = Format.both,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Folder to write into (default: <run>/report).")] = None,  # noqa: UP045,E501
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where runs live (default .agl/runs or $AGL_HOME/runs).")] = None,  # noqa: UP045,E501
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    volume: Annotated[Optional[str], typer.Option(help="Tasks the agent handles in production, e.g. 40000/month (default: the `volume:` the run was made with): adds cost per month.")] = None,  # noqa: UP045,E501
) -> None:
    """Write a report people read: the verdict, Pareto plots, per-variant table, flipped tasks, failures, spend,
    training curves and transcripts (secrets removed). Prints the written paths."""
    from agl_cli.console import print_json, stderr_console
    from agl_cli.report import write_report
    from agl_cli.runs.rundir import find_run
    from agl_cli.spec.volume import parse_volume

    at_volume = parse_volume(volume) if volume is not None else None
    target = find_run(run, runs_dir)
    formats = ("md", "html") if format_ == Format.both else (format_.value,)
    stderr_console().print(f"writing the report of {target.run_id}")
    paths = write_report(target, formats, out_dir=out, volume=at_volume)
    if json_output:
        print_json({
            "run_id": target.run_id, "run_dir": str(target.path), "kind": target.manifest().get("kind"),
            "formats": list(formats), "files": [str(p) for p in paths],
            "report": {f: str(p) for p in paths for f in formats if p.name == f"report.{f}"},
        })
        return
    for path in paths:
        typer.echo(str(path))
