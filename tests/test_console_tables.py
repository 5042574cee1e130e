"""Plain tables on stdout: drawn directly for long tables (rich takes seconds for thousands of rows) with exactly
the characters rich draws, and every control character of a cell or title escaped."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agl_cli.console import plain_table, print_table, safe_text

CASES = [
    ("runs in /tmp/x", ("run", "kind"), [("20250101-000000-aaaa", "eval"), ("b", "")]),
    ("a title far wider than the table it sits above, by a long way", ("a", "bb"), [("1", "2")]),
    ("t", ("a", "bb"), []),
    ("wide", ("task", "reward"), [("日本語のタスク", "1"), ("emoji 🙂", "0.5"), ("", "none (agent_crashed)")]),
    ("", ("only",), [("x",)]),
]


def _rich(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    table = Table(title=title or None, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    out = io.StringIO()
    print_table(Console(file=out, no_color=True, highlight=False, soft_wrap=True), table)
    return out.getvalue()


@pytest.mark.parametrize(("title", "columns", "rows"), CASES)
def test_plain_tables_are_what_rich_draws(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    assert plain_table(title or None, columns, rows) == _rich(title, columns, rows)


def test_control_characters_are_escaped_for_the_terminal() -> None:
    hostile = "a\x1b[31mred\x00\u202eevil\nline\ttab\x7f\x9b\u2066"
    shown = safe_text(hostile)
    assert shown == "a\\x1b[31mred\\x00\\u202eevil\\nline\\ttab\\x7f\\x9b\\u2066"
    assert all(c.isprintable() for c in shown)
    assert safe_text("plain – ümlaut 日本 🙂") == "plain – ümlaut 日本 🙂"  # printable text stays as it is
