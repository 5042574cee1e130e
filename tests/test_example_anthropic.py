"""The calc task with an agent on the Anthropic SDK, offline on the embedded model: every Messages call is translated
to an OpenAI chat completion by the gateway and recorded with token ids, like the OpenAI-SDK agent's calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_backend.store.db import RunStore
from tests.helpers import REPO, run_agl

pytestmark = pytest.mark.usefixtures("smollm2")


def test_anthropic_sdk_agent_on_the_embedded_model(tmp_path: Path) -> None:
    spec = REPO / "examples" / "anthropic_calc" / "agl.yaml"
    result = run_agl(
        ["eval", str(spec), "--split", "val", "--limit", "3", "--json", "--no-report", "--runs-dir", str(tmp_path)],
        cwd=tmp_path, env={"AGENT_MAX_TURNS": "2"}, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    (variant,) = doc["variants"]
    assert variant["finished"] == 3 and variant["missing"] == 0, variant["missing_reasons"]
    assert 0.0 <= variant["accuracy"]["mean"] <= 1.0 and variant["cost_usd"] == 0.0
    assert variant["model_warnings"] == [] and "warning" not in result.stderr

    store = RunStore(tmp_path / doc["run_id"] / "store.sqlite")
    calls = store.calls()
    assert {c.rollout_id for c in calls} == {r.id for r in store.rollouts()}
    for call in calls:
        assert call.status_code == 200 and call.api.value == "anthropic.messages"
        assert call.upstream == "local" and call.model == "smollm2-135m-instruct"
        assert call.request_model == "local/smollm2-135m-instruct"  # the agent names the spec's model, as it does
        assert call.request["stop_sequences"] == ["RESULT:"] and call.request["system"].startswith("You are")
        assert call.response["type"] == "message" and call.response["content"][0]["type"] == "text"
        assert call.prompt_token_ids and call.completion_token_ids  # recorded through the translation, for training
        assert len(call.completion_token_ids) == call.output_tokens
