"""`agl advise`: the readiness verdict for weight training, from what the run store already measured.

The text is laid out for a person or an agent reading a terminal or a pipe alike: one block per criterion, every
line wrapped within 100 columns (or the terminal's width when narrower), so nothing wraps mid-cell or runs to
hundreds of columns. `--json` carries the same document in full.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors

MARKS = {"pass": "ok", "warn": "warn", "fail": "NO", "unknown": "?"}
MAX_WIDTH = 100
INDENT = " " * 6


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> str:
    return textwrap.fill(text, width=width, initial_indent=first, subsequent_indent=rest or " " * len(first),
                         break_long_words=False, break_on_hyphens=False)


def render(document: dict[str, Any], title: str, width: int) -> str:
    """The verdict document as text no wider than `width` (a long unbreakable word, such as a path, excepted)."""
    lines = [_wrap(title, width), ""]
    for c in document["criteria"]:
        lines.append(_wrap(c["title"], width, f"{MARKS[c['status']]:<6}"))
        lines.append(_wrap(c["detail"], width, INDENT + "measured: ", INDENT + " " * 10))
        lines.append(_wrap(c["threshold"], width, INDENT + "needs:    ", INDENT + " " * 10))
    lines.append("")
    lines.append(f"verdict: {document['verdict']}")
    for warning in document["warnings"]:
        lines.append(_wrap(warning, width, "warning: ", "  "))
    for step in document["next_steps"]:
        lines.append(_wrap(step, width, "first: ", "  "))
    if document.get("undecided"):
        from agl_cli.training.advise_plateau import undecided_line

        lines.append("")
        lines.append(_wrap("undecided changes that lean better: put each to the user as likely better, unproven "
                           "(never drop it in silence), or decide it with the evidence named", width))
        lines += [_wrap(undecided_line(item), width, "- ", "  ") for item in document["undecided"]]
    return "\n".join(lines)


@handle_errors
def advise_command(
    target: Annotated[str, typer.Argument(metavar="CONFIG_OR_STUDY",
                                          help="agl.yaml (or its folder), or a study or run id.", show_default=False)],
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where runs live (default .agl/runs or $AGL_HOME/runs).")] = None,  # noqa: UP045,E501
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Say whether weight training is warranted (`train` or `not yet`), each criterion measured against its threshold."""
    from agl_cli.console import print_json, stdout_console
    from agl_cli.runs.experiment_budget import limit_to_experiment
    from agl_cli.spec.schema import load_spec
    from agl_cli.training.advise import advise, probe_compute
    from agl_cli.training.advise_evidence import gather

    evidence = gather(target, runs_dir)
    spec = load_spec(evidence.spec_path)
    limit_to_experiment(spec, evidence.spec_path, runs_dir, refuse=False)  # the projection fits what is left
    document = advise(spec, evidence, probe_compute(spec))
    if json_output:
        print_json(document)
        return
    out = stdout_console()
    counts = document["evidence"]
    width = min(out.width, MAX_WIDTH) if out.is_terminal else MAX_WIDTH
    title = (f"ready to train? {spec.name} ({counts['runs']} runs, {counts['rollouts']} rollouts, "
             f"{counts['journal_entries']} journal entries)")
    out.print(render(document, title, width), markup=False, highlight=False, soft_wrap=True)
