"""What `agl advise` reads: every run of one experiment spec in the runs folder, its rollouts, its model calls
grouped by upstream, its studies' results, and the optimization journal. Read only: nothing is written, no model
is called.

Stores are opened read only, so advising on a run never migrates or locks it.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_cli.errors import UsageError
from agl_cli.runs.rundir import CONFIG, MANIFEST, RunsIndex, find_run, read_stores, runs_root
from rl_backend.store.db import RunStore, StoreError

JOURNAL = "journal.jsonl"
STUDY_RESULT_META = "study.result"  # written by agl_cli.optimize.engine


@dataclass
class RolloutRow:
    run_id: str
    variant: str
    task_id: str
    seed: int
    split: str | None
    reward: float | None
    started_at: float | None
    ended_at: float | None
    upstreams: frozenset[str] = frozenset()
    failure: str | None = None  # why there is no reward (FailureKind), if there is none
    output_shape: str | None = None  # answer_shape() of the agent's output; None when no output was kept
    output_digest: str | None = None  # a hash of the output: repeats of a task that differ have different ones


def answer_shape(output: str | None) -> str | None:
    """The form of an answer, whatever it says: a JSON object's keys, a JSON value's type, or for text its lines and
    size in words. A wrong answer in the form of the right ones is a wrong fact; in another form, a format failure."""
    if output is None:
        return None
    text = output.strip()
    if not text:
        return "empty"
    try:
        value = json.loads(text)
    except ValueError:
        words = len(text.split())
        size = "1 word" if words == 1 else "2-5 words" if words <= 5 else "6-30 words" if words <= 30 else "longer"
        lines = "one line" if len(text.splitlines()) == 1 else "several lines"
        return f"text, {lines}, {size}"
    if isinstance(value, dict):
        return "JSON object {" + ", ".join(sorted(str(k) for k in value)) + "}"
    return f"JSON {type(value).__name__}"


@dataclass
class UpstreamUse:
    calls: int = 0
    with_token_ids: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0  # of the priced calls
    unpriced_calls: int = 0  # calls without a price: the cost is unknown when there are any

    def add(self, calls: int, with_token_ids: int, output_tokens: int, latency_s: float, cost_usd: float,
            unpriced_calls: int) -> None:
        self.calls += calls
        self.with_token_ids += with_token_ids
        self.output_tokens += output_tokens
        self.latency_s += latency_s
        self.cost_usd += cost_usd
        self.unpriced_calls += unpriced_calls


@dataclass
class RunEvidence:
    run_id: str
    kind: str
    created_at: float
    manifest: dict[str, Any]
    rollouts: list[RolloutRow]
    upstreams: dict[str, UpstreamUse]
    study_result: dict[str, Any] | None


@dataclass
class Evidence:
    spec_path: Path
    focus_run: str | None  # the study or run named on the command line, if one was
    runs: list[RunEvidence] = field(default_factory=list)
    journal: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rollouts(self) -> list[RolloutRow]:
        return [r for run in self.runs for r in run.rollouts]

    def upstream_use(self) -> dict[str, UpstreamUse]:
        total: dict[str, UpstreamUse] = defaultdict(UpstreamUse)
        for run in self.runs:
            for name, use in run.upstreams.items():
                total[name].add(use.calls, use.with_token_ids, use.output_tokens, use.latency_s, use.cost_usd,
                                use.unpriced_calls)
        return dict(total)


def resolve_target(target: str, runs_dir: Path | None) -> tuple[Path, str | None]:
    """CONFIG_OR_STUDY as (spec path, run id): an agl.yaml (or its folder), else a run or study reference."""
    as_path = Path(target).expanduser()
    if as_path.is_file() and as_path.suffix in (".yaml", ".yml"):
        return as_path.resolve(), None
    if as_path.is_dir() and (as_path / "agl.yaml").is_file() and not (as_path / MANIFEST).is_file():
        return (as_path / "agl.yaml").resolve(), None
    try:
        run = find_run(target, runs_dir)
    except UsageError:
        raise UsageError(
            f"{target!r} is neither an experiment spec (agl.yaml) nor a run or study",
            hint="give the path of agl.yaml, or a study id from `agl runs`",
        ) from None
    spec_path = run.manifest().get("spec_path")
    if not spec_path or not Path(spec_path).is_file():
        raise UsageError(
            f"run {run.run_id} was made from {spec_path or 'an unknown spec'}, which is no longer there",
            hint=f"give the spec's new path instead; the run's resolved copy is {run.path / CONFIG}",
        )
    return Path(spec_path).resolve(), run.run_id


def _read_store(store: RunStore, run_id: str) -> tuple[list[RolloutRow], dict[str, UpstreamUse], dict[str, Any] | None]:
    served: dict[str, set[str]] = defaultdict(set)
    upstreams: dict[str, UpstreamUse] = {}
    for group in store.model_calls():
        if group.rollout_id is not None:
            served[group.rollout_id].add(group.upstream)
        if group.failed:
            continue  # a failed call says nothing about what its upstream serves
        upstreams.setdefault(group.upstream, UpstreamUse()).add(
            group.calls, group.with_token_ids, group.output_tokens, group.latency_s, group.priced_usd,
            group.unpriced_calls)
    # The newest attempt of each (variant, task, seed) that finished; cancelled or running ones say nothing.
    rollouts = [
        RolloutRow(run_id, r.variant, r.task_id, r.seed, r.split, r.reward, r.started_at, r.ended_at,
                   frozenset(served.get(r.id, ())), r.failure.value if r.failure else None, answer_shape(r.output),
                   hashlib.sha256(r.output.encode()).hexdigest()[:16] if r.output is not None else None)
        for r in store.rollouts(latest_only=True) if r.status.terminal
    ]
    return rollouts, upstreams, store.get_meta(STUDY_RESULT_META)


def journal_path(runs_dir: Path | None) -> Path:
    """The journal lives next to the runs folder: `.agl/journal.jsonl` (or `$AGL_HOME/journal.jsonl`)."""
    return runs_root(runs_dir).parent / JOURNAL


def read_journal(path: Path, spec_path: Path) -> list[dict[str, Any]]:
    """Journal entries about this spec (or about no spec in particular); unreadable lines are skipped."""
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(entry, dict):
            continue
        spec = entry.get("spec")
        if spec and Path(spec).expanduser().resolve() != spec_path:
            continue
        entries.append(entry)
    return entries


def gather(target: str, runs_dir: Path | None) -> Evidence:
    spec_path, focus = resolve_target(target, runs_dir)
    evidence = Evidence(spec_path=spec_path, focus_run=focus)
    # Rollouts of a policy being trained say nothing about the model training would start from.
    runs = [r for r in RunsIndex.scan(runs_dir).select(spec=spec_path, with_store=True) if r.kind != "train"]
    for entry, store in read_stores(runs):
        try:
            rollouts, upstreams, result = _read_store(store, entry.run_id)
        except StoreError:
            continue  # damaged past its first page: no evidence either way
        evidence.runs.append(RunEvidence(
            entry.run_id, entry.kind or "eval", entry.created_at, entry.manifest, rollouts, upstreams, result,
        ))
    evidence.journal = read_journal(journal_path(runs_dir), spec_path)
    return evidence
