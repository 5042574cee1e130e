"""Human-readable tables of results, rendered with rich (plain text when piped or NO_COLOR)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agl_cli.metrics.cost import month_column, per_month_text, per_task_text
from agl_cli.metrics.fmt import count, pct, seconds
from agl_cli.metrics.variant import VariantMetrics, rough_note
from agl_cli.spec.volume import Volume


def variant_table(summaries: list[VariantMetrics], *, title: str, volume: Volume | None = None) -> Table:
    """One row per variant; cost per task with its interval, and per month when the user's volume is known (the
    run's total spend is printed under the table); with a partial-credit grader, the share of rollouts fully right
    (reward 1) beside the mean reward."""
    table = Table(title=title, title_justify="left", caption=rough_note(summaries), caption_justify="left")
    partial = any(s.partial_credit for s in summaries)
    columns = [("variant", "left"), ("n", "right"), ("accuracy [95% CI]", "right")]
    columns += [("fully right [95% CI]", "right")] if partial else []
    columns += [("missing", "right"), ("errors", "right"), ("latency p50/p95", "right"), ("tokens in/out", "right"),
                ("cost/task [95% CI]", "right")]
    if volume is not None:
        columns.append((month_column(volume), "right"))
    for column, justify in [*columns, ("served by", "left")]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for s in summaries:
        cells: list[Text | str] = [
            Text(s.name),
            str(s.accuracy.n),
            pct(s.accuracy.mean, s.accuracy.ci95),
            *([pct(s.fully_right.mean, s.fully_right.ci95)] if partial else []),
            str(s.missing),
            pct(s.error_rate.mean, digits=0),
            f"{seconds(s.latency_p50, digits=1)} / {seconds(s.latency_p95, digits=1)}",
            f"{count(s.input_tokens)} / {count(s.output_tokens)}",
            per_task_text(s),
        ]
        if volume is not None:
            cells.append(per_month_text(s, volume))
        table.add_row(*cells, Text(s.served.label()))
    return table


def print_model_warnings(console: Console, summaries: list[VariantMetrics]) -> None:
    """A line per variant whose calls asked for one model and were served by another (the default)."""
    for s in summaries:
        for line in s.model_warnings:
            console.print(f"warning: {line}", markup=False, highlight=False)


def print_missing_reasons(console: Console, summaries: list[VariantMetrics]) -> None:
    for s in summaries:
        if s.missing_reasons:
            reasons = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in sorted(s.missing_reasons.items()))
            console.print(f"{s.name}: {s.missing} without a reward ({reasons})")
