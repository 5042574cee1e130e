"""Trajectory building on exact token ids: merges, breaks and their causes, masks, drops (no torch needed)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

from rl_backend.store.db import RunStore
from rl_backend.store.records import Api, CallRecord, FailureKind, Rollout, RolloutStatus
from rl_backend.trainer.trajectory import build_trajectories, trajectories_from_store


def call(
    rid: str, n: int, prompt: list[int] | None, completion: list[int] | None, logprobs: list[float] | None = None,
    **kw: object,
) -> CallRecord:
    if logprobs is None and completion is not None:
        logprobs = [-0.1 * (i + 1) for i in range(len(completion))]
    return CallRecord(
        call_id=f"{rid}-c{n}", rollout_id=rid, api=Api.openai_chat, upstream="local", started_at=100.0 + n,
        prompt_token_ids=prompt, completion_token_ids=completion, logprobs=logprobs, model_version="step-0", **kw,
    )


def rollout(rid: str, reward: float | None = 1.0, task: str = "t1", **kw: object) -> Rollout:
    status = RolloutStatus.succeeded if reward is not None else RolloutStatus.failed
    return Rollout(id=rid, key=f"v/{task}/0", variant="v", task_id=task, reward=reward, status=status, **kw)


def test_consecutive_calls_that_extend_merge_into_one_sequence() -> None:
    calls = [
        call("r", 0, [1, 2, 3], [10, 11], [-0.5, -0.25]),
        # the harness appended a tool result (20, 21) before the next call
        call("r", 1, [1, 2, 3, 10, 11, 20, 21], [12], [-0.75]),
    ]
    trajs, report = build_trajectories([rollout("r")], {"r": calls})
    assert len(trajs) == 1 and len(trajs[0].sequences) == 1
    seq = trajs[0].sequences[0]
    assert seq.token_ids == [1, 2, 3, 10, 11, 20, 21, 12]
    assert seq.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert seq.old_logprobs == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -0.75]
    assert seq.call_ids == ["r-c0", "r-c1"]
    assert trajs[0].trained_tokens == 3
    assert report.breaks == [] and report.kept == 1
    assert report.summary()["sequences_per_rollout"]["histogram"] == {"1": 1}


def test_divergent_prompt_starts_a_new_sequence_with_its_cause() -> None:
    calls = [
        call("r", 0, [1, 2, 3], [10, 11]),
        # retokenized history: token 4 differs from the sampled 10
        call("r", 1, [1, 2, 3, 9, 11, 20], [12]),
        # context cut by the harness: shorter than the sequence so far
        call("r", 2, [1, 2], [13]),
    ]
    trajs, report = build_trajectories([rollout("r")], {"r": calls})
    assert [s.token_ids for s in trajs[0].sequences] == [[1, 2, 3, 10, 11], [1, 2, 3, 9, 11, 20, 12], [1, 2, 13]]
    kinds = [(b.call_index, b.kind) for b in report.breaks]
    assert kinds == [(1, "prompt_diverged"), (2, "prompt_shorter")]
    assert "diverged at token 3" in report.breaks[0].cause
    assert report.summary()["merge_breaks"] == {"prompt_diverged": 1, "prompt_shorter": 1}
    assert report.sequences_per_rollout == {"r": 3}


def test_merge_any_resumes_an_older_sequence_after_a_subagent() -> None:
    calls = [
        call("r", 0, [1, 2], [10]),
        call("r", 1, [7, 8], [30]),  # a subagent with its own context
        call("r", 2, [1, 2, 10, 40], [11]),  # the main agent continues
    ]
    trajs, _ = build_trajectories([rollout("r")], {"r": calls}, merge="previous")
    assert len(trajs[0].sequences) == 3
    trajs, report = build_trajectories([rollout("r")], {"r": calls}, merge="any")
    assert [s.token_ids for s in trajs[0].sequences] == [[1, 2, 10, 40, 11], [7, 8, 30]]
    assert len(report.breaks) == 1  # only the subagent's first call broke the chain


def test_calls_sorted_by_start_time_not_store_order() -> None:
    late = call("r", 1, [1, 2, 10, 5], [11])
    early = call("r", 0, [1, 2], [10])
    trajs, _ = build_trajectories([rollout("r")], {"r": [late, early]})
    assert [s.token_ids for s in trajs[0].sequences] == [[1, 2, 10, 5, 11]]


def test_skipped_calls_and_missing_logprobs() -> None:
    calls = [
        call("r", 0, [1, 2], [10]),
        call("r", 1, None, [5]),
        call("r", 2, [1, 2, 10, 3], [11], error="boom", status_code=500),
        call("r", 3, [1, 2, 10, 3], [11, 12], logprobs=[-1.0]),  # wrong length: recomputed by the backend
    ]
    trajs, report = build_trajectories([rollout("r")], {"r": calls})
    assert [s.kind for s in report.skipped_calls] == ["missing_token_ids", "call_failed"]
    seq = trajs[0].sequences[0]
    assert seq.token_ids == [1, 2, 10, 3, 11, 12]
    assert seq.loss_mask == [0, 0, 1, 0, 1, 1]
    assert math.isnan(seq.old_logprobs[-1]) and math.isnan(seq.old_logprobs[-2])
    assert report.calls_without_logprobs == 1


def test_dropped_rollouts_say_why() -> None:
    rollouts = [
        rollout("ok"),
        rollout("noreward", None, failure=FailureKind.agent_crashed, error="the agent exited with code 1"),
        rollout("nocalls"),
        rollout("noids"),
        rollout("empty"),
    ]
    calls = {
        "ok": [call("ok", 0, [1], [2])],
        "noids": [call("noids", 0, None, None), call("noids", 1, None, None)],
        "empty": [call("empty", 0, [1, 2], [])],
    }
    trajs, report = build_trajectories(rollouts, calls)
    assert [t.rollout_id for t in trajs] == ["ok"]
    assert {d.rollout_id: d.kind for d in report.dropped} == {
        "noreward": "no_reward", "nocalls": "no_calls", "noids": "no_token_ids", "empty": "no_trained_tokens",
    }
    assert "exited with code 1" in report.dropped[0].reason
    assert report.summary()["dropped"]["no_reward"] == 1


def test_first_sampled_token_without_context_is_not_trained() -> None:
    trajs, report = build_trajectories([rollout("r")], {"r": [call("r", 0, [], [4, 5])]})
    assert trajs[0].sequences[0].loss_mask == [0, 1]
    assert report.first_token_unmasked == 1


def test_light_imports_and_verl_leaves_logging_alone() -> None:
    # trajectory/curves need no torch (the CLI reads reports and curves without the training stack), and importing
    # verl through verl_compat must not configure the root logger of the process that trains.
    code = (
        "import logging, sys\n"
        "import rl_backend.trainer, rl_backend.trainer.trajectory, rl_backend.trainer.curves\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "from rl_backend.trainer.verl_compat import verl\n"
        "verl().core_algos.agg_loss\n"
        "assert logging.getLogger().handlers == [], logging.getLogger().handlers\n"
        "assert logging.getLogger().level == logging.WARNING\n"
    )
    if importlib.util.find_spec("verl") is None:
        code = code.split("from rl_backend.trainer.verl_compat")[0]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_from_store_round_trip(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store.sqlite")
    store.put_rollout(rollout("a", 1.0))
    store.put_rollout(rollout("b", 0.0, task="t2"))
    store.insert_calls([call("a", 0, [1, 2], [3]), call("a", 1, [1, 2, 3, 4], [5]), call("b", 0, [9], [8])])
    trajs, report = trajectories_from_store(store, ["a", "b", "zzz"])
    assert [(t.rollout_id, t.group, t.reward, len(t.sequences)) for t in trajs] == [
        ("a", "v/t1", 1.0, 1), ("b", "v/t2", 0.0, 1)
    ]
    assert trajs[0].sequences[0].model_versions == ["step-0", "step-0"]
    assert [d.kind for d in report.dropped] == ["not_found"] and report.rollouts == 3
    store.close()
