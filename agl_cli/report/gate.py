"""The regression gate's decision (`agl eval --baseline RUN --fail-on-regression`, exit 3): is a new run worse
than a baseline run, by the paired test `agl compare` uses?

Each variant of the new run is judged against the baseline run's variant of the same name, else against the
baseline run's first variant (its baseline); with several, p-values are Holm-adjusted. Two things count as a
regression, each only when the paired evidence says so (never on a noisy dip):

- accuracy: the verdict is `worse` (paired interval below zero and the test passes);
- rewards lost: on (task, seed) pairs both runs finished, the new run fails to produce a reward significantly
  more often (exact sign test on the discordant pairs). A crash is never counted as a 0 in the accuracy, so
  without this check a change that breaks half the tasks could pass the gate.
"""

from __future__ import annotations

from pathlib import Path

from agl_cli.errors import UsageError
from agl_cli.metrics.fmt import pct, points
from agl_cli.metrics.paired import ALPHA, WORSE, binomial_two_sided, compare_many, holm
from agl_cli.metrics.run import scores_of
from agl_cli.runs.rundir import RunDir, find_run
from agl_cli.spec.task_content import pairing, refuse_mismatch, run_tasks
from rl_backend.store.records import Rollout

RunRef = RunDir | Path | str


def _open(ref: RunRef) -> RunDir:
    if isinstance(ref, RunDir):
        return ref
    return find_run(str(ref))


def _by_variant(run: RunDir) -> dict[str, list[Rollout]]:
    store = run.open_store(read_only=True)
    try:
        names = list(store.variants())
        grouped: dict[str, list[Rollout]] = {}
        for r in store.rollouts(latest_only=True):
            if r.status.terminal:
                grouped.setdefault(r.variant, []).append(r)
    finally:
        store.close()
    order = [n for n in names if n in grouped] + sorted(set(grouped) - set(names))
    return {n: grouped[n] for n in order}


def _lost_rewards(base: list[Rollout], new: list[Rollout]) -> tuple[int, int, float]:
    """(pairs where only the new run lacks a reward, pairs where only the baseline does, exact p-value)."""
    a = {(r.task_id, r.seed): r.reward is not None for r in base}
    b = {(r.task_id, r.seed): r.reward is not None for r in new}
    shared = set(a) & set(b)
    lost = sum(1 for k in shared if a[k] and not b[k])
    gained = sum(1 for k in shared if b[k] and not a[k])
    return lost, gained, binomial_two_sided(gained, lost + gained)


def regression_verdict(baseline_run: RunRef, new_run: RunRef) -> tuple[bool, str]:
    """(is_regression, explanation). Raises UsageError when the runs share no scored (task, seed) pair."""
    base_run, new = _open(baseline_run), _open(new_run)
    base_groups, new_groups = _by_variant(base_run), _by_variant(new)
    if not base_groups or not new_groups:
        empty = base_run if not base_groups else new
        raise UsageError(f"run {empty.run_id} has no finished rollouts: nothing to compare")
    if base_run.path.resolve() != new.path.resolve():  # like with like: the same task ids must be the same tasks
        old_side = run_tasks(base_run, {r.task_id for rs in base_groups.values() for r in rs})
        new_side = run_tasks(new, {r.task_id for rs in new_groups.values() for r in rs})
        found = pairing(old_side, new_side)
        if found.mismatched:
            refuse_mismatch(old_side, new_side, found, flag=None)
    first = next(iter(base_groups))
    against = {name: name if name in base_groups else first for name in new_groups}
    # compare_many takes one baseline; group the new variants by the baseline variant they are judged against.
    results = {}
    for base_name in dict.fromkeys(against.values()):
        mine = {n: scores_of(rs) for n, rs in new_groups.items() if against[n] == base_name}
        results.update(compare_many(scores_of(base_groups[base_name]), mine))
    if len(results) > 1:  # one family of comparisons, whatever baseline each used
        names = list(results)
        for name, adjusted in zip(names, holm([results[n].p_value for n in names]), strict=True):
            results[name].p_adjusted = adjusted
            results[name].decide()
    if all(c.n_pairs == 0 for c in results.values()):
        raise UsageError(
            f"runs {base_run.run_id} and {new.run_id} share no scored (task, seed) pair: nothing to compare",
            hint="run the new eval over the same tasks (and --split, --seeds) as the baseline",
        )
    lines, regression = [], False
    lost = {n: _lost_rewards(base_groups[against[n]], rs) for n, rs in new_groups.items()}
    lost_adjusted = dict(zip(lost, holm([v[2] for v in lost.values()]), strict=True))
    for name, c in results.items():
        label = name if against[name] == name else f"{name} (vs {against[name]})"
        if c.n_pairs == 0:
            lines.append(f"{label}: no scored pair shared with the baseline run")
            continue
        lines.append(f"{label}: {c.verdict}, accuracy {points(c.difference or 0.0, c.ci95)} over {c.n_tasks} tasks "
                     f"({pct(c.mean_b or 0)} vs {pct(c.mean_a or 0)}, p={c.p_adjusted:.3g})")
        if c.verdict == WORSE:
            regression = True
        n_lost, n_gained, _ = lost[name]
        if n_lost or n_gained:
            p = lost_adjusted[name]
            worse = n_lost > n_gained and p < ALPHA
            lines.append(f"{label}: {n_lost} pairs lost their reward and {n_gained} gained one (p={p:.3g})"
                         + ("; significantly more rollouts without a reward" if worse else ""))
            regression = regression or worse
    head = (f"regression against {base_run.run_id}" if regression
            else f"no regression detected against {base_run.run_id}")
    return regression, head + ":\n" + "\n".join(f"  {line}" for line in lines)
