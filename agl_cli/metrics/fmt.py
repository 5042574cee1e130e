"""How agl writes numbers for a person, the same in the terminal, the reports and the JSON's sentences: percentages,
percentage points, dollars, seconds and counts, each with its 95% interval where one is given. Missing is "—"; a
cost with an unpriced call is "— (N unpriced calls)", never $0."""

from __future__ import annotations

import math
from collections.abc import Sequence

MISSING = "—"


def _interval(lo: str, hi: str) -> str:
    return f" [{lo}, {hi}]"


def pct(value: float | None, ci: Sequence[float] | None = None, digits: int = 1) -> str:
    """`45.0%`, with its interval `45.0% [15.0, 75.0]` (a share given as a fraction)."""
    if value is None:
        return MISSING
    text = f"{100 * value:.{digits}f}%"
    return text if not ci else text + _interval(f"{100 * ci[0]:.{digits}f}", f"{100 * ci[1]:.{digits}f}")


def points(value: float | None, ci: Sequence[float] | None = None) -> str:
    """A difference of accuracies in percentage points, signed: `+12.5 points [+2.5, +22.5]`."""
    if value is None:
        return MISSING
    text = f"{100 * value:+.1f} points"
    return text if not ci else text + _interval(f"{100 * ci[0]:+.1f}", f"{100 * ci[1]:+.1f}")


def unpriced_text(calls: int) -> str:
    return f"{calls} unpriced call" + ("" if calls == 1 else "s")


def _dollars(x: float, signed: bool) -> str:
    magnitude = abs(x)
    if magnitude >= 1 or magnitude == 0:
        digits = 2
    elif magnitude >= 0.01:
        digits = 4
    else:  # at least two significant digits: $0.000420, $0.0000062, never a $0.000000 that reads as free
        digits = max(6, 1 - math.floor(math.log10(magnitude)))
    sign = ("+" if x >= 0 else "-") if signed else ("-" if x < 0 else "")
    return f"{sign}${magnitude:.{digits}f}"


def usd(value: float | None, ci: Sequence[float] | None = None, *, signed: bool = False,
        unpriced_calls: int = 0) -> str:
    """Dollars with enough digits to tell small per-task costs apart ($0.00042, not $0.00). With `unpriced_calls`
    the amount is unknown: `— (3 unpriced calls)`."""
    if unpriced_calls:
        return f"{MISSING} ({unpriced_text(unpriced_calls)})"
    if value is None:
        return MISSING
    text = _dollars(value, signed)
    if not ci or _dollars(ci[0], signed) == _dollars(ci[1], signed) == text:  # every rollout cost the same
        return text
    return text + _interval(_dollars(ci[0], signed), _dollars(ci[1], signed))


def seconds(value: float | None, ci: Sequence[float] | None = None, *, signed: bool = False, digits: int = 2) -> str:
    """`3.34s`, `+0.12s [-0.05, +0.30]`."""
    if value is None:
        return MISSING
    spec = f"{'+' if signed else ''}.{digits}f"
    text = f"{format(value, spec)}s"
    return text if not ci else text + _interval(format(ci[0], spec), format(ci[1], spec))


def count(value: int | float) -> str:
    """`16,512`."""
    return f"{int(value):,}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 task`, `3 tasks`, `2 proxies` (with `many`)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
