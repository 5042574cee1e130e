"""From a run's data to what the templates render: the verdict, tables of plain-text cells (each format
escapes them its own way), plots, and the transcripts the tables link to.

Both templates get the same context, so the Markdown and the HTML report never say different things.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from agl_cli.metrics.cost import month_column, per_month_text
from agl_cli.metrics.fmt import count, pct, plural, points, seconds, unpriced_text, usd
from agl_cli.metrics.rollout_costs import cost_unknown_reason
from agl_cli.metrics.variant import rough_note
from agl_cli.report import failures as fail
from agl_cli.report import plots
from agl_cli.report.collect import RunData, Section
from agl_cli.report.markup import anchor, reason_label, rich_html, rich_md, rich_plain
from agl_cli.report.transcripts import Transcript, clip, last_reply, transcript
from agl_cli.report.verdict import TESTS, notes, verdict
from agl_cli.spec.volume import Volume

MAX_TRANSCRIPTS = 60  # a report stays readable and small; the run store has every call
MAX_FLIPS = 40
MAX_REPLY_CHARS = 300  # a failure example's last model reply; its transcript has the whole of it


@dataclass
class Cell:
    text: str
    links: list[tuple[str, str]] = field(default_factory=list)  # (label, transcript anchor)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    align: list[str]  # "l" or "r" per column
    note: str = ""


def _table(title: str, columns: list[tuple[str, str]], rows: list[list[Cell | str]], note: str = "") -> Table:
    cells = [[c if isinstance(c, Cell) else Cell(c) for c in row] for row in rows]
    return Table(title, [c for c, _ in columns], cells, [a for _, a in columns], note)


def _variant_table(section: Section, seeds: int, threshold: float, study_rows: dict[str, dict[str, Any]],
                   volume: Volume | None = None) -> Table:
    k = seeds
    columns = [("variant", "l"), ("role", "l"), ("n", "r"), ("accuracy [95% CI]", "r")]
    partial = any(r.partial_credit for r in section.rows)
    if partial:
        columns.append(("fully right [95% CI]", "r"))
    if k > 1:
        columns.append((f"pass^{k} [95% CI]", "r"))
    columns += [("cost/task [95% CI]", "r")] + ([(month_column(volume), "r")] if volume is not None else [])
    columns += [("total cost", "r"), ("latency p50 / p95", "r"),
                ("errors+timeouts [95% CI]", "r"), ("no reward", "r"), ("tokens in / out", "r"), ("served by", "l"),
                ("Pareto", "l")]
    if study_rows:
        columns.append(("search", "l"))
    rows: list[list[Cell | str]] = []
    for r in section.rows:
        row: list[Cell | str] = [r.name, section.role_of(r.name), str(r.accuracy.n), pct(r.accuracy.mean, r.accuracy.ci95)]
        if partial:
            row.append(pct(r.fully_right.mean, r.fully_right.ci95))
        if k > 1:
            tasks = r.pass_k.n
            row.append(pct(r.pass_k.mean, r.pass_k.ci95) + (f" (n={tasks})" if tasks else ""))
        unpriced = r.unpriced_calls
        row += [usd(r.cost_per_task.mean, r.cost_per_task.ci95, unpriced_calls=unpriced)]
        row += [per_month_text(r, volume)] if volume is not None else []
        row += [usd(r.cost_usd, unpriced_calls=unpriced),
                f"{seconds(r.latency_p50)} / {seconds(r.latency_p95)}", pct(r.error_rate.mean, r.error_rate.ci95),
                f"{r.missing} of {r.planned}", f"{count(r.input_tokens)} / {count(r.output_tokens)}",
                r.served.label(), "yes" if r.name in section.front else ""]
        if study_rows:
            info = study_rows.get(r.name, {})
            dropped = info.get("dropped")
            row.append(f"dropped in round {dropped['round']}" if dropped else info.get("status", ""))
        rows.append(row)
    note = ("n counts scored rollouts; intervals resample tasks. pass^k is the share of tasks whose k seeds all "
            f"scored at least {threshold:g}." if k > 1 else "n counts scored rollouts; intervals resample tasks.")
    if partial:
        note += " Rewards give partial credit: accuracy is their mean, fully right the share of rollouts at reward 1."
    if rough_note(section.rows):
        note += f" The {rough_note(section.rows)}."
    if any(r.unpriced_calls for r in section.rows):
        note += (" A cost of — is unknown: some calls have no price (declare it under `prices:` in agl.yaml); "
                 "such variants are left out of cost comparisons.")
    return _table(f"Variants on {section.heading}", columns, rows, note)


def _knob_table(data: RunData) -> Table | None:
    rows: list[list[Cell | str]] = []
    for section in data.sections[:1]:
        for r in section.rows:
            settings = ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in r.knobs.items())
            rows.append([r.name, settings or "(the spec's defaults)"])
    if not rows or all(row[1] == "(the spec's defaults)" for row in rows):
        return None
    return _table("What each variant sets", [("variant", "l"), ("knob settings", "l")], rows)


def _comparison_rows(data: RunData) -> Table | None:
    docs: list[tuple[str, str, dict[str, Any]]] = []
    if data.kind == "study":
        if data.validation:
            docs.append((data.winner or "", data.primary.heading, data.validation))
        if data.comparison is not None and data.comparison is not data.validation and data.comparison_section:
            docs.append((data.winner or "", data.comparison_section.heading, data.comparison))
    else:
        docs = [(name, data.primary.heading, doc) for name, doc in data.candidates.items()]
    if not docs:
        return None
    rows: list[list[Cell | str]] = []
    for name, label, d in docs:
        diff, cost = d["difference"], d["cost_usd_per_task"]["difference"]
        unknown = cost_unknown_reason(d["cost_usd_per_task"])
        row: list[Cell | str] = [
            name, label, str(d["n_tasks"]), pct(d["baseline_mean"]), pct(d["candidate_mean"]),
            points(diff["mean"], diff["ci95"]), TESTS.get(d["test"], d["test"]), f"{d['p_adjusted']:.3g}",
            d["verdict"], f"unknown ({unknown})" if unknown else usd(cost["mean"], cost["ci95"], signed=True),
        ]
        if data.volume is not None:
            monthly = d.get("cost_usd_per_month") or {}
            row.append(f"unknown ({unknown})" if unknown or monthly.get("mean") is None
                       else usd(monthly["mean"], monthly["ci95"], signed=True))
        rows.append(row)
    month = [("cost/month change", "r")] if data.volume is not None else []
    return _table(
        "Paired against the baseline" + (f" ({data.baseline})" if data.baseline != "baseline" else ""),
        [("candidate", "l"), ("tasks on", "l"), ("tasks", "r"), ("baseline", "r"), ("candidate", "r"),
         ("difference [95% CI]", "r"), ("test", "l"), ("p", "r"), ("verdict", "l"), ("cost/task change", "r"),
         *month],
        rows, "Pairs are (task, seed) both scored; p is Holm-adjusted when several candidates are judged."
        + (f" Cost per month at {data.volume.label()}." if data.volume is not None else ""),
    )


def _frontier_table(data: RunData) -> Table | None:
    """A study's frontier: the configurations the user chooses from, priced at their volume, with each step to the
    next more accurate one marked decided or not."""
    from agl_cli.optimize.frontier import step_text

    doc = (data.study or {}).get("frontier")
    if not isinstance(doc, dict) or not doc.get("members"):
        return None
    volume = data.volume
    columns = [("variant", "l"), ("end", "l"), ("accuracy [95% CI]", "r"), ("n", "r"), ("cost/task [95% CI]", "r")]
    columns += [(month_column(volume), "r")] if volume is not None else []
    columns += [("p95 latency", "r"), ("step from the next cheaper", "l")]
    steps = {step["to"]: step for step in doc.get("steps", [])}
    rows: list[list[Cell | str]] = []
    for m in doc["members"]:
        acc, per_task, unpriced = m["accuracy"], m["cost_usd_per_task"], m.get("unpriced_calls") or 0
        row: list[Cell | str] = [m["name"], ", ".join(m.get("ends", [])), pct(acc["mean"], acc["ci95"]), str(acc["n"]),
                                 usd(per_task["mean"], per_task["ci95"], unpriced_calls=unpriced)]
        if volume is not None:
            monthly = m.get("cost_usd_per_month") or {}
            row.append(usd(monthly.get("mean"), monthly.get("ci95"), unpriced_calls=unpriced))
        row += [seconds(m.get("latency_p95_s")), step_text(steps[m["name"]]) if m["name"] in steps else ""]
        rows.append(row)
    note = ("No other configuration is at least as accurate, as cheap and as fast, and better on one. "
            f"Measured on the {doc['split']} split.")
    held = doc.get("held_out")
    if held:
        note += f" On the held-out {held['split']} split, {held['from']} -> {held['to']}: {step_text(held)}."
    if doc.get("choice"):
        note += " The most accurate and the cheapest good configuration differ: which one to run is the user's choice."
    return _table(f"Frontier on the {doc['split']} split" + (f" at {volume.label()}" if volume else ""),
                  columns, rows, note)


def _reflect_table(data: RunData) -> Table | None:
    """A reflect study's proposals: each one's parent, how it did against it, and why it was kept or not."""
    doc = (data.study or {}).get("reflect")
    if not isinstance(doc, dict) or not doc.get("proposals"):
        return None
    rows: list[list[Cell | str]] = []
    for p in doc["proposals"]:
        n_tasks = p.get("n_tasks")
        rows.append([
            str(p.get("n")), p.get("variant") or "—", p.get("parent") or "—", p.get("status") or "—",
            str(n_tasks) if n_tasks is not None else "—", points(p.get("difference"), p.get("ci95")),
            p.get("verdict") or "—", usd(p.get("cost_usd")), p.get("reason") or "",
        ])
    return _table(
        f"Proposals by {doc.get('proposer', 'the proposer')} (reflect)",
        [("#", "r"), ("variant", "l"), ("parent", "l"), ("status", "l"), ("tasks", "r"),
         ("vs parent [95% CI]", "r"), ("verdict", "l"), ("proposer cost", "r"), ("why", "l")],
        rows, f"A proposal is kept only when the paired rule calls it better than its parent (alpha "
              f"{float(doc.get('alpha', 0.05)):.3g}); parents are drawn from the per-task Pareto front.",
    )


def _links(ids: list[str], seeds: list[int], prefix: str, included: set[str]) -> list[tuple[str, str]]:
    return [(f"{prefix} s{seed}" if len(ids) > 1 else prefix, anchor(rid))
            for rid, seed in zip(ids, seeds, strict=True) if rid in included]


def _flip_table(data: RunData, included: set[str]) -> tuple[str, Table] | None:
    if not data.flips:
        return None
    rows: list[list[Cell | str]] = []
    shown = data.flips[:MAX_FLIPS]
    for f in shown:
        links = _links(f.baseline_ids, f.seeds, "baseline", included) + _links(f.winner_ids, f.seeds, "winner", included)
        rows.append([
            f.task_id, f.direction, f"{f.baseline_passed}/{len(f.seeds)} passed (mean {f.baseline_mean:.2f})",
            f"{f.winner_passed}/{len(f.seeds)} passed (mean {f.winner_mean:.2f})",
            Cell("" if links else "not included", links),
        ])
    gained = sum(1 for f in data.flips if f.direction == "gained")
    label = data.comparison_section.label if data.comparison_section else data.primary.label
    note = f"{gained} gained, {len(data.flips) - gained} lost on {label}"
    if len(data.flips) > len(shown):
        note += f"; the first {len(shown)} of {len(data.flips)} are listed"
    # The note leads the section (both formats print it above the table), so the table itself carries none.
    return note, _table(f"Tasks that flipped: {data.baseline} → {data.winner}",
                  [("task", "l"), ("change", "l"), (f"baseline ({data.baseline})", "r"),
                   (f"winner ({data.winner})", "r"), ("transcripts", "l")], rows)


def _failure_tables(data: RunData, included: set[str], replies: dict[str, str | None]) -> tuple[Table | None,
                                                                                              list[dict[str, Any]]]:
    """`replies`: each example rollout's last model reply, shown beside the reason (a misread reply shows there)."""
    rows, examples = fail.breakdown(data)
    if not rows:
        return None, []
    reasons = fail.reason_columns(rows)
    columns = [("variant", "l"), ("planned", "r"), ("scored", "r"), (f"wrong (<{data.pass_threshold:g})", "r"),
               ("no reward", "r")]
    columns += [(reason_label(r), "r") for r in reasons] + [("failed model calls", "r")]
    table_rows: list[list[Cell | str]] = [
        [r.variant, str(r.planned), str(r.scored), str(r.wrong), str(r.missing), *(str(r.reasons.get(x, 0)) for x in reasons),
         f"{r.failed_calls} in {r.rollouts_with_failed_calls} rollouts" if r.failed_calls else "0"]
        for r in rows
    ]
    table = _table("Failures by variant", columns, table_rows,
                   "A rollout without a reward is never counted as 0: it is missing, with its reason. "
                   "'not run' means planned but never finished (an interrupted run or the budget).")
    listed = [{"variant": e.variant, "reason": reason_label(e.reason), "message": e.message,
               "link": anchor(e.rollout_id) if e.rollout_id in included else None, "rollout_id": e.rollout_id,
               "reply": clip(" ".join(reply.split()), MAX_REPLY_CHARS) if (reply := replies.get(e.rollout_id)) else None}
              for e in examples]
    return table, listed


def _training_table(metrics: list[dict[str, Any]]) -> Table | None:
    rows: list[list[Cell | str]] = []
    for key in plots.TRAIN_CURVES:
        values = [(m["step"], float(m[key])) for m in metrics if isinstance(m.get(key), int | float)]
        if values:
            first, last = values[0][1], values[-1][1]
            rows.append([key, f"{first:.4g} (step {values[0][0]})", f"{last:.4g} (step {values[-1][0]})",
                         f"{last - first:+.4g}", f"{min(v for _, v in values):.4g}", f"{max(v for _, v in values):.4g}"])
    if not rows:
        return None
    return _table("Training: first and last logged step", [("metric", "l"), ("first", "r"), ("last", "r"),
                                                            ("change", "r"), ("min", "r"), ("max", "r")], rows)


def _select_transcripts(data: RunData) -> list[str]:
    """Which rollouts get a transcript: both sides of flipped tasks, then failure examples, up to a cap."""
    _, examples = fail.breakdown(data)
    wanted: list[str] = []
    for f in data.flips[: MAX_FLIPS // 2]:
        wanted += f.baseline_ids + f.winner_ids
    wanted += [e.rollout_id for e in examples]
    return list(dict.fromkeys(wanted))[:MAX_TRANSCRIPTS]


def _facts(data: RunData) -> list[tuple[str, str]]:
    m = data.manifest
    created = m.get("created_at")
    facts = [
        ("run", data.run.run_id), ("kind", data.kind), ("status", str(m.get("status", "—"))),
        ("spec", f"{m.get('spec_name', '—')} ({m.get('spec_path', '—')})"),
        ("created", time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(created)) if created else "—"),
        ("git commit", str(m.get("git_sha") or "—")), ("agl version", str(m.get("agl_version", "—"))),
        ("seeds", str(data.seeds)), ("variants", str(len(data.variant_names))),
        ("rollouts", str(len(data.latest))),
        ("model calls", f"{data.usage.calls:,}" + (f" ({data.usage.unattributed} outside rollouts)"
                                                  if data.usage.unattributed else "")),
        ("total cost", _total_cost(data)), ("total tokens", count(data.usage.total_tokens)),
    ]
    return facts


def _total_cost(data: RunData) -> str:
    usage = data.usage
    if usage.unpriced_calls:
        return f"— ({unpriced_text(usage.unpriced_calls)}; {usd(usage.priced_cost)} for the priced ones)"
    return usd(usage.total_cost)


def build(data: RunData) -> dict[str, Any]:
    chosen = _select_transcripts(data)
    included = set(chosen)
    by_id = {r.id: r for r in data.latest}
    _, examples = fail.breakdown(data)
    store = data.run.open_store(read_only=True)
    try:
        transcripts: list[Transcript] = [transcript(by_id[rid], store.calls(rollout_id=rid), anchor(rid))
                                         for rid in chosen if rid in by_id]
        replies = {e.rollout_id: last_reply(store.calls(rollout_id=e.rollout_id)) for e in examples}
    finally:
        store.close()
    study_rows = {row["name"]: row for row in (data.study or {}).get("variants", []) if isinstance(row, dict)}
    pieces = verdict(data)
    failure_table, failure_examples = _failure_tables(data, included, replies)
    usage = data.usage
    spend_line = (f"{usage.calls:,} model calls, {count(usage.total_tokens)} tokens, {_total_cost(data)} over "
                  f"{seconds(usage.duration_s)}" if usage.calls else "No model calls were made by this run.")
    if usage.reused_rollouts:
        spend_line += (f" Not counted: {plural(usage.reused_rollouts, 'rollout')} reused from earlier runs "
                       f"({usage.reused_calls:,} calls, {usd(usage.reused_cost)} spent by those runs, not again).")
    pareto = plots.pareto(data.primary)
    title = {"study": "Study", "train": "Training run"}.get(data.kind, "Eval run") + f" {data.run.run_id}"
    if data.manifest.get("spec_name"):
        title += f" — {data.manifest['spec_name']}"
    return {
        "title": title,
        "kind": data.kind,
        "generated_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "verdict_md": rich_md(pieces), "verdict_html": rich_html(pieces), "verdict_text": rich_plain(pieces),
        "notes": notes(data),
        "pareto_plots": pareto,
        "distribution_plots": plots.distributions(data.primary) if len(data.primary.rows) <= 1 or not pareto else [],
        "variant_tables": [_variant_table(s, data.seeds, data.pass_threshold, study_rows, data.volume)
                           for s in data.sections if s.rows],
        "frontier_table": _frontier_table(data),
        "knob_table": _knob_table(data),
        "reflect_table": _reflect_table(data),
        "comparison_table": _comparison_rows(data),
        "flips": _flip_table(data, included),
        "failure_table": failure_table, "failure_examples": failure_examples,
        "spend_plots": plots.spend(data), "spend_line": spend_line,
        "training": {"plots": plots.training(data.train_metrics), "table": _training_table(data.train_metrics)}
        if data.train_metrics else None,
        "facts": _facts(data),
        "transcripts": transcripts,
        "transcripts_note": f"{len(transcripts)} rollouts shown (flipped tasks and failure examples, at most "
                            f"{MAX_TRANSCRIPTS}); secrets removed; long turns cut.",
    }
