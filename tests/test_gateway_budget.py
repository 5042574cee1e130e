"""The spend ceiling: once the budget cannot pay a call's worst case, the gateway refuses it (402, recorded), and the
runner reports such rollouts as stopped by the budget, never as wrong answers; a resume with more budget reruns them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml

from rl_backend.gateway.budget import SpendLimit
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness
from rl_backend.store.db import RunStore
from rl_backend.store.records import FailureKind, RolloutStatus
from tests.helpers import FIXTURES, run_agl

MSGS = [{"role": "user", "content": "hello there"}]
PRICES = {"tiny": {"input": 1000.0, "output": 1000.0}}  # USD per 1M tokens: a few cents per fake call


def _paid_harness(fake: FakeUpstream, limit: SpendLimit) -> Harness:
    paid = fake.upstream("paid", api_key=UPSTREAM_KEY, free=False)
    return Harness(fake, upstreams={"paid": paid}, default_model="paid/tiny", prices=PRICES, spend_limit=limit)


def test_calls_past_the_budget_are_refused_and_recorded(fake: FakeUpstream) -> None:
    fake.reset()
    limit = SpendLimit(0.1, hint="raise budget.usd")
    with _paid_harness(fake, limit) as h:
        client = h.openai("r1")
        spent_after: list[float] = []
        refused: openai.APIStatusError | None = None
        for _ in range(200):
            try:
                client.chat.completions.create(model="paid/tiny", messages=MSGS, max_tokens=8)  # type: ignore[arg-type]
            except openai.APIStatusError as exc:
                refused = exc
                break
            spent_after.append(limit.spent_usd)
        assert refused is not None, "the gateway never refused a call"
        assert refused.status_code == 402
        body: Any = refused.body
        assert body["code"] == "budget_exhausted" and "budget of $0.1 has $" in body["message"]
        assert "left" in body["message"] and "could cost up to $" in body["message"]
        assert "raise budget.usd" in body["message"]
        # Refused once the budget could no longer pay a call's worst case: before the spend passed it, never after.
        assert len(spent_after) >= 2 and spent_after[-1] <= 0.1
        upstream_calls = len(fake.requests)

        # Streaming and the Anthropic dialect are refused the same way, before anything reaches the upstream.
        with pytest.raises(openai.APIStatusError) as streamed:
            client.chat.completions.create(model="paid/tiny", messages=MSGS, stream=True)  # type: ignore[arg-type]
        assert streamed.value.status_code == 402
        claude = anthropic.Anthropic(base_url=h.anthropic_url("r2"), api_key=h.rollout("r2"), max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as messages:
            claude.messages.create(model="paid/tiny", max_tokens=16, messages=MSGS)  # type: ignore[arg-type]
        assert messages.value.status_code == 402 and "budget" in str(messages.value)
        assert len(fake.requests) == upstream_calls

        h.gateway.flush()
        records = h.calls()
        refusals = [c for c in records if c.error and c.error.startswith("budget_exhausted")]
        assert len(refusals) == 3 and all(c.status_code == 402 and not c.cost_usd for c in refusals)
        assert sum(c.cost_usd or 0 for c in records) == pytest.approx(limit.spent_usd)
        assert limit.was_refused("r1") and limit.was_refused("r2") and not limit.was_refused("r3")
        state = h.gateway.state_dict()["spend"]
        assert state["refused_calls"] == 3 and state["reserved_usd"] == 0 and state["in_flight"] == 0


def test_spend_from_before_a_resume_counts(fake: FakeUpstream) -> None:
    fake.reset()
    with _paid_harness(fake, SpendLimit(0.05, spent_usd=0.05)) as h:
        with pytest.raises(openai.APIStatusError) as refused:
            h.openai("r1").chat.completions.create(model="paid/tiny", messages=MSGS)  # type: ignore[arg-type]
        assert refused.value.status_code == 402 and not fake.requests


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        SpendLimit(-1.0)


# -- a whole study: in-flight rollouts overshoot the launch check, the gateway stops them ---------------------------


def _write_paid_study(folder: Path, fake: FakeUpstream, budget_usd: float) -> None:
    shutil.copy(FIXTURES / "paid_agent.py", folder / "paid_agent.py")
    tasks = [{"id": f"v{i:02d}", "split": "val"} for i in range(6)] + [{"id": f"t{i:02d}", "split": "test"} for i in range(2)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    spec = {
        "name": "paid",
        "agent": {"command": "python paid_agent.py {task_file} {output_file}", "timeout_s": 30},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": {"entry": "paid_agent:grade"},
        "upstreams": {"paid": {"kind": "openai-compatible", "base_url": fake.base_url, "api_key_env": "PAID_KEY",
                             "free": False}},
        "model": "paid/gpt-4o",
        "knobs": {"calls": {"values": [6, 5], "via": "env", "name": "PAID_CALLS"}},
        "concurrency": 4,
        "budget": {"usd": budget_usd},
    }
    (folder / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def test_a_study_stops_at_the_budget_and_a_resume_reruns_the_refused(tmp_path: Path, fake_server: FakeUpstream) -> None:
    fake_server.reset()
    _write_paid_study(tmp_path, fake_server, budget_usd=0.0001)
    env = {"PAID_KEY": UPSTREAM_KEY}
    first = run_agl(["optimize", "agl.yaml", "--strategy", "grid", "--json", "-q"], cwd=tmp_path, env=env)
    assert first.returncode in (0, 1), first.stderr
    doc = json.loads(first.stdout)
    assert doc["status"] == "budget_reached"
    store = RunStore(Path(doc["study_dir"]) / "store.sqlite")
    refused = [r for r in store.rollouts() if r.failure == FailureKind.budget_exhausted]
    assert refused, "no rollout was stopped by the gateway"
    for rollout in refused:
        # Stopped by the budget: no reward, not terminal (a resume runs it again), never graded as wrong.
        assert rollout.status == RolloutStatus.cancelled and rollout.reward is None
        assert "budget" in (rollout.error or "")
        assert any((c.error or "").startswith("budget_exhausted") for c in store.calls(rollout.id))
    # Each call reserved its worst case first: none fitted a budget this small, so nothing was spent past it.
    assert sum(c.cost_usd or 0 for c in store.calls()) <= 0.0001
    refused_keys = {r.key for r in refused}
    store.close()

    resumed = run_agl(["optimize", "--resume", doc["study_id"], "--budget-usd", "10", "--json", "-q"],
                      cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads(resumed.stdout)
    assert final["status"] == "completed"
    store = RunStore(Path(doc["study_dir"]) / "store.sqlite")
    latest = {r.key: r for r in store.rollouts(latest_only=True)}
    assert all(latest[k].status == RolloutStatus.succeeded and latest[k].attempt == 2 for k in refused_keys)
    store.close()
