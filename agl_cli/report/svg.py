"""Plots as plain SVG text: scatter plots with error bars and line charts, with axes, ticks and labels.

Written by hand instead of with matplotlib so a report needs nothing heavy, an HTML report can inline the very
same text (one self-contained file), and a Markdown report can sit next to the `.svg` files on GitHub. The SVG
uses no ids, scripts, external fonts or links, so any number of plots can share one page.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 72, 28, 58, 52
FONT = "system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif"
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
ROLE_STYLE = {  # role -> (legend text, colour)
    "baseline": ("baseline", "#1f77b4"),
    "winner": ("winner", "#e4572e"),
    "front": ("Pareto front", "#222222"),
    "": ("other", "#8a8a8a"),
}
LABEL_CHARS = 28

Fmt = Callable[[float], str]


@dataclass
class Point:
    x: float
    y: float
    label: str
    role: str = ""  # baseline, winner, front or ""
    y_ci: tuple[float, float] | None = None
    x_ci: tuple[float, float] | None = None
    show_label: bool = True


@dataclass
class Series:
    name: str
    xs: list[float]
    ys: list[float]


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 times a power of ten) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi <= lo:
        hi = lo + (abs(lo) * 0.5 or 1.0)
    raw = (hi - lo) / max(1, target)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(lo / step + 1e-9) * step
    ticks = []
    value = first
    while value < hi + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks if len(ticks) >= 2 else [first, first + step]


class _Frame:
    """The plot area and its mapping from data to pixels."""

    def __init__(self, x_ticks: list[float], y_ticks: list[float]) -> None:
        self.x0, self.x1 = x_ticks[0], x_ticks[-1]
        self.y0, self.y1 = y_ticks[0], y_ticks[-1]
        self.x_ticks, self.y_ticks = x_ticks, y_ticks

    def px(self, x: float) -> float:
        return LEFT + (x - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def py(self, y: float) -> float:
        return HEIGHT - BOTTOM - (y - self.y0) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM)


def _text(x: float, y: float, text: str, *, size: int = 12, anchor: str = "start", extra: str = "") -> str:
    return (f'<text x="{_num(x)}" y="{_num(y)}" font-size="{size}" text-anchor="{anchor}"{extra}>'
            f"{escape(text)}</text>")


def _open(title: str, description: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" font-family="{escape(FONT)}" fill="#222">',
        f"<title>{escape(title)}</title>",
        f"<desc>{escape(description)}</desc>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        _text(LEFT, 22, title, size=15, extra=' font-weight="600"'),
    ]


def _axes(frame: _Frame, x_label: str, y_label: str, x_fmt: Fmt, y_fmt: Fmt) -> list[str]:
    parts = []
    for t in frame.y_ticks:
        y = frame.py(t)
        parts.append(f'<line x1="{LEFT}" y1="{_num(y)}" x2="{WIDTH - RIGHT}" y2="{_num(y)}" stroke="#e6e6e6"/>')
        parts.append(_text(LEFT - 8, y + 4, y_fmt(t), size=11, anchor="end"))
    for t in frame.x_ticks:
        x = frame.px(t)
        label = x_fmt(t)
        # A label centred on the last tick may not fit in the right margin: end it at the tick instead.
        anchor = "end" if x + 3.4 * len(label) > WIDTH - 2 else "middle"
        parts.append(f'<line x1="{_num(x)}" y1="{TOP}" x2="{_num(x)}" y2="{HEIGHT - BOTTOM}" stroke="#f0f0f0"/>')
        parts.append(_text(x, HEIGHT - BOTTOM + 16, label, size=11, anchor=anchor))
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}" '
                 'fill="none" stroke="#999"/>')
    parts.append(_text((LEFT + WIDTH - RIGHT) / 2, HEIGHT - 12, x_label, anchor="middle"))
    mid = (TOP + HEIGHT - BOTTOM) / 2
    parts.append(_text(16, mid, y_label, anchor="middle", extra=f' transform="rotate(-90 16 {_num(mid)})"'))
    return parts


def _legend(entries: list[tuple[str, str, str]]) -> list[str]:
    """A row of (shape, colour, text) under the title."""
    parts, x = [], float(LEFT)
    for shape, colour, text in entries:
        parts.append(_marker(shape, colour, x + 5, 40, size=5))
        parts.append(_text(x + 14, 44, text, size=11))
        x += 24 + 6.5 * len(text)
    return parts


def _marker(shape: str, colour: str, x: float, y: float, *, size: float = 6) -> str:
    if shape == "square":
        return (f'<rect x="{_num(x - size)}" y="{_num(y - size)}" width="{_num(2 * size)}" height="{_num(2 * size)}" '
                f'fill="{colour}" stroke="#fff"/>')
    if shape == "diamond":
        s = size * 1.35
        return (f'<polygon points="{_num(x)},{_num(y - s)} {_num(x + s)},{_num(y)} {_num(x)},{_num(y + s)} '
                f'{_num(x - s)},{_num(y)}" fill="{colour}" stroke="#fff"/>')
    if shape == "hollow":
        return f'<circle cx="{_num(x)}" cy="{_num(y)}" r="{_num(size * 0.8)}" fill="#fff" stroke="{colour}" stroke-width="2"/>'
    if shape == "line":
        return f'<line x1="{_num(x - 6)}" y1="{_num(y)}" x2="{_num(x + 6)}" y2="{_num(y)}" stroke="{colour}" stroke-width="3"/>'
    return f'<circle cx="{_num(x)}" cy="{_num(y)}" r="{_num(size * 0.8)}" fill="{colour}"/>'


SHAPES = {"baseline": "square", "winner": "diamond", "front": "dot", "": "hollow"}


def _span(values: Sequence[float], pad: float = 0.06) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    margin = (hi - lo) * pad
    return lo - margin, hi + margin


def scatter(points: list[Point], *, title: str, x_label: str, y_label: str, x_fmt: Fmt, y_fmt: Fmt,
            x_from_zero: bool = False, y_bounds: tuple[float, float] | None = None, description: str = "") -> str:
    """Points with optional error bars (intervals), marked by role, labelled by name."""
    xs = [v for p in points for v in (p.x, *(p.x_ci or ()))]
    ys = [v for p in points for v in (p.y, *(p.y_ci or ()))]
    x_lo, x_hi = _span(xs or [0.0, 1.0], 0.08)
    y_lo, y_hi = _span(ys or [0.0, 1.0])
    if x_from_zero:
        x_lo = min(0.0, min(xs or [0.0]))
    if y_bounds is not None:
        y_lo, y_hi = max(y_bounds[0], y_lo), min(y_bounds[1], y_hi)
    frame = _Frame(nice_ticks(x_lo, x_hi), nice_ticks(y_lo, y_hi))
    parts = _open(title, description or title)
    roles = {p.role for p in points}
    parts += _legend([(SHAPES[r], ROLE_STYLE[r][1], ROLE_STYLE[r][0]) for r in ("baseline", "winner", "front", "")
                      if r in roles])
    parts += _axes(frame, x_label, y_label, x_fmt, y_fmt)
    # Draw the unremarkable points first, so the baseline and winner stay on top.
    order = sorted(points, key=lambda p: ("", "front", "baseline", "winner").index(p.role))
    for p in order:
        colour = ROLE_STYLE[p.role][1]
        x, y = frame.px(p.x), frame.py(p.y)
        tip = f"{p.label}: {x_fmt(p.x)}, {y_fmt(p.y)}"
        if p.y_ci is not None:
            lo, hi = frame.py(p.y_ci[0]), frame.py(p.y_ci[1])
            tip += f" [{y_fmt(p.y_ci[0])}, {y_fmt(p.y_ci[1])}]"
            parts.append(f'<path d="M{_num(x)},{_num(lo)}V{_num(hi)}M{_num(x - 4)},{_num(lo)}h8M{_num(x - 4)},'
                         f'{_num(hi)}h8" stroke="{colour}" stroke-width="1.5" fill="none" opacity="0.8"/>')
        if p.x_ci is not None:
            lo, hi = frame.px(p.x_ci[0]), frame.px(p.x_ci[1])
            parts.append(f'<path d="M{_num(lo)},{_num(y)}H{_num(hi)}M{_num(lo)},{_num(y - 4)}v8M{_num(hi)},'
                         f'{_num(y - 4)}v8" stroke="{colour}" stroke-width="1" fill="none" opacity="0.6"/>')
        parts.append(f"<g><title>{escape(tip)}</title>{_marker(SHAPES[p.role], colour, x, y, size=7)}</g>")
        if p.show_label:
            label = p.label if len(p.label) <= LABEL_CHARS else p.label[: LABEL_CHARS - 1] + "…"
            right = x < WIDTH - RIGHT - 7 * len(label) - 12
            parts.append(_text(x + 10 if right else x - 10, y - 8, label, size=11, anchor="start" if right else "end",
                               extra=f' fill="{colour}"'))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def line(series: list[Series], *, title: str, x_label: str, y_label: str, x_fmt: Fmt, y_fmt: Fmt,
         y_from_zero: bool = True, description: str = "") -> str:
    """Lines of (x, y) points, one colour per series; a legend when there are several."""
    xs = [x for s in series for x in s.xs] or [0.0, 1.0]
    ys = [y for s in series for y in s.ys if math.isfinite(y)] or [0.0, 1.0]
    y_lo, y_hi = _span(ys)
    if y_from_zero:
        y_lo = min(0.0, min(ys))
    frame = _Frame(nice_ticks(min(xs), max(xs)), nice_ticks(y_lo, y_hi))
    parts = _open(title, description or title)
    if len(series) > 1:
        parts += _legend([("line", PALETTE[i % len(PALETTE)], s.name) for i, s in enumerate(series)])
    parts += _axes(frame, x_label, y_label, x_fmt, y_fmt)
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        pts = [(frame.px(x), frame.py(y)) for x, y in zip(s.xs, s.ys, strict=True) if math.isfinite(y)]
        if not pts:
            continue
        path = "M" + "L".join(f"{_num(x)},{_num(y)}" for x, y in pts)
        parts.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2" stroke-linejoin="round"/>')
        if len(pts) <= 40:  # markers help read few points; on many they are noise
            parts += [f'<circle cx="{_num(x)}" cy="{_num(y)}" r="2.5" fill="{colour}"/>' for x, y in pts]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def downsample(xs: list[float], ys: list[float], limit: int = 400) -> tuple[list[float], list[float]]:
    """At most `limit` points, keeping the first and the last (a cumulative curve's ends are what matter)."""
    if len(xs) <= limit:
        return xs, ys
    step = (len(xs) - 1) / (limit - 1)
    picks = sorted({round(i * step) for i in range(limit)})
    return [xs[i] for i in picks], [ys[i] for i in picks]


def histogram(edges: list[float], series: list[Series], *, title: str, x_label: str, y_label: str, x_fmt: Fmt,
              description: str = "") -> str:
    """Counts per bin, bins bounded by `edges` (len(edges) - 1 bins); each series' `ys` holds its counts, drawn as
    bars side by side within a bin, one colour per series, a legend when there are several."""
    counts = [y for s in series for y in s.ys] or [0.0]
    frame = _Frame(nice_ticks(edges[0], edges[-1]) if len(edges) > 1 else [0.0, 1.0],
                   nice_ticks(0.0, max(max(counts), 1.0)))
    # The bins' own edges are the x ticks when there are few, so each bar sits between two labels.
    if 1 < len(edges) <= 12:
        frame.x_ticks, frame.x0, frame.x1 = list(edges), edges[0], edges[-1]
    parts = _open(title, description or title)
    if len(series) > 1:
        parts += _legend([("square", PALETTE[i % len(PALETTE)], s.name) for i, s in enumerate(series)])
    parts += _axes(frame, x_label, y_label, x_fmt, lambda v: f"{v:g}")
    base = frame.py(0.0)
    for b in range(len(edges) - 1):
        left, right = frame.px(edges[b]), frame.px(edges[b + 1])
        width = max((right - left - 4) / max(len(series), 1), 1.0)
        for i, s in enumerate(series):
            count = s.ys[b] if b < len(s.ys) else 0.0
            if count <= 0:
                continue
            top = frame.py(count)
            x = left + 2 + i * width
            tip = f"{s.name}: {count:g} in [{x_fmt(edges[b])}, {x_fmt(edges[b + 1])})"
            parts.append(f'<g><title>{escape(tip)}</title><rect x="{_num(x)}" y="{_num(top)}" width="{_num(width)}" '
                         f'height="{_num(base - top)}" fill="{PALETTE[i % len(PALETTE)]}" opacity="0.85"/></g>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
