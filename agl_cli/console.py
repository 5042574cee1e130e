"""Terminal output: data to stdout, progress and logs to stderr through rich; NO_COLOR and non-TTY honoured."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

# Wider than any table agl prints: the width a table is measured against when nothing may be cut.
_UNBOUNDED = 100_000


def _escape(code: int) -> str:
    return {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code) or (
        f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


# What a terminal would act on instead of showing: C0 and C1 controls (ANSI escapes start with ESC), DEL, NUL, and the
# Unicode controls that reorder or break the text around them (bidi overrides and isolates, line separators).
_UNSAFE = {code: _escape(code) for code in (*range(0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F, 0x2028,
                                            0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def safe_text(text: str) -> str:
    """`text` as a terminal may show it: every control character written as its escape (`\\x1b`, `\\n`,
    `\\u202e`), so a task id or variant name can neither color, move, hide nor reverse what is printed around it.
    Only for what people read; JSON output keeps the exact text."""
    return text.translate(_UNSAFE)


def stderr_console() -> Console:
    return Console(stderr=True, no_color="NO_COLOR" in os.environ, highlight=False, soft_wrap=True)


def stdout_console() -> Console:
    return Console(no_color="NO_COLOR" in os.environ, highlight=False, soft_wrap=True)


def print_table(console: Console, table: Table) -> None:
    """A table on a terminal fits the screen; anywhere else (a pipe, a file, an agent reading stdout) it is
    printed at its natural width, so no cell is wrapped or cut: run ids and variant names stay whole to copy."""
    if console.is_terminal:
        console.print(table)
        return
    natural = Measurement.get(console, console.options.update_width(_UNBOUNDED), table).maximum
    title = cell_len(str(table.title)) if table.title else 0
    whole = Console(file=console.file, width=max(natural, title, 1), no_color=True, color_system=None,
                    highlight=False, soft_wrap=True)
    whole.print(table)


# From this many rows on, a table on a terminal is drawn by plain_table too (rich takes seconds for thousands of rows).
_MANY_ROWS = 100


def plain_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The text rich draws for a table of one-line plain cells (its default box, a left-justified title), written
    directly: the same characters in a fraction of the time, for tables of thousands of rows."""
    widths = [cell_len(c) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], cell_len(cell))

    def line(left: str, fill: str, middle: str, right: str) -> str:
        return left + middle.join(fill * (w + 2) for w in widths) + right

    def cells(bar: str, values: Sequence[str]) -> str:
        return bar + bar.join(f" {v}{' ' * (w - cell_len(v))} " for v, w in zip(values, widths, strict=True)) + bar

    out = [title] if title else []
    out += [line("┏", "━", "┳", "┓"), cells("┃", columns), line("┡", "━", "╇", "┩")]
    out += [cells("│", row) for row in rows]
    out.append(line("└", "─", "┴", "┘"))
    return "\n".join(out) + "\n"


def print_rows(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> Console:
    """A table of plain text cells (names and ids are never read as markup, control characters are escaped) on
    stdout; returns that console. Off a terminal, and for long tables that fit it, drawn by plain_table."""
    from rich.text import Text

    title = safe_text(title)
    safe = [[safe_text(cell) for cell in row] for row in rows]
    console = stdout_console()
    if not console.is_terminal or len(safe) >= _MANY_ROWS:
        text = plain_table(title, columns, safe)
        if not console.is_terminal or max(map(cell_len, text.splitlines())) <= console.width:
            console.file.write(text)
            console.file.flush()
            return console
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in safe:
        table.add_row(*(Text(cell) for cell in row))
    print_table(console, table)
    return console


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
    sys.stdout.flush()

