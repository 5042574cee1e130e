"""One way from agl.yaml's upstreams to the gateway's: the routing of a lone upstream, what is free, API keys, and the
budget check, alike for `agl eval` (agl_cli/evaluation/services.py) and `agl gateway serve` (rl_backend/gateway/resolver.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from agl_cli.errors import ConfigError
from agl_cli.evaluation.services import running_services
from agl_cli.spec.prices import check_budget_prices
from agl_cli.spec.schema import load_spec
from rl_backend.gateway.config import UpstreamSpec
from rl_backend.gateway.fake import openai_shapes
from rl_backend.gateway.fake.replies import chat_reply
from rl_backend.gateway.replay_recorder import RecordingFile
from rl_backend.gateway.resolver import UpstreamSetupError, default_model, describe, started_upstreams
from rl_backend.store.db import RunStore
from tests.helpers import write_tasks

MSGS: Any = [{"role": "user", "content": "hello there"}]


def _spec(folder: Path, **fields: Any) -> Path:
    write_tasks(folder / "tasks.jsonl", [{"id": "t1"}])
    spec = {"agent": {"command": "true"}, "tasks": {"path": "tasks.jsonl"}, "grader": {"command": "echo 1"}, **fields}
    (folder / "agl.yaml").write_text(yaml.safe_dump(spec))
    return folder / "agl.yaml"


def _record(path: Path, model: str) -> dict[str, Any]:
    """A recording of one chat call, as `record_to:` writes it."""
    body = {"model": model, "messages": MSGS}
    answer = openai_shapes.chat_completion(body, chat_reply(body), n=1, cached=0, version=None)
    RecordingFile(path).add("openai.chat", body, 200, {}, response=answer)
    return answer


def test_a_lone_upstream_takes_the_names_that_match_none_in_eval_as_in_gateway_serve(tmp_path: Path) -> None:
    """An agent that hard-codes its model runs unchanged against a spec with one upstream and no `model:` (before, a
    run's gateway refused its calls while `agl gateway serve` routed them)."""
    answer = _record(tmp_path / "rec.jsonl", "gpt-4o-mini")
    spec = load_spec(_spec(tmp_path, upstreams={"hosted": {"kind": "replay", "path": "rec.jsonl"}}))
    assert default_model(spec.upstreams, spec.model) == "hosted"
    store = RunStore(tmp_path / "store.sqlite")
    try:
        with running_services(spec, store) as services:
            assert services.gateway is not None and services.gateway_url
            token = services.gateway.register_rollout("r1")
            client = openai.OpenAI(base_url=f"{services.gateway_url}/rollouts/r1/openai/v1", api_key=token,
                                   max_retries=0)
            reply = client.chat.completions.create(model="gpt-4o-mini", messages=MSGS)  # served from the recording
            assert (reply.id, reply.choices[0].message.content) == (answer["id"], "You said: hello there")
            services.gateway.flush()
        (call,) = store.calls()
        assert (call.upstream, call.model, call.route.value) == ("hosted", "gpt-4o-mini", "default")
    finally:
        store.close()


def test_free_and_prices_decide_alike_for_every_kind() -> None:
    embedded = UpstreamSpec(kind="embedded", model="m")
    assert describe("local", embedded).free is None and describe("local", embedded).returns_token_ids
    assert describe("local", embedded.model_copy(update={"free": False})).free is False  # `free:` decides outright
    policy = describe("local", embedded, policy=True)
    assert policy.registered_later and policy.base_urls == [] and policy.returns_token_ids
    replay = UpstreamSpec(kind="replay", path="r.jsonl", api="anthropic")
    assert describe("r", replay).free is False and describe("r", replay).api == "anthropic"  # priced like the API
    assert describe("r", replay.model_copy(update={"free": True})).free is True
    vllm = UpstreamSpec(kind="openai-compatible", base_url="http://127.0.0.1:8000/v1")
    assert not describe("v", vllm).returns_token_ids and describe("v", vllm, token_ids=True).returns_token_ids


def test_a_budget_refuses_an_unpriced_replay_model_before_the_run(tmp_path: Path) -> None:
    """A replay is priced like the API it recorded, by the budget check as by the gateway (before, the check took a
    replay for a free local server and let the run start, and the gateway then refused every call)."""
    (tmp_path / "rec.jsonl").write_text("")
    spec = load_spec(_spec(tmp_path, upstreams={"hosted": {"kind": "replay", "path": "rec.jsonl", "model": "house-1"}},
                           budget={"usd": 1.0}))
    with pytest.raises(ConfigError, match="hosted/house-1 has no price"):
        check_budget_prices(spec, spec.budget.usd)


def test_keys_are_read_once_and_a_missing_one_names_its_variable(tmp_path: Path) -> None:
    specs = {"openai": UpstreamSpec(kind="openai"), "mine": UpstreamSpec(kind="openai-compatible",
                                                                         base_url="http://x/v1", api_key_env="MINE")}
    with started_upstreams(specs, environ={"OPENAI_API_KEY": "sk-a", "MINE": "sk-b", "OTHER": "sk-c"}) as up:
        assert (up.resolved["openai"].api_key, up.resolved["mine"].api_key) == ("sk-a", "sk-b")
    with started_upstreams(specs, environ={"OTHER": "sk-c"}, key_envs={"openai": "OTHER"}) as up:
        assert (up.resolved["openai"].api_key, up.resolved["mine"].api_key) == ("sk-c", None)
    # before any model loads (this one would not: no such model), so a missing key costs no wait
    first = {"local": UpstreamSpec(kind="embedded", model="no-such-model-anywhere"), **specs}
    with pytest.raises(UpstreamSetupError, match=r"needs an API key in \$OPENAI_API_KEY"), started_upstreams(first, environ={}):
        pass
    spec = load_spec(_spec(tmp_path, upstreams={"claude": {"kind": "anthropic"}}))
    store = RunStore(tmp_path / "store.sqlite")
    try:
        with pytest.raises(ConfigError, match=r"\$ANTHROPIC_API_KEY") as refused, running_services(spec, store):
            pass
        assert refused.value.exit_code == 2 and "agents never see it" in (refused.value.hint or "")
    finally:
        store.close()
