"""The report's figures from its data: Pareto plots (accuracy vs cost per task, accuracy vs p95 latency) with the
baseline and the winner marked, the reward and latency distributions (what a single variant gets), spend over time,
and training curves.

Cost is plotted only for variants whose every call has a price; the others are left out and the caption names them.
When no variant has a known cost above zero (free local models, unpriced ones), accuracy is plotted against tokens
per task instead, which still tells a cheap variant from a wasteful one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agl_cli.metrics.fmt import pct, unpriced_text
from agl_cli.metrics.variant import VariantMetrics
from agl_cli.report import svg
from agl_cli.report.collect import RunData, Section

TRAIN_CURVES = {  # key -> (title, axis label, as percent)
    "reward": ("Mean reward per step", "mean reward", False),
    "pass_rate": ("Pass rate per step", "pass rate", True),
    "entropy": ("Policy entropy per step", "entropy", False),
    "kl": ("KL to the reference policy per step", "KL", False),
    "tokens_per_s": ("Throughput per step", "tokens / s", False),
}
LABEL_ALL_UNDER = 8  # with more variants, only the baseline, the winner and the front are labelled


@dataclass
class Plot:
    name: str
    title: str
    caption: str
    svg: str

    @property
    def file(self) -> str:
        return f"{self.name}.svg"


def _pct_axis(v: float) -> str:
    return pct(v, digits=0)


def _short(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _usd_axis(v: float) -> str:
    # Axis ticks are round numbers: as few digits as they need ($0.00025, $0.0005), never a run of zeros.
    text = f"{abs(v):.6f}".rstrip("0").rstrip(".")
    return ("-$" if v < 0 else "$") + (text if text != "0" else "0")


def pareto(section: Section) -> list[Plot]:
    rows = [r for r in section.rows if r.accuracy.mean is not None]
    if len(rows) < 2:
        return []
    many = len(rows) > LABEL_ALL_UNDER
    crowded_front = sum(1 for r in rows if r.name in section.front) > LABEL_ALL_UNDER // 2

    def point(row: VariantMetrics, x: float, x_ci: tuple[float, float] | None) -> svg.Point:
        role = section.role_of(row.name) or ("front" if row.name in section.front else "")
        acc = row.accuracy
        return svg.Point(x=x, y=acc.mean or 0.0, label=row.name, role=role, y_ci=acc.ci95, x_ci=x_ci,
                         show_label=not many or role in ("baseline", "winner") or (role == "front" and not crowded_front))

    def chart(points: list[svg.Point], title: str, x_label: str, x_fmt: svg.Fmt) -> str:
        xs = [p.x for p in points]
        # From zero when the spread is already wide (perspective for free); else zoom in, or points pile up.
        return svg.scatter(points, title=title, x_label=x_label, x_fmt=x_fmt, x_from_zero=min(xs) < 0.5 * max(xs),
                           y_label="accuracy (95% CI)", y_fmt=_pct_axis, y_bounds=(0.0, 1.0))

    legend = ("The baseline is the square, the winner the diamond; filled dots are on the Pareto front (no other "
              "variant is at least as good on accuracy, cost, p95 latency and pass^k, and better on one).")
    priced = [r for r in rows if not r.unpriced_calls and r.cost_per_task.mean is not None]
    unknown = [r for r in rows if r.unpriced_calls]
    left_out = ("" if not unknown else " Left out, their cost unknown: " + ", ".join(
        f"{r.name} ({unpriced_text(r.unpriced_calls)})" for r in unknown) + ".")
    if len(priced) >= 2 and any((r.cost_per_task.mean or 0.0) > 0 for r in priced):
        title = f"Accuracy vs cost per task — {section.heading}"
        plot = Plot(
            "pareto_cost", title,
            "Each point is a variant; vertical bars are 95% intervals of accuracy, horizontal bars of cost per task. "
            + legend + left_out,
            chart([point(r, r.cost_per_task.mean or 0.0, r.cost_per_task.ci95) for r in priced], title,
                  "cost per task (USD)", _usd_axis),
        )
    else:
        title = f"Accuracy vs tokens per task — {section.heading}"
        why = "their cost is zero or unknown" if unknown else "no variant has a cost above zero"
        plot = Plot(
            "pareto_tokens", title,
            f"Plotted against input + output tokens per task because {why}. Vertical bars are 95% intervals of "
            "accuracy, horizontal bars of tokens per task. " + legend,
            chart([point(r, r.tokens_per_task.mean or 0.0, r.tokens_per_task.ci95) for r in rows], title,
                  "tokens per task (input + output)", _short),
        )
    plots = [plot]
    timed = [r for r in rows if r.latency_p95 is not None]
    if len(timed) >= 2:
        latency_points = [point(r, r.latency_p95 or 0.0, None) for r in timed]
        plots.append(Plot(
            "pareto_latency", f"Accuracy vs p95 latency — {section.heading}",
            "Latency is the 95th percentile of a rollout's wall time; bars are 95% intervals of accuracy.",
            chart(latency_points, f"Accuracy vs p95 latency — {section.heading}", "p95 rollout latency (s)",
                  lambda v: f"{v:.3g}s"),
        ))
    return plots


def _bins(lo: float, hi: float, count: int = 10) -> list[float]:
    """About `count` bins of a round width covering [lo, hi]."""
    ticks = svg.nice_ticks(lo, hi if hi > lo else lo + 1.0, count)
    step = ticks[1] - ticks[0]
    start = math.floor(lo / step + 1e-9) * step
    edges = [round(start + i * step, 12) for i in range(2)]
    while edges[-1] < hi:  # the last bin is closed: it holds hi itself (a reward of 1 in [0.9, 1])
        edges.append(round(start + len(edges) * step, 12))
    return edges


def _counts(values: list[float], edges: list[float]) -> list[float]:
    counts = [0.0] * (len(edges) - 1)
    for v in values:
        index = next((i for i in range(len(edges) - 1) if v < edges[i + 1]), len(edges) - 2)
        counts[max(index, 0)] += 1
    return counts


def distributions(section: Section) -> list[Plot]:
    """The reward and the rollout latency distributions, one series per variant: what a report on a single variant
    plots, and what any report falls back on when there is no Pareto plot."""
    rewards = {r.name: [float(x.reward) for x in section.rollouts.get(r.name, []) if x.reward is not None]
               for r in section.rows}
    every = [v for vs in rewards.values() for v in vs]
    edges = _bins(min([0.0, *every]), max([1.0, *every]))
    series = [svg.Series(name, [], _counts(values, edges)) for name, values in rewards.items()] or [
        svg.Series("no rollouts", [], [0.0] * (len(edges) - 1))]
    title = f"Rewards — {section.heading}"
    plots = [Plot(
        "dist_reward", title,
        f"How many scored rollouts got each reward (n = {len(every)}); a rollout without a reward is not counted "
        "here (see Failures).",
        svg.histogram(edges, series, title=title, x_label="reward", y_label="rollouts", x_fmt=lambda v: f"{v:.3g}"),
    )]
    durations = {r.name: [d for x in section.rollouts.get(r.name, []) if x.status.terminal
                          and (d := x.duration_s) is not None] for r in section.rows}
    timed = [d for ds in durations.values() for d in ds]
    if timed:
        edges = _bins(0.0, max(timed))
        title = f"Rollout latency — {section.heading}"
        plots.append(Plot(
            "dist_latency", title, f"Wall time of each finished rollout, from start to graded (n = {len(timed)}).",
            svg.histogram(edges, [svg.Series(name, [], _counts(values, edges)) for name, values in durations.items()],
                          title=title, x_label="rollout latency", y_label="rollouts", x_fmt=lambda v: f"{v:.3g}s"),
        ))
    return plots


def _time_axis(duration_s: float) -> tuple[float, str]:
    if duration_s <= 180:
        return 1.0, "s"
    if duration_s <= 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def spend(data: RunData) -> list[Plot]:
    usage = data.usage
    if not usage.times:
        return []
    scale, unit = _time_axis(usage.duration_s)
    start = usage.times[0]
    xs = [(t - start) / scale for t in usage.times]
    plots = []
    if usage.priced_cost > 0:
        x, y = svg.downsample(xs, usage.cumulative_cost)
        unpriced = (f" It leaves out {unpriced_text(usage.unpriced_calls)}, whose cost is unknown."
                    if usage.unpriced_calls else "")
        plots.append(Plot(
            "spend_cost", "Cumulative cost",
            f"Model spend over the run's {usage.calls:,} calls, by call end time.{unpriced}",
            svg.line([svg.Series("cost", x, y)], title="Cumulative cost", x_label=f"time since the first call ({unit})",
                     y_label="USD", x_fmt=_short, y_fmt=_usd_axis),
        ))
    x, y = svg.downsample(xs, [float(t) for t in usage.cumulative_tokens])
    plots.append(Plot(
        "spend_tokens", "Cumulative tokens", "Input plus output tokens over the run, by call end time.",
        svg.line([svg.Series("tokens", x, y)], title="Cumulative tokens (input + output)",
                 x_label=f"time since the first call ({unit})", y_label="tokens", x_fmt=_short, y_fmt=_short),
    ))
    return plots


def training(metrics: list[dict[str, Any]]) -> list[Plot]:
    plots = []
    for key, (title, label, percent) in TRAIN_CURVES.items():
        pairs = [(float(m["step"]), float(m[key])) for m in metrics if isinstance(m.get(key), int | float)]
        if not pairs:
            continue
        xs, ys = svg.downsample([p[0] for p in pairs], [p[1] for p in pairs])
        plots.append(Plot(
            f"train_{key}", title, f"{label} at each of {len(pairs)} logged steps.",
            svg.line([svg.Series(key, xs, ys)], title=title, x_label="step", y_label=label, x_fmt=_short,
                     y_fmt=_pct_axis if percent else _short, y_from_zero=key != "entropy"),
        ))
    return plots
