"""The report's caveat about picking the best of several: a search (an eval of several candidates on val) is told
to confirm its winner on held-out tasks; a held-out confirmation (the same eval on test) is not told to do what
it is doing, and says that its verdicts are Holm-adjusted instead."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agl_cli.report import write_report
from agl_cli.runs.rundir import RunDir
from rl_backend.store.db import RunStore
from rl_backend.store.records import RewardSource, Rollout, RolloutStatus

SEARCH_NOTE = "the winner was picked as the best of several on these same tasks"
RIGHT = {"baseline": 6, "system_prompt=v2": 18, "system_prompt=v3": 10}  # of 20 tasks


def _eval_run(root: Path, split: str) -> Path:
    tasks = [f"{split}{i:02d}" for i in range(20)]
    hashes = {name: hashlib.sha1(name.encode()).hexdigest()[:12] for name in RIGHT}
    run = RunDir.create(root, spec_data={}, manifest={
        "kind": "eval", "spec_name": "triage", "split": split, "seeds": 1, "task_ids": tasks, "status": "completed",
        "variants": [{"name": n, "settings": {}, "hash": h} for n, h in hashes.items()]})
    store = RunStore(run.store_path)
    for name, right in RIGHT.items():
        store.upsert_variant(name, hashes[name], {})
        for i, task in enumerate(tasks):
            store.put_rollout(Rollout(
                id=f"{hashes[name]}-{i}", key=f"{hashes[name]}/{task}/0", variant=name, task_id=task, split=split,
                status=RolloutStatus.succeeded, reward=1.0 if i < right else 0.0, reward_source=RewardSource.grader,
                started_at=1.0, ended_at=2.0))
    store.close()
    return run.path


@pytest.mark.parametrize("split", ["val", "test"])
def test_the_best_of_several_caveat_belongs_to_a_search_only(tmp_path: Path, split: str) -> None:
    paths = write_report(_eval_run(tmp_path / ".agl" / "runs", split), ("md",))
    text = next(p for p in paths if p.name == "report.md").read_text()
    if split == "val":
        assert SEARCH_NOTE in text and "confirm it on held-out tasks" in text
    else:
        assert SEARCH_NOTE not in text and "confirm it on held-out tasks" not in text
        assert "2 candidates were confirmed on these held-out tasks at once" in text
        assert "Holm-adjusted" in text
        assert "held-out confirmation" in text  # the variant table's heading says what the split was for
