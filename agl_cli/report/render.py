"""Writing a report: the context through the jinja2 templates in `templates/report/` into `report.md` (with its
plots as `.svg` files and the linked transcripts in `transcripts.md` beside it) and/or one self-contained
`report.html` (plots inlined, no scripts, no network).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jinja2

from agl_cli.errors import UsageError
from agl_cli.report.context import Table
from agl_cli.report.markup import fence, md_escape
from agl_cli.runs.rundir import RunDir
from agl_cli.spec.volume import Volume
from agl_cli.templates import templates_dir

FORMATS = ("md", "html")
REPORT_DIR = "report"
TRANSCRIPTS_MD = "transcripts.md"


def md_table(table: Table, link_target: str = TRANSCRIPTS_MD) -> str:
    """A GitHub-flavoured Markdown table: header, alignment row, one line per row, `|` escaped in cells."""
    def cell(text: str, links: Iterable[tuple[str, str]] = ()) -> str:
        parts = [md_escape(text)] if text else []
        parts += [f"[{md_escape(label)}]({link_target}#{target})" for label, target in links]
        return " ".join(parts) or " "

    lines = ["| " + " | ".join(cell(c) for c in table.columns) + " |",
             "|" + "|".join(" ---: " if a == "r" else " --- " for a in table.align) + "|"]
    lines += ["| " + " | ".join(cell(c.text, c.links) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2"), default_for_string=False),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["md"] = md_escape
    env.filters["md_table"] = md_table
    env.filters["fence"] = fence
    return env


def render(context: dict[str, Any], fmt: str) -> str:
    return environment().get_template(f"report/report.{fmt}.j2").render(**context)


def check_formats(formats: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(formats))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise UsageError(f"unknown report format {', '.join(unknown) or '(none)'}: choose md, html or both")
    return chosen


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def write_files(context: dict[str, Any], out_dir: Path, formats: Iterable[str]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    chosen = check_formats(formats)
    if "md" in chosen:
        plots = (context["pareto_plots"] + context["distribution_plots"] + context["spend_plots"]
                 + (context["training"] or {}).get("plots", []))
        for plot in plots:
            written.append(_write(out_dir / plot.file, plot.svg))
        written.append(_write(out_dir / "report.md", render(context, "md")))
        if context["transcripts"]:
            template = environment().get_template("report/transcripts.md.j2")
            written.append(_write(out_dir / TRANSCRIPTS_MD, template.render(**context)))
    if "html" in chosen:
        written.append(_write(out_dir / "report.html", render(context, "html")))
    return written


def write_report(run_dir: Path | str | RunDir, formats: Iterable[str] = ("md", "html"), *,
                 out_dir: Path | None = None, train_metrics: list[dict[str, Any]] | None = None,
                 volume: Volume | None = None) -> list[Path]:
    """Write the report of a run or study into `out_dir` (default `<run>/report/`); returns the written paths.

    `train_metrics` overrides the run's own (store meta `train_metrics`, or `train_metrics.jsonl`); `volume` the
    one the run was made with."""
    from agl_cli.report.collect import collect
    from agl_cli.report.context import build

    run = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    chosen = check_formats(formats)
    context = build(collect(run, train_metrics=train_metrics, volume=volume))
    return write_files(context, out_dir or run.path / REPORT_DIR, chosen)
