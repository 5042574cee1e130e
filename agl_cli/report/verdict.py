"""The verdict: one paragraph that says what won, by how much with its interval, on which split and at what
cost per task; for a single variant, its accuracy with n and interval and what the failures were.

"Better" is only said when the paired interval excludes zero and the test passes (agl_cli.metrics.paired decides);
otherwise the paragraph says so, which check decided it, and about how many more tasks would likely decide it.
"""

from __future__ import annotations

from typing import Any

from agl_cli.metrics.cost import month_difference_text
from agl_cli.metrics.fmt import pct, plural, points, seconds, unpriced_text, usd
from agl_cli.metrics.paired import BETTER, WORSE
from agl_cli.metrics.rollout_costs import cost_unknown_reason
from agl_cli.metrics.variant import VariantMetrics
from agl_cli.report.collect import RunData, Section
from agl_cli.report.markup import Rich, reason_label

TESTS = {"mcnemar_exact": "McNemar exact test", "sign_test": "sign test", "none": "no test"}


def _test(doc: dict[str, Any]) -> str:
    p = doc["p_adjusted"]
    holm = ", Holm-adjusted" if doc["p_adjusted"] != doc["p_value"] else ""
    return f"{TESTS.get(doc['test'], doc['test'])}, p = {p:.3g}{holm}"


def _reasons(reasons: dict[str, int]) -> str:
    return ", ".join(f"{reason_label(k)} {v}" for k, v in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))


def _per_task(row: VariantMetrics) -> str:
    if row.unpriced_calls:
        return f"at an unknown cost per task ({unpriced_text(row.unpriced_calls)})"
    return f"at {usd(row.cost_per_task.mean, row.cost_per_task.ci95)} per task"


def _single(row: VariantMetrics, section: Section) -> Rich:
    if row.accuracy.n == 0:
        return [("No rollout of ", False), (row.name, True), (" produced a reward", False),
                (f" ({row.planned} planned, {row.finished} finished; {_reasons(row.missing_reasons) or 'none ran'}). ",
                 False), ("Nothing can be said about its accuracy until the failures below are fixed.", False)]
    tasks = len({r.task_id for r in section.rollouts.get(row.name, []) if r.reward is not None})
    pieces: Rich = [
        (row.name, True), (" scored ", False), (pct(row.accuracy.mean, row.accuracy.ci95), True),
        (f" (95% interval) on {section.label} (n = {row.accuracy.n} scored rollouts over {plural(tasks, 'task')}), "
         f"{_per_task(row)}", False),
    ]
    if row.accuracy.rough:
        pieces.append((f" (a bootstrap interval over {plural(tasks, 'task')} of partial credit: rough)", False))
    if row.partial_credit:
        pieces.append((f"; fully right (reward 1): {pct(row.fully_right.mean, row.fully_right.ci95)} of the "
                       f"{row.fully_right.n} scored", False))
    if row.pass_k.mean is not None and row.k > 1:
        pieces.append((f"; pass^{row.k} {pct(row.pass_k.mean, row.pass_k.ci95)}", False))
    pieces.append((f". Of {row.finished} finished rollouts, {row.wrong} got a reward below {row.pass_threshold:g}", False))
    if row.missing:
        pieces.append((f" and {row.missing} of {row.planned} planned have no reward ({_reasons(row.missing_reasons)})",
                       False))
    else:
        pieces.append((", and every planned rollout has a reward", False))
    if row.error_rate.mean:
        pieces.append((f"; agent errors and timeouts: {pct(row.error_rate.mean, row.error_rate.ci95)}", False))
    pieces.append((".", False))
    return pieces


def _the_baseline(name: str) -> Rich:
    """The words for the baseline: its name in bold, unless the name is "baseline" itself."""
    return [("the baseline", False)] if name == "baseline" else [("the baseline ", False), (name, True)]


def _costs(doc: dict[str, Any], base: VariantMetrics | None, win: VariantMetrics | None) -> str:
    if base is None or win is None:
        return ""
    parts = []
    unknown = cost_unknown_reason(doc["cost_usd_per_task"])
    if unknown:
        parts.append(f"cost per task unknown ({unknown})")
    elif base.cost_per_task.mean or win.cost_per_task.mean:
        diff = doc["cost_usd_per_task"]["difference"]
        text = f"cost per task {usd(win.cost_per_task.mean)} vs {usd(base.cost_per_task.mean)}"
        if diff["mean"]:
            text += f" ({usd(diff['mean'], diff['ci95'], signed=True)})"
        monthly = month_difference_text(doc.get("cost_usd_per_month"))
        if monthly:
            text += f"; {monthly}"
        parts.append(text)
    else:
        parts.append("no model cost recorded")
    if win.latency_p95 is not None and base.latency_p95 is not None:
        parts.append(f"p95 latency {seconds(win.latency_p95)} vs {seconds(base.latency_p95)}")
    return "; ".join(parts)


def _comparison(doc: dict[str, Any], baseline: str, winner: str, section: Section, *, lead: str = "") -> Rich:
    base, win = section.row(baseline), section.row(winner)
    if doc["n_pairs"] == 0:
        return [(lead, False), (winner, True), (" and ", False), *_the_baseline(baseline),
                (f" share no scored (task, seed) pair on {section.label}: nothing can be compared.", False)]
    diff = doc["difference"]
    effect = points(diff["mean"], diff["ci95"])
    where = f" on {section.label} ({doc['n_tasks']} tasks, {doc['n_pairs']} pairs; {_test(doc)})"
    accuracy = f"{pct(doc['candidate_mean'])} vs {pct(doc['baseline_mean'])}"
    costs = _costs(doc, base, win)
    tail = f": accuracy {accuracy}" + (f"; {costs}" if costs else "") + "."
    if doc["verdict"] == BETTER:
        return [(lead, False), (winner, True), (" is better than ", False), *_the_baseline(baseline),
                (" by ", False), (effect, True), (where + tail, False)]
    if doc["verdict"] == WORSE:
        return [(lead, False), (winner, True), (" is worse than ", False), *_the_baseline(baseline),
                (" by ", False), (effect, True), (where + tail, False)]
    more, why, decide_with = doc.get("more_tasks"), doc.get("why"), doc.get("decide_with")
    decide = f" {decide_with[0].upper()}{decide_with[1:]}." if decide_with else \
        f" About {more} more tasks would likely decide it." if more else ""
    why_text = f" Why: {why}." if why else ""
    return [(lead, False), ("No detectable difference", True), (" between ", False), (winner, True),
            (" and ", False), *_the_baseline(baseline), (f": {effect}{where}{tail}{why_text}{decide}", False)]


def _study(data: RunData) -> Rich:
    study = data.study or {}
    primary = data.primary
    n = len(primary.rows)
    strategy = study.get("strategy") or (data.manifest.get("options") or {}).get("strategy") or "search"
    lead = f"The study tried {n} variants on {primary.label} ({strategy} search). "
    if data.winner is None:
        return [(lead + "No variant produced a reward, so none was chosen.", False)]
    if data.winner == data.baseline:
        return [(lead, False), *_the_baseline(data.baseline or "baseline"),
                (" remained the best variant found: nothing to change.", False)]
    pieces: Rich = [(lead, False), ("It chose ", False), (data.winner, True), (". ", False)]
    if data.comparison and data.comparison_section and data.baseline:
        label = "On held-out tasks: " if data.comparison_section is not primary else "Not yet confirmed on held-out tasks: "
        pieces += _comparison(data.comparison, data.baseline, data.winner, data.comparison_section, lead=label)
    if study.get("recommendation"):
        pieces += [(" Recommendation: ", False), (str(study["recommendation"]), True), (".", False)]
    return pieces


def verdict(data: RunData) -> Rich:
    if data.kind == "study":
        return _study(data)
    primary = data.primary
    if not primary.rows:
        return [("This run has no rollouts yet.", False)]
    if len(primary.rows) == 1:
        return _single(primary.rows[0], primary)
    if data.comparison is None or not data.winner or not data.baseline:
        return [("No candidate produced a reward to compare with the baseline.", False)]
    lead = f"Of {len(primary.rows) - 1} candidates against the baseline, the most accurate: " if len(primary.rows) > 2 else ""
    return _comparison(data.comparison, data.baseline, data.winner, primary, lead=lead)


def notes(data: RunData) -> list[str]:
    """Caveats a reader must not miss: an unfinished run, a study's own messages, selection bias."""
    out = []
    status = data.manifest.get("status")
    if status and status != "completed":
        out.append(f"the run's status is {str(status).replace('_', ' ')}: it is incomplete")
    if data.study:
        out += [str(m) for m in data.study.get("messages", [])]
    out += [str(n) for n in data.manifest.get("notes") or []]
    if data.kind != "study" and len(data.primary.rows) > 2 and data.comparison:
        if data.primary.role == "held-out confirmation":
            out.append(f"{len(data.primary.rows) - 1} candidates were confirmed on these held-out tasks at once; "
                       "each verdict against the baseline is Holm-adjusted for that")
        else:
            # A search: the most accurate of several on the same tasks is flattered by the choice itself.
            out.append("the winner was picked as the best of several on these same tasks, which flatters its gain; "
                       "confirm it on held-out tasks (agl optimize does)")
    rows = [r for s in data.sections for r in s.rows]
    out += list(dict.fromkeys(line for r in rows for line in r.model_warnings))
    unpriced = list(dict.fromkeys(r.name for r in rows if r.unpriced_calls))
    if unpriced:
        out.append(f"the cost of {', '.join(unpriced)} is unknown ({unpriced_text(data.usage.unpriced_calls)}): "
                   "it is left out of cost intervals, plots and comparisons; declare the model's price under "
                   "`prices:` in agl.yaml")
    return out
