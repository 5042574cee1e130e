"""Human-readable tables of results, rendered with rich (plain text when piped or NO_COLOR)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agl_cli.console import fmt_ci
from agl_cli.costs import usd_text
from agl_cli.summary import VariantSummary


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}s"


def variant_table(summaries: list[VariantSummary], *, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column, justify in [
        ("variant", "left"), ("n", "right"), ("accuracy [95% CI]", "right"), ("missing", "right"),
        ("errors", "right"), ("latency p50/p95", "right"), ("tokens in/out", "right"), ("cost", "right"),
        ("served by", "left"),
    ]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for s in summaries:
        table.add_row(
            Text(s.name),
            str(s.accuracy.n),
            fmt_ci(s.accuracy.mean, s.accuracy.ci95),
            str(s.missing),
            "—" if s.error_rate is None else f"{100 * s.error_rate:.0f}%",
            f"{_seconds(s.latency_p50)} / {_seconds(s.latency_p95)}",
            f"{s.input_tokens:,} / {s.output_tokens:,}",
            usd_text(s.cost_usd, s.unpriced_calls),
            Text(s.served.label()),
        )
    return table


def print_model_warnings(console: Console, summaries: list[VariantSummary]) -> None:
    """A line per variant whose calls asked for one model and were served by another (the default)."""
    for s in summaries:
        for line in s.model_warnings:
            console.print(f"warning: {line}", markup=False, highlight=False)


def print_missing_reasons(console: Console, summaries: list[VariantSummary]) -> None:
    for s in summaries:
        if s.missing_reasons:
            reasons = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in sorted(s.missing_reasons.items()))
            console.print(f"{s.name}: {s.missing} without a reward ({reasons})")
