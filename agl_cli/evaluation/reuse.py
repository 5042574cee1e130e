"""Why a planned rollout was not reused from an earlier run, said with what changed: the agent (which file, which key
of agl.yaml), the variant (which knob, which prompt file), the task's content; or the earlier rollout failed; or no
earlier run has this variant, task and seed. Shown on stderr after the reuse line and in `--json` (`reuse`)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_cli.evaluation.agent_version import AgentVersion
from agl_cli.metrics.fmt import plural
from agl_cli.runs.rundir import RunsIndex, read_stores
from agl_cli.spec.schema import ExperimentSpec
from rl_backend.store.records import Rollout

NO_EARLIER = "no_earlier"
EARLIER_FAILED = "earlier_failed"
TASK_CHANGED = "task_changed"
AGENT_CHANGED = "agent_changed"
VARIANT_CHANGED = "variant_changed"
_SHOWN_CHANGES = 4  # files or keys named in one reason; the rest are counted


@dataclass(frozen=True)
class Miss:
    """Why some planned rollouts were not reused: a reason code, what changed (for people), and since which run."""

    reason: str
    detail: str
    run: str | None = None


@dataclass
class ReuseReport:
    """The result cache's account of one batch: how many planned rollouts were copied, and why the others were not."""

    enabled: bool
    reused: int = 0
    misses: dict[str, tuple[str, Miss]] = field(default_factory=dict)  # planned key -> (variant name, why)
    earlier_runs: int = 0  # runs there were to reuse from

    def add(self, other: ReuseReport) -> None:
        self.reused += other.reused
        self.misses.update(other.misses)
        self.earlier_runs = max(self.earlier_runs, other.earlier_runs)

    def groups(self) -> list[tuple[Miss, list[str]]]:
        """Each reason with the variant names of its rollouts (one per rollout), the most frequent first."""
        grouped: dict[Miss, list[str]] = {}
        for variant, miss in self.misses.values():
            grouped.setdefault(miss, []).append(variant)
        return sorted(grouped.items(), key=lambda item: -len(item[1]))

    def lines(self) -> list[str]:
        """One line per reason, for stderr; nothing when the cache is off or there was no earlier run to reuse."""
        if not self.enabled or not self.earlier_runs:
            return []
        return [f"not reused: {plural(len(variants), 'rollout')}: {miss.detail}" for miss, variants in self.groups()]

    def by_variant(self) -> dict[str, dict[str, int]]:
        counts: dict[str, Counter[str]] = {}
        for variant, miss in self.misses.values():
            counts.setdefault(variant, Counter())[miss.reason] += 1
        return {name: dict(c) for name, c in counts.items()}

    def as_json(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled, "reused": self.reused,
            "not_reused": [{"reason": miss.reason, "detail": miss.detail, "since_run": miss.run,
                            "rollouts": len(variants), "variants": dict(Counter(variants))}
                           for miss, variants in self.groups()],
        }


def _shorten(changes: list[str]) -> str:
    shown = ", ".join(changes[:_SHOWN_CHANGES])
    return shown + (f" and {len(changes) - _SHOWN_CHANGES} more" if len(changes) > _SHOWN_CHANGES else "")


@dataclass
class _Earlier:
    run: str
    path: Path
    variant_settings: dict[str, Any] | None  # the knob settings its variant of that name had


class History:
    """What earlier runs hold (any agent version), by rollout key and by (variant name, task, seed), the newest run
    winning: read once, when a rollout was not reused and the reason needs it."""

    def __init__(self, runs_root: Path, *, exclude: Path | None) -> None:
        self.by_key: dict[str, _Earlier] = {}
        self.by_name: dict[tuple[str, str, int], _Earlier] = {}
        self.runs = 0
        runs = RunsIndex.scan(runs_root).select(with_store=True, exclude=exclude)
        for entry, store in read_stores(runs):
            self.runs += 1
            settings = {name: v.get("knobs") for name, v in store.variants().items()}
            for rollout in store.rollouts(latest_only=True):
                earlier = _Earlier(entry.run.run_id, entry.run.path, settings.get(rollout.variant))
                self.by_key[rollout.key] = earlier
                self.by_name[(rollout.variant, rollout.task_id, rollout.seed)] = earlier


def _label(spec: ExperimentSpec, name: str, option: Any) -> str:
    knob = spec.knobs.get(name)
    return knob.label(option) if knob is not None else json.dumps(option)


def _variant_change(spec: ExperimentSpec, now: dict[str, Any], before: dict[str, Any] | None) -> str:
    """What makes the variant of the same name another one than before."""
    if before is None:
        return "its settings (the earlier run did not record them)"
    changes = []
    for name in sorted(now.keys() | before.keys()):
        old, new = before.get(name), now.get(name)
        if name not in before and new is not None:
            changes.append(f"knob {name} added, set to {_label(spec, name, new)} (a first option `null` leaves the "
                           "baseline as it was)" if name in spec.knobs and spec.knobs[name].options[0] == new
                           else f"knob {name} added, set to {_label(spec, name, new)}")
        elif name not in now and old is not None:
            changes.append(f"knob {name} removed")
        elif old != new:
            changes.append(f"{name} {_label(spec, name, old)} -> {_label(spec, name, new)}")
    if changes:
        return _shorten(changes)
    files = [str(o) for n, o in now.items() if o is not None and n in spec.knobs and spec.knobs[n].files is not None]
    return f"the content of {_shorten(files)}" if files else "how a knob applies (its `mode` or `models`)"


def why_not(*, spec: ExperimentSpec, variant: str, settings: dict[str, Any], key: str, task_id: str, seed: int,
            same_version: tuple[str, Rollout, bool] | None, history: History,
            current: AgentVersion | None, failure_reusable: bool) -> Miss:
    """The reason one planned rollout was not reused. `same_version`: the earlier rollout of this key with the same
    agent version, its run, and whether it was scored (the cache would have copied it but for its task);
    `failure_reusable`: whether --reuse-failures would reuse that earlier failure."""
    if same_version is not None:
        run, rollout, scored = same_version
        if scored:
            return Miss(TASK_CHANGED, f"the task's content changed since run {run}", run)
        if not rollout.status.terminal:
            return Miss(EARLIER_FAILED, f"the earlier rollout in run {run} never finished ({rollout.status.value})",
                        run)
        failure = rollout.failure.value if rollout.failure is not None else rollout.status.value
        how = " (--reuse-failures reuses the agent's own crashes, timeouts and missing outputs)" \
            if failure_reusable else ""
        return Miss(EARLIER_FAILED, f"the earlier rollout failed ({failure}) in run {run}: failures run again{how}",
                    run)
    earlier = history.by_key.get(key)
    if earlier is not None:
        before = AgentVersion.read(earlier.path)
        if before is None or current is None:
            detail = (f"the agent's version differs from run {earlier.run}'s, and one of the two runs was made by an "
                      "earlier agl, which kept no list of the agent's files (the agent may be unchanged)")
        else:
            changes = current.changes_since(before)
            detail = f"the agent changed since run {earlier.run}: " + (
                _shorten(changes) if changes else "its version was computed differently")
        return Miss(AGENT_CHANGED, detail, earlier.run)
    named = history.by_name.get((variant, task_id, seed))
    if named is not None:
        change = _variant_change(spec, settings, named.variant_settings)
        return Miss(VARIANT_CHANGED, f"variant {variant} changed since run {named.run}: {change}", named.run)
    return Miss(NO_EARLIER, "no earlier run has the same variant, task and seed")
