"""Number and text formatting shared by both report formats, and escaping for Markdown (GitHub) and HTML.

Numbers shown to a person carry n and a 95% interval where one exists; the helpers here keep the wording the
same across the verdict, the tables and the plots.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

# Rich text for the verdict: pieces of (text, bold). Each format renders the emphasis its own way, so a variant
# name with `*` or `<` in it can never break out of either.
Rich = list[tuple[str, bool]]

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~])")


def pct(value: float | None, ci: Sequence[float] | None = None, digits: int = 1) -> str:
    if value is None:
        return "—"
    text = f"{100 * value:.{digits}f}%"
    return text if not ci else f"{text} [{100 * ci[0]:.{digits}f}, {100 * ci[1]:.{digits}f}]"


def points(value: float | None, ci: Sequence[float] | None = None) -> str:
    """A difference of accuracies in percentage points, signed."""
    if value is None:
        return "—"
    text = f"{100 * value:+.1f} points"
    return text if not ci else f"{text} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def usd(value: float | None, ci: Sequence[float] | None = None, *, signed: bool = False) -> str:
    """Dollars with enough digits to tell small per-task costs apart ($0.00042, not $0.00)."""
    if value is None:
        return "—"

    def one(x: float) -> str:
        magnitude = abs(x)
        digits = 2 if magnitude >= 1 else 4 if magnitude >= 0.01 else 6 if magnitude > 0 else 2
        sign = ("+" if x >= 0 else "-") if signed else ("-" if x < 0 else "")
        return f"{sign}${magnitude:.{digits}f}"

    if not ci or one(ci[0]) == one(ci[1]) == one(value):  # every rollout cost the same: no interval to show
        return one(value)
    return f"{one(value)} [{one(ci[0])}, {one(ci[1])}]"


def seconds(value: float | None, ci: Sequence[float] | None = None, *, signed: bool = False) -> str:
    if value is None:
        return "—"
    fmt = "+.2f" if signed else ".2f"
    text = f"{format(value, fmt)}s"
    return text if not ci else f"{text} [{format(ci[0], fmt)}, {format(ci[1], fmt)}]"


def count(value: int | float) -> str:
    return f"{int(value):,}"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def reason_label(reason: str) -> str:
    return reason.replace("_", " ")


def md_escape(text: object) -> str:
    """Text safe inside a GitHub Markdown table cell or paragraph: specials backslash-escaped (a `|` would
    otherwise split the cell), newlines folded (a row is one line)."""
    flat = re.sub(r"\s+", " ", str(text))  # not stripped: verdict pieces keep the spaces between them
    return _MD_SPECIAL.sub(r"\\\1", flat)


def rich_md(pieces: Rich) -> str:
    return "".join(f"**{md_escape(t)}**" if bold else md_escape(t) for t, bold in pieces)


def rich_html(pieces: Rich) -> str:
    return "".join(f"<strong>{html.escape(t)}</strong>" if bold else html.escape(t) for t, bold in pieces)


def rich_plain(pieces: Rich) -> str:
    return "".join(t for t, _ in pieces)


def anchor(rollout_id: str) -> str:
    """The id of a transcript: the same slug GitHub gives a `## <rollout id>` heading (ids are [a-z0-9-])."""
    return re.sub(r"[^a-z0-9_-]", "", rollout_id.lower())


def fence(text: str) -> str:
    """A code fence longer than any run of backticks inside the text, so the text cannot close it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)
