"""Reading a run's store for its metrics: the newest attempt of every rollout grouped by variant, the scores and
costs paired statistics compare, every planned variant measured at once, and the pass threshold and volume the run
was measured with (from the copy of agl.yaml the run keeps)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from agl_cli.errors import UsageError
from agl_cli.metrics.paired import PairKey
from agl_cli.metrics.rollout_costs import rollout_costs
from agl_cli.metrics.variant import VariantMetrics, measure
from agl_cli.runs.rundir import CONFIG
from agl_cli.spec.volume import Volume
from rl_backend.rewards import DEFAULT_PASS_THRESHOLD
from rl_backend.store.db import RunStore
from rl_backend.store.records import CallTotals, Rollout

PASS_THRESHOLD_KEY = "pass_threshold"  # the agl.yaml keys (agl_cli.spec.schema), as the run's copy of its spec holds them
VOLUME_KEY = "volume"


def latest_by_variant(store: RunStore, split: str | None = None, tasks: set[str] | None = None) -> dict[str, list[Rollout]]:
    """The newest finished attempt of every key, grouped by variant name, optionally of one split / task set."""
    grouped: dict[str, list[Rollout]] = defaultdict(list)
    for rollout in store.rollouts(latest_only=True):
        if not rollout.status.terminal:
            continue
        if split is not None and rollout.split != split:
            continue
        if tasks is not None and rollout.task_id not in tasks:
            continue
        grouped[rollout.variant].append(rollout)
    return grouped


def scores_of(rollouts: list[Rollout]) -> dict[PairKey, float]:
    """Rewards by (task, seed); a rollout without a reward is left out (missing, never a 0)."""
    return {(r.task_id, r.seed): float(r.reward) for r in rollouts if r.reward is not None}


def costs_of(rollouts: list[Rollout], totals: Mapping[str, CallTotals]) -> dict[PairKey, float] | None:
    """Cost by (task, seed), for paired cost differences; None when a rollout has an unpriced call (unknown)."""
    costs = rollout_costs(rollouts, totals)
    if costs is None:
        return None
    return {(r.task_id, r.seed): cost for r, cost in zip(rollouts, costs, strict=True)}


def measure_run(store: RunStore, planned_keys: dict[str, list[str]], *, k: int = 1,
                pass_threshold: float = DEFAULT_PASS_THRESHOLD) -> list[VariantMetrics]:
    """`planned_keys`: variant name -> the rollout keys the run planned for it (its denominator)."""
    latest = store.rollouts(latest_only=True)
    every = store.rollouts()  # earlier attempts too: their calls were paid for
    totals = store.call_totals_by_rollout()
    uses = store.model_use_by_rollout()
    variants = store.variants()
    result = []
    for name, keys in planned_keys.items():
        wanted = set(keys)
        mine = [r for r in latest if r.key in wanted]
        result.append(measure(name, mine, totals, planned=len(keys), uses=uses,
                              knobs=variants.get(name, {}).get("knobs", {}), k=k, pass_threshold=pass_threshold,
                              attempts=[r for r in every if r.key in wanted]))
    return result


def _run_config(run_dir: Path) -> dict[str, object]:
    """The copy of agl.yaml the run keeps ({} for a run without one)."""
    path = run_dir / CONFIG
    if not path.is_file():
        return {}
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        raise UsageError(f"{path} is damaged and cannot be read ({type(exc).__name__})",
                         hint="restore it from a copy of the run's agl.yaml") from None
    return config if isinstance(config, dict) else {}


def run_pass_threshold(run_dir: Path) -> float:
    """The pass threshold of the run in `run_dir`: its agl.yaml's, from the copy the run keeps (the default for a run
    whose spec did not set it, or made before the key existed)."""
    value = _run_config(run_dir).get(PASS_THRESHOLD_KEY)
    if value is None:
        return DEFAULT_PASS_THRESHOLD
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{run_dir / CONFIG}: `{PASS_THRESHOLD_KEY}` is {value!r}, not a number",
                         hint="restore it from a copy of the run's agl.yaml")
    return float(value)


def run_volume(run_dir: Path) -> Volume | None:
    """The volume the run was made with (`volume:` of its agl.yaml, or the --volume it was given), if any."""
    value = _run_config(run_dir).get(VOLUME_KEY)
    if value is None:
        return None
    try:
        return Volume.model_validate(value)
    except ValidationError:
        raise UsageError(f"{run_dir / CONFIG}: `{VOLUME_KEY}` is {value!r}, not a volume",
                         hint="restore it from a copy of the run's agl.yaml, or give --volume") from None
