"""Reading a run's store for its metrics: the newest attempt of every rollout grouped by variant, the scores paired
statistics compare, every planned variant measured at once, and the pass threshold the run was measured with."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import yaml

from agl_cli.errors import UsageError
from agl_cli.metrics.variant import VariantMetrics, measure
from agl_cli.paired import PairKey
from agl_cli.rundir import CONFIG
from rl_backend.rewards import DEFAULT_PASS_THRESHOLD
from rl_backend.store.db import RunStore
from rl_backend.store.records import Rollout

PASS_THRESHOLD_KEY = "pass_threshold"  # the agl.yaml key (agl_cli.spec), as the run's copy of its spec holds it


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


def run_pass_threshold(run_dir: Path) -> float:
    """The pass threshold of the run in `run_dir`: its agl.yaml's, from the copy the run keeps (the default for a run
    whose spec did not set it, or made before the key existed)."""
    path = run_dir / CONFIG
    if not path.is_file():
        return DEFAULT_PASS_THRESHOLD
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        raise UsageError(f"{path} is damaged and cannot be read ({type(exc).__name__})",
                         hint="restore it from a copy of the run's agl.yaml") from None
    value = config.get(PASS_THRESHOLD_KEY) if isinstance(config, dict) else None
    if value is None:
        return DEFAULT_PASS_THRESHOLD
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{path}: `{PASS_THRESHOLD_KEY}` is {value!r}, not a number",
                         hint="restore it from a copy of the run's agl.yaml")
    return float(value)
