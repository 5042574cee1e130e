"""Text for both report formats: escaping for Markdown (GitHub) and HTML, the verdict's bold pieces, transcript
anchors and code fences. Numbers are written by agl_cli.metrics.fmt, the same everywhere.
"""

from __future__ import annotations

import html
import re

# Rich text for the verdict: pieces of (text, bold). Each format renders the emphasis its own way, so a variant
# name with `*` or `<` in it can never break out of either.
Rich = list[tuple[str, bool]]

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~])")


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
