"""The hosted-API example offline: record -> replay through the gateway (a miss fails loudly, naming what is
missing), and `agl eval` of the OpenAI and Anthropic agents served from the committed recordings."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import openai
import pytest

from agl_cli.errors import ConfigError
from agl_cli.spec.schema import load_spec
from rl_backend.gateway.config import UpstreamSpec
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import Harness
from rl_backend.gateway.replay import Recording, request_key
from rl_backend.gateway.replay_recorder import RecordingFile, RecordingTransport
from rl_backend.gateway.resolver import started_upstreams
from rl_backend.store.db import RunStore
from tests.helpers import REPO, run_agl

EXAMPLE = REPO / "examples" / "hosted"
KEY = "sk-live-key-never-recorded"
TOOLS = [{"type": "function", "function": {"name": "submit_fields", "parameters": {"type": "object", "properties": {}}}}]


def test_the_request_key_ignores_what_does_not_change_the_answer() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "temperature": 0}
    same = {"temperature": 0, "user": "someone", "metadata": {"a": 1}, "stream_options": None, **body}
    assert request_key("openai.chat", body) == request_key("openai.chat", json.loads(json.dumps(same)))
    assert request_key("openai.chat", body) != request_key("openai.chat", {**body, "temperature": 0.5})
    assert request_key("openai.chat", body) != request_key("openai.chat", {**body, "tools": []})
    assert request_key("openai.chat", body) != request_key("anthropic.messages", body)


def _clients(h: Harness, rollout: str) -> tuple[openai.OpenAI, anthropic.Anthropic]:
    token = h.rollout(rollout)
    return (openai.OpenAI(base_url=h.openai_url(rollout), api_key=token, max_retries=0),
            anthropic.Anthropic(base_url=h.anthropic_url(rollout), api_key=token, max_retries=0))


def test_replay_and_record_in_agl_yaml(tmp_path: Path) -> None:
    assert UpstreamSpec.model_validate({"kind": "openai", "record_to": "rec.jsonl"}).record_to == "rec.jsonl"
    for bad, why in (({"kind": "replay"}, "needs `path`"), ({"kind": "openai", "path": "x.jsonl"}, "record_to"),
                     ({"kind": "replay", "path": "x", "record_to": "y"}, r"not `base_url\(s\)` or `record_to`")):
        with pytest.raises(ValueError, match=why):
            UpstreamSpec.model_validate(bad)
    (tmp_path / "tasks.jsonl").write_text('{"id": "a"}\n')
    (tmp_path / "agl.yaml").write_text(
        "agent: {command: 'true'}\ntasks: {path: tasks.jsonl}\ngrader: {command: 'echo 1'}\n"
        "upstreams:\n  openai: {kind: replay, path: missing.jsonl}\n")
    with pytest.raises(ConfigError, match=r"agl.yaml:5: `upstreams.openai.path`: .*missing.jsonl does not exist"):
        load_spec(tmp_path / "agl.yaml")


def _calls(h: Harness, rollout: str) -> list[object]:
    chat, claude = _clients(h, rollout)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "[[tool]] extract"}]
    results: list[object] = [
        chat.chat.completions.create(model="gpt-5-mini", messages=messages, tools=TOOLS).model_dump(),
        "".join(c.choices[0].delta.content or "" for c in chat.chat.completions.create(
            model="gpt-5-mini", messages=[{"role": "user", "content": "[[reply:streamed words]]"}], stream=True)
            if c.choices),
        claude.messages.create(model="claude/claude-haiku-4-5", max_tokens=64, system="be brief",
                               messages=[{"role": "user", "content": "hello"}]).model_dump(),
    ]
    with claude.messages.stream(model="claude/claude-haiku-4-5", max_tokens=64,
                                messages=[{"role": "user", "content": "[[reply:a stream]]"}]) as stream:
        results.append(stream.get_final_text())
    return results


def test_record_then_replay_through_the_gateway(tmp_path: Path) -> None:
    recording = tmp_path / "rec.jsonl"
    fake, fake_claude = FakeUpstream(api_key=KEY), FakeUpstream(api_key=KEY)
    live = {  # free=False: priced like the hosted APIs these fakes stand in for
        "openai": fake.upstream("openai", api_key=KEY, free=False),
        "claude": fake_claude.upstream("claude", api="anthropic", api_key=KEY, free=False),
    }
    file = RecordingFile(recording)  # what `record_to:` puts in front of an upstream's own transport
    live = {name: up.model_copy(update={"transport": RecordingTransport(up.transport, file)}) for name, up in live.items()}
    with Harness(fake, upstreams=live, default_model="openai/gpt-5-mini", store_dir=tmp_path / "a") as h:
        recorded = _calls(h, "r1")
    text = recording.read_text()
    assert KEY not in text and len(text.splitlines()) == 4 == file.written
    assert sorted(json.loads(line)["api"] for line in text.splitlines()) == [
        "anthropic.messages", "anthropic.messages", "openai.chat", "openai.chat"]

    answered = len(fake.requests) + len(fake_claude.requests)
    replays = {"openai": UpstreamSpec(kind="replay", path=str(recording), api="openai"),
               "claude": UpstreamSpec(kind="replay", path=str(recording), api="anthropic")}
    with (started_upstreams(replays) as replay,
          Harness(fake, upstreams=replay.resolved, default_model="openai/gpt-5-mini", store_dir=tmp_path / "b") as h):
        assert all(u.free is False for u in replay.resolved.values())  # priced like the API it recorded
        assert _calls(h, "r2") == recorded
        assert len(fake.requests) + len(fake_claude.requests) == answered  # every answer came from the file
        chat, claude = _clients(h, "r3")
        with pytest.raises(openai.NotFoundError) as miss:
            chat.chat.completions.create(model="gpt-5-mini", temperature=0.5, tools=TOOLS, messages=[
                {"role": "system", "content": "be brief"}, {"role": "user", "content": "[[tool]] extract"}])
        message = str(miss.value)
        assert "replay: no recorded response" in message and "api=openai.chat model='gpt-5-mini'" in message
        assert "parameter temperature: 0.5 here, None recorded" in message and "record_to" in message
        with pytest.raises(openai.NotFoundError, match=r"the system prompt \(message 1\) differs"):
            chat.chat.completions.create(model="gpt-5-mini", tools=TOOLS, messages=[
                {"role": "system", "content": "be verbose"}, {"role": "user", "content": "[[tool]] extract"}])
        with pytest.raises(anthropic.NotFoundError, match="this conversation was never recorded"):
            claude.messages.create(model="claude/claude-haiku-4-5", max_tokens=64,
                                   messages=[{"role": "user", "content": "a new question"}])
        misses = [c for c in h.calls("r3") if c.status_code == 404]
        assert len(misses) == 3 and all("replay: no recorded response" in (c.error or "") for c in misses)


def _eval(spec: str, tmp_path: Path, *args: str) -> tuple[dict, RunStore]:
    result = run_agl(["eval", str(EXAMPLE / spec), "--json", "--no-report", "--runs-dir", str(tmp_path), *args],
                     cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    return doc, RunStore(tmp_path / doc["run_id"] / "store.sqlite")


def _recorded_ids(name: str) -> set[str]:
    return {e.response["id"] for e in Recording.load(EXAMPLE / "recordings" / name).all()}


def test_openai_agent_replayed_offline(tmp_path: Path) -> None:
    best = "model=openai/gpt-5-nano,reasoning_effort=low,system_prompt=careful"
    doc, store = _eval("agl.replay.yaml", tmp_path, "--limit", "3", "-v", "baseline", "-v", best)
    assert [v["name"] for v in doc["variants"]] == ["baseline", best]
    for variant in doc["variants"]:
        assert variant["n"] == 3 and variant["missing"] == 0, variant["missing_reasons"]
        assert 0.0 < variant["accuracy"]["mean"] <= 1.0
        assert variant["cost_usd"] > 0 and variant["tokens"]["input"] > 0  # priced like the API it recorded
    calls = store.calls()
    assert calls and {c.api.value for c in calls} == {"openai.chat"} and {c.upstream for c in calls} == {"openai"}
    assert {c.response["id"] for c in calls} <= _recorded_ids("openai.jsonl")
    assert {c.model for c in calls} == {"gpt-5-mini", "gpt-5-nano"}


def test_anthropic_agent_replayed_offline(tmp_path: Path) -> None:
    doc, store = _eval("agl.anthropic.replay.yaml", tmp_path, "--limit", "2", "-v", "baseline",
                       "-v", "model=anthropic/claude-sonnet-4-5,reasoning_effort=low")
    for variant in doc["variants"]:
        assert variant["n"] == 2 and variant["missing"] == 0, variant["missing_reasons"]
        assert variant["cost_usd"] > 0
    calls = store.calls()
    assert {c.api.value for c in calls} == {"anthropic.messages"}
    assert {c.response["id"] for c in calls} <= _recorded_ids("anthropic.jsonl")
    thinking = [c for c in calls if c.model == "claude-sonnet-4-5"]
    assert thinking and all(c.response["content"][0]["type"] == "thinking" for c in thinking)
    # the gateway turned reasoning_effort into a thinking budget; minimal turned thinking off
    assert all(c.request["thinking"] == {"type": "enabled", "budget_tokens": 1024} for c in thinking)
    assert all(c.request["thinking"] == {"type": "disabled"} for c in calls if c.model == "claude-haiku-4-5")
