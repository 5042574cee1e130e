"""What a report knows about a run, read back from its directory: per-split variant rows with intervals, the
baseline and the winner, their paired comparison, flipped tasks, failures, spend and training curves.

Works the same for an eval run (one or several variants), a study (manifest kind `study`: a search split with
every variant, a confirm split with the baseline and the winner) and a training run (kind `train`, whose
`train_metrics` feed curves). Nothing here formats text; `context` does that for the templates.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from agl_cli.costs import rollout_costs
from agl_cli.optimize.objectives import VariantMetrics, measure, pareto_front
from agl_cli.report.compare import Flip, choose_winner, flips, paired_docs
from agl_cli.report.usage import CallUsage, read_usage
from agl_cli.run_spend import imported_ids
from agl_cli.rundir import RunDir
from agl_cli.stats import Estimate, bootstrap_mean, wilson_interval
from agl_cli.summary import VariantSummary, summarize_variant
from rl_backend.store.records import CallTotals, Rollout

HELD_OUT_SPLITS = ("test",)  # an eval on one of these confirms on held-out tasks; any other split is a search
STUDY_RESULT_META = "study.result"  # agl_cli.optimize.engine.RESULT_META; not imported: the engine pulls the runner
TRAIN_METRICS_META = "train_metrics"
TRAIN_METRICS_FILE = "train_metrics.jsonl"
TRAIN_KEYS = ("step", "reward", "pass_rate", "entropy", "kl", "tokens_per_s")


@dataclass
class VariantRow:
    name: str
    knobs: dict[str, Any]
    summary: VariantSummary
    metrics: VariantMetrics
    cost_per_task: Estimate  # mean None when a call has no price (summary.unpriced_calls)
    tokens_per_task: Estimate  # input + output tokens per rollout
    error_rate: Estimate
    pass_k_ci: tuple[float, float] | None
    role: str = ""  # baseline, winner or ""
    pareto: bool = False


@dataclass
class Section:
    """The variants measured on one split (or on all tasks of an eval)."""

    split: str | None
    label: str  # for sentences: "the val split", "all tasks"
    rows: list[VariantRow]
    rollouts: dict[str, list[Rollout]]
    role: str = ""  # for headings: "search", "held-out confirmation"

    @property
    def heading(self) -> str:
        return self.label + (f" ({self.role})" if self.role else "")

    def row(self, name: str | None) -> VariantRow | None:
        return next((r for r in self.rows if r.name == name), None)


@dataclass
class RunData:
    run: RunDir
    manifest: dict[str, Any]
    kind: str
    seeds: int
    sections: list[Section]
    baseline: str | None
    winner: str | None
    comparison: dict[str, Any] | None  # winner vs baseline on the verdict split
    comparison_section: Section | None
    validation: dict[str, Any] | None  # a study's search-split comparison
    candidates: dict[str, dict[str, Any]]  # eval: every candidate vs the baseline (Holm-adjusted)
    flips: list[Flip]
    usage: CallUsage
    latest: list[Rollout]
    study: dict[str, Any] | None
    train_metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def primary(self) -> Section:
        return self.sections[0]

    @property
    def variant_names(self) -> list[str]:
        return list(dict.fromkeys(r.name for s in self.sections for r in s.rows))


def load_train_metrics(run: RunDir, store_meta: Any) -> list[dict[str, Any]]:
    """Training curves: the store's `train_metrics` meta, else `train_metrics.jsonl` in the run directory; each
    entry a dict with `step` and any of reward, pass_rate, entropy, kl, tokens_per_s."""
    entries: list[Any] = store_meta if isinstance(store_meta, list) else []
    path = run.path / TRAIN_METRICS_FILE
    if not entries and path.is_file():
        entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    clean = [e for e in entries if isinstance(e, dict) and isinstance(e.get("step"), int | float)]
    return sorted(clean, key=lambda e: e["step"])


def _planned(manifest: dict[str, Any], hashes: dict[str, str]) -> dict[str, set[str]]:
    """An eval's denominators: every (task, seed) it planned per variant, so unrun rollouts count as missing."""
    tasks = manifest.get("task_ids") or []
    seeds = int(manifest.get("seeds") or 1)
    return {name: {f"{h}/{t}/{s}" for t in tasks for s in range(seeds)} for name, h in hashes.items()}


def _cost_estimate(costs: list[float] | None, tasks: list[str]) -> Estimate:
    """Mean cost (or tokens) per rollout with a task-resampled interval; none when a cost is unknown. Equal values
    (a free local model) have a zero-width interval: bootstrap_mean would give 0/1 data a Wilson interval, which is
    for proportions, not dollars."""
    if not costs:
        return Estimate(None, None, 0)
    if min(costs) == max(costs):
        return Estimate(costs[0], (costs[0], costs[0]), len(costs))
    return bootstrap_mean(costs, tasks)


def _row(name: str, rollouts: list[Rollout], planned: int, usage: CallUsage, knobs: dict[str, Any], k: int) -> VariantRow:
    summary = summarize_variant(name, rollouts, planned, usage.totals, knobs, usage.uses)
    finished = [r for r in rollouts if r.status.terminal]
    metrics = measure(name, finished, usage.totals, k)
    tasks = [r.task_id for r in finished]
    cost = _cost_estimate(rollout_costs(finished, usage.totals), tasks)
    none = CallTotals()
    tokens = _cost_estimate([float(usage.totals.get(r.id, none).tokens) for r in finished], tasks)
    bad = round((summary.error_rate or 0.0) * summary.finished)
    error = Estimate(
        summary.error_rate, wilson_interval(bad, summary.finished) if summary.finished else None, summary.finished
    )
    pass_ci = None
    if metrics.pass_k is not None and metrics.pass_k_tasks:
        pass_ci = wilson_interval(round(metrics.pass_k * metrics.pass_k_tasks), metrics.pass_k_tasks)
    return VariantRow(name, knobs, summary, metrics, cost, tokens, error, pass_ci)


def _section(split: str | None, label: str, grouped: dict[str, list[Rollout]], names: list[str],
             planned: dict[str, set[str]] | None, usage: CallUsage, knobs: dict[str, dict[str, Any]],
             k: int, role: str = "") -> Section:
    rows = []
    for name in names:
        mine = grouped.get(name, [])
        if not mine and (planned is None or not planned.get(name)):
            continue
        count = len(planned[name]) if planned and name in planned else len(mine)
        rows.append(_row(name, mine, count, usage, knobs.get(name, {}), k))
    front = set(pareto_front([r.metrics for r in rows]))
    for row in rows:
        row.pareto = row.name in front
    return Section(split, label, rows, {r.name: grouped.get(r.name, []) for r in rows}, role)


def _group(rollouts: list[Rollout], split: str | None = None, keys: set[str] | None = None) -> dict[str, list[Rollout]]:
    grouped: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        if (split is None or r.split == split) and (keys is None or r.key in keys):
            grouped[r.variant].append(r)
    return grouped


def collect(run: RunDir, train_metrics: list[dict[str, Any]] | None = None) -> RunData:
    manifest = run.manifest()
    kind = str(manifest.get("kind") or "eval")
    store = run.open_store()
    try:
        latest = store.rollouts(latest_only=True)
        stored_variants = store.variants()
        study = store.get_meta(STUDY_RESULT_META) if kind == "study" else None
        metrics_meta = store.get_meta(TRAIN_METRICS_META)
        usage = read_usage(store, imported_ids(store))
    finally:
        store.close()
    listed = [v["name"] for v in manifest.get("variants", []) if isinstance(v, dict) and "name" in v]
    names = list(dict.fromkeys(listed + list(stored_variants) + [r.variant for r in latest]))
    knobs = {n: stored_variants.get(n, {}).get("knobs", {}) for n in names}
    seeds = int(manifest.get("seeds") or 1)
    baseline = names[0] if names else None

    sections: list[Section] = []
    if kind == "study":
        options = manifest.get("options") or {}
        search, confirm = options.get("search_split", "val"), options.get("confirm_split", "test")
        for split, role in ((search, "search"), (confirm, "held-out confirmation")):
            grouped = _group(latest, split)
            if grouped:
                sections.append(_section(split, f"the {split} split", grouped, names, None, usage, knobs, seeds, role))
    else:
        hashes = {v["name"]: v["hash"] for v in manifest.get("variants", []) if isinstance(v, dict) and "hash" in v}
        planned = _planned(manifest, hashes) if manifest.get("task_ids") and hashes else None
        split = manifest.get("split")
        label = f"the {split} split" if split else "all tasks"
        # A training run's own rollouts (the train split) are its curves; its verdict is on the held-out split.
        held_out = split if kind == "train" else None
        role = "held-out confirmation" if kind == "eval" and split in HELD_OUT_SPLITS else ""
        sections.append(_section(split, label, _group(latest, held_out), names, planned, usage, knobs, seeds, role))
    if not sections or not sections[0].rows:
        sections = [Section(None, "all tasks", [], {})] + [s for s in sections if s.rows]

    winner: str | None = None
    comparison = validation = None
    comparison_section: Section | None = None
    candidates: dict[str, dict[str, Any]] = {}
    primary = sections[0]
    if kind == "study":
        winner = manifest.get("winner") or ((study or {}).get("winner") or {}).get("name")
        if winner and baseline and winner != baseline:
            validation = paired_docs(primary.rollouts.get(baseline, []), {winner: primary.rollouts.get(winner, [])},
                                     usage.totals)[winner]
            confirm_section = next((s for s in sections[1:] if s.row(winner) and s.row(baseline)), None)
            comparison_section = confirm_section or primary
            comparison = (paired_docs(comparison_section.rollouts[baseline],
                                      {winner: comparison_section.rollouts[winner]}, usage.totals)[winner]
                          if confirm_section else validation)
    elif baseline and len(primary.rows) > 1:
        others = {r.name: primary.rollouts[r.name] for r in primary.rows if r.name != baseline}
        candidates = paired_docs(primary.rollouts.get(baseline, []), others, usage.totals)
        winner = choose_winner(primary.rows, candidates)
        comparison, comparison_section = candidates.get(winner or ""), primary
    for section in sections:
        for row in section.rows:
            row.role = "baseline" if row.name == baseline else "winner" if row.name == winner else ""
    flipped: list[Flip] = []
    if comparison_section is not None and baseline and winner and winner != baseline:
        flipped = flips(comparison_section.rollouts.get(baseline, []), comparison_section.rollouts.get(winner, []))
    return RunData(
        run=run, manifest=manifest, kind=kind, seeds=seeds, sections=sections, baseline=baseline, winner=winner,
        comparison=comparison, comparison_section=comparison_section, validation=validation, candidates=candidates,
        flips=flipped, usage=usage, latest=latest, study=study,
        train_metrics=train_metrics if train_metrics is not None else load_train_metrics(run, metrics_meta),
    )
