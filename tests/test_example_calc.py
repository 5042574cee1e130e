"""End to end: `agl eval` of the offline example on the embedded model, every call recorded and attributed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_backend.store.db import RunStore
from tests.helpers import REPO, run_agl

pytestmark = [pytest.mark.usefixtures("smollm2"), pytest.mark.slow]


def test_eval_of_the_offline_example_on_20_tasks(tmp_path: Path) -> None:
    spec = REPO / "examples" / "calc" / "agl.yaml"
    result = run_agl(
        ["eval", str(spec), "--split", "val", "--limit", "20", "--json", "--runs-dir", str(tmp_path)], cwd=tmp_path,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    (variant,) = doc["variants"]
    assert variant["name"] == "baseline" and variant["finished"] == 20
    # Every rollout is scored; on a heavily loaded machine a rollout may run past the spec's 300 s and be killed,
    # which is reported as such (never scored 0) and tolerated here for at most two of them.
    assert set(variant["missing_reasons"]) <= {"agent_timeout"}, variant["missing_reasons"]
    assert variant["missing"] <= 2 and variant["n"] == 20 - variant["missing"]
    mean, (lo, hi) = variant["accuracy"]["mean"], variant["accuracy"]["ci95"]
    assert 0.0 <= lo <= mean <= hi <= 1.0
    assert variant["tokens"]["input"] > 0 and variant["tokens"]["output"] > 0
    assert variant["latency_s"]["p50"] > 0 and variant["cost_usd"] == 0.0
    assert variant["model_warnings"] == [] and "warning" not in result.stderr

    store = RunStore(tmp_path / doc["run_id"] / "store.sqlite")
    rollouts = store.rollouts()
    calls = store.calls()
    assert {c.rollout_id for c in calls} == {r.id for r in rollouts}  # every rollout called the model, attributed
    killed = {r.id for r in rollouts if r.status.value == "timed_out"}
    for call in calls:
        if call.rollout_id in killed and call.status_code == 499:
            continue  # the call in flight when the agent was killed: recorded as the client going away
        assert call.status_code == 200 and call.api.value == "openai.chat"
        assert call.upstream == "local" and call.model == "smollm2-135m-instruct"
        assert call.request_model == "local/smollm2-135m-instruct"  # the agent names the spec's model: no fallback
        assert call.prompt_token_ids and call.completion_token_ids and call.logprobs
        assert len(call.completion_token_ids) == len(call.logprobs) == call.output_tokens
        assert len(call.prompt_token_ids) == call.input_tokens
        assert "authorization" not in json.dumps(call.request).lower()
    # Multi-turn rollouts: when the agent hands back the model's reply unchanged, the next prompt extends the previous
    # prompt and completion token for token, which is what lets training merge the calls into one sequence.
    multi = [r for r in rollouts if len(store.calls(r.id)) > 1]
    assert multi, "no rollout used the calculator tool"
    exact = 0
    for rollout in multi:
        first, second = store.calls(rollout.id)[:2]
        assert first.prompt_token_ids and first.completion_token_ids and second.prompt_token_ids
        assert second.prompt_token_ids[: len(first.prompt_token_ids)] == first.prompt_token_ids
        prefix = first.prompt_token_ids + first.completion_token_ids
        exact += second.prompt_token_ids[: len(prefix)] == prefix
    assert exact >= 1, "no multi-turn rollout extended its previous call exactly"
