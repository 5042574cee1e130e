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

from agl_cli.metrics.run import run_pass_threshold, run_volume
from agl_cli.metrics.variant import VariantMetrics, measure
from agl_cli.optimize.objectives import pareto_front
from agl_cli.report.compare import Flip, choose_winner, flips, paired_docs
from agl_cli.report.usage import CallUsage, read_usage
from agl_cli.runs.run_spend import imported_ids
from agl_cli.runs.rundir import RunDir
from agl_cli.spec.volume import Volume
from rl_backend.store.records import Rollout

HELD_OUT_SPLITS = ("test",)  # an eval on one of these confirms on held-out tasks; any other split is a search
STUDY_RESULT_META = "study.result"  # agl_cli.optimize.engine.RESULT_META; not imported: the engine pulls the runner
TRAIN_METRICS_META = "train_metrics"
TRAIN_METRICS_FILE = "train_metrics.jsonl"
TRAIN_KEYS = ("step", "reward", "pass_rate", "entropy", "kl", "tokens_per_s")


@dataclass
class Section:
    """The variants measured on one split (or on all tasks of an eval)."""

    split: str | None
    label: str  # for sentences: "the val split", "all tasks"
    rows: list[VariantMetrics]
    rollouts: dict[str, list[Rollout]]
    role: str = ""  # for headings: "search", "held-out confirmation"
    roles: dict[str, str] = field(default_factory=dict)  # variant -> "baseline" or "winner"
    front: set[str] = field(default_factory=set)  # the variants on the Pareto front

    @property
    def heading(self) -> str:
        return self.label + (f" ({self.role})" if self.role else "")

    def row(self, name: str | None) -> VariantMetrics | None:
        return next((r for r in self.rows if r.name == name), None)

    def role_of(self, name: str) -> str:
        """The variant's part in the verdict: baseline, winner, or "" for neither."""
        return self.roles.get(name, "")


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
    pass_threshold: float
    train_metrics: list[dict[str, Any]] = field(default_factory=list)
    volume: Volume | None = None  # the user's volume: costs per month beside costs per task

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


def _section(split: str | None, label: str, grouped: dict[str, list[Rollout]], names: list[str],
             planned: dict[str, set[str]] | None, usage: CallUsage, knobs: dict[str, dict[str, Any]],
             k: int, threshold: float, role: str = "") -> Section:
    rows = []
    for name in names:
        mine = grouped.get(name, [])
        if not mine and (planned is None or not planned.get(name)):
            continue
        count = len(planned[name]) if planned and name in planned else len(mine)
        rows.append(measure(name, mine, usage.totals, planned=count, uses=usage.uses, knobs=knobs.get(name, {}), k=k,
                            pass_threshold=threshold))
    return Section(split, label, rows, {r.name: grouped.get(r.name, []) for r in rows}, role,
                   front=set(pareto_front(rows)))


def _group(rollouts: list[Rollout], split: str | None = None, keys: set[str] | None = None) -> dict[str, list[Rollout]]:
    grouped: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        if (split is None or r.split == split) and (keys is None or r.key in keys):
            grouped[r.variant].append(r)
    return grouped


def collect(run: RunDir, train_metrics: list[dict[str, Any]] | None = None, volume: Volume | None = None) -> RunData:
    """`volume`: the user's, overriding the one the run was made with (its agl.yaml's `volume:`)."""
    manifest = run.manifest()
    kind = str(manifest.get("kind") or "eval")
    store = run.open_store(read_only=True)
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
    threshold = run_pass_threshold(run.path)
    volume = volume or run_volume(run.path)
    baseline = names[0] if names else None

    sections: list[Section] = []
    if kind == "study":
        options = manifest.get("options") or {}
        search, confirm = options.get("search_split", "val"), options.get("confirm_split", "test")
        for split, role in ((search, "search"), (confirm, "held-out confirmation")):
            grouped = _group(latest, split)
            if grouped:
                sections.append(_section(split, f"the {split} split", grouped, names, None, usage, knobs, seeds,
                                         threshold, role))
    else:
        hashes = {v["name"]: v["hash"] for v in manifest.get("variants", []) if isinstance(v, dict) and "hash" in v}
        planned = _planned(manifest, hashes) if manifest.get("task_ids") and hashes else None
        split = manifest.get("split")
        label = f"the {split} split" if split else "all tasks"
        # A training run's own rollouts (the train split) are its curves; its verdict is on the held-out split.
        held_out = split if kind == "train" else None
        role = "held-out confirmation" if kind == "eval" and split in HELD_OUT_SPLITS else ""
        sections.append(_section(split, label, _group(latest, held_out), names, planned, usage, knobs, seeds,
                                 threshold, role))
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
                                     usage.totals, volume)[winner]
            confirm_section = next((s for s in sections[1:] if s.row(winner) and s.row(baseline)), None)
            comparison_section = confirm_section or primary
            comparison = (paired_docs(comparison_section.rollouts[baseline],
                                      {winner: comparison_section.rollouts[winner]}, usage.totals, volume)[winner]
                          if confirm_section else validation)
    elif baseline and len(primary.rows) > 1:
        others = {r.name: primary.rollouts[r.name] for r in primary.rows if r.name != baseline}
        candidates = paired_docs(primary.rollouts.get(baseline, []), others, usage.totals, volume)
        winner = choose_winner(primary.rows, candidates)
        comparison, comparison_section = candidates.get(winner or ""), primary
    for section in sections:
        # The baseline keeps its role when it is also the winner (nothing to change).
        section.roles = {name: role for name, role in ((winner, "winner"), (baseline, "baseline")) if name}
    flipped: list[Flip] = []
    if comparison_section is not None and baseline and winner and winner != baseline:
        flipped = flips(comparison_section.rollouts.get(baseline, []), comparison_section.rollouts.get(winner, []),
                        threshold)
    return RunData(
        run=run, manifest=manifest, kind=kind, seeds=seeds, sections=sections, baseline=baseline, winner=winner,
        comparison=comparison, comparison_section=comparison_section, validation=validation, candidates=candidates,
        flips=flipped, usage=usage, latest=latest, study=study, pass_threshold=threshold,
        train_metrics=train_metrics if train_metrics is not None else load_train_metrics(run, metrics_meta),
        volume=volume,
    )
