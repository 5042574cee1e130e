"""Knobs a coding agent can trust: an option `null` leaves the setting alone (the system_prompt baseline leaves an
agent's several prompts as they are, a reasoning_effort baseline sends nothing a model could refuse), a knob limited
to the models that take it, `--no-knobs`, options with commas and short names, and variant hashes that follow what
a variant does rather than the whole knob table. A real agent on the openai SDK through the gateway to a scripted
upstream that refuses `reasoning_effort` for its small model, as a model without reasoning does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from agl_cli.errors import ConfigError, UsageError
from agl_cli.spec.schema import load_spec
from agl_cli.spec.variants import baseline, grid, no_knobs, parse_variant
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY
from rl_backend.gateway.knobs import knobs_for_call, validate_knobs
from rl_backend.store.db import RunStore
from tests.helpers import FIXTURES, REPO, invoke_agl, run_agl, write_tasks

TERSE = "Answer in one line."


def _spec(folder: Path, knobs: dict[str, Any], **extra: Any) -> Path:
    write_tasks(folder / "tasks.jsonl", [{"id": f"t{i}"} for i in range(3)])
    spec = {"agent": {"command": "python agent.py"}, "tasks": {"path": "tasks.jsonl"},
            "grader": {"entry": "agent:grade"}, "knobs": knobs, **extra}
    (folder / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder / "agl.yaml"


# -- the spec and the variants ---------------------------------------------------------------------------------------


def test_an_option_may_hold_commas_and_options_may_have_short_names(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path, {
        "vote": {"values": ["a", "a,b,c"], "via": "env", "name": "VOTE"},
        "temperature": {"values": [0.0, 0.7], "via": "gateway"},
        "ensemble": {"values": {"single": "p1", "vote3": "p1,p2,p3"}, "via": "env", "name": "PROMPTS"},
    }))
    chosen = parse_variant(spec, "vote=a,b,c,temperature=0.7")
    assert chosen.settings == {"vote": "a,b,c", "temperature": 0.7, "ensemble": "p1"}
    assert chosen.name == "vote=a,b,c,temperature=0.7" and parse_variant(spec, chosen.name) == chosen
    short = parse_variant(spec, "ensemble=vote3")
    assert short.name == "ensemble=vote3" and short.settings["ensemble"] == "p1,p2,p3"
    assert parse_variant(spec, "ensemble=p1,p2,p3") == short  # the value itself names it too
    assert [v.name for v in grid(spec)][:2] == ["baseline", "ensemble=vote3"]
    # A wrong option: the options are listed so that one holding a comma reads as one option.
    with pytest.raises(UsageError) as wrong:
        parse_variant(spec, "vote=b")
    assert 'its options are named: a, "a,b,c"' in str(wrong.value)
    with pytest.raises(UsageError, match="no knob named 'tempo'"):
        parse_variant(spec, "vote=a,tempo=1")
    with pytest.raises(UsageError, match="set twice"):
        parse_variant(spec, "vote=a,vote=a,b,c")
    # The same from the command line: exit 2, and the message says what the options are named.
    shutil.copy(FIXTURES / "two_prompts_agent.py", tmp_path / "agent.py")
    result = invoke_agl(["eval", "agl.yaml", "--variant", "ensemble=vote5"], cwd=tmp_path)
    assert result.returncode == 2 and "its options are named: single, vote3" in result.stderr


def test_null_leaves_the_baseline_and_its_hash_as_they_were(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "terse.md").write_text(TERSE)
    before = baseline(load_spec(_spec(tmp_path, {})))
    spec = load_spec(_spec(tmp_path, {
        "reasoning_effort": {"values": [None, "high"], "via": "gateway"},
        "system_prompt": {"files": [None, "prompts/terse.md"], "via": "gateway"},
        "max_turns": {"values": {"default": None, "more": 12}, "via": "env", "name": "MAX_TURNS"},
    }))
    after = baseline(spec)
    assert after.name == "baseline" and after.hash == before.hash  # a knob added with `null` first changes nothing
    assert no_knobs(spec) == after
    names = [v.name for v in grid(spec)]
    assert "reasoning_effort=high,system_prompt=terse,max_turns=more" in names and len(set(names)) == 8
    # A knob whose baseline sets something: `unset` (or `null`) names the option of leaving it alone.
    sets = load_spec(_spec(tmp_path, {"temperature": {"values": [0.2, None], "via": "gateway"},
                                      "max_turns": {"values": [4, 8], "via": "env", "name": "MAX_TURNS"}}))
    assert parse_variant(sets, "temperature=unset") == parse_variant(sets, "temperature=null")
    assert parse_variant(sets, "temperature=unset").settings == {"temperature": None, "max_turns": 4}
    assert baseline(sets).hash != before.hash
    alone = no_knobs(sets)
    assert alone.name == "no-knobs" and alone.hash == before.hash and parse_variant(sets, "no-knobs") == alone


def test_a_knob_limited_to_models_counts_only_where_it_applies(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path, {
        "model": {"values": ["p/small", "p/large"], "via": "gateway"},
        "reasoning_effort": {"values": [None, "low", "high"], "via": "gateway", "models": ["p/large"]},
    }, upstreams={"p": {"kind": "openai-compatible", "base_url": "http://127.0.0.1:9/v1"}}))
    variants = grid(spec)
    hashes = {v.name: v.hash for v in variants}
    # On the small model the effort is never sent: those variants are the small model's, measured once.
    assert hashes["reasoning_effort=high"] == hashes["reasoning_effort=low"] == hashes["baseline"]
    assert len({v.hash for v in variants}) == 4
    # Without a model knob the calls' model is the agent's to choose: the limit is part of what the variant does.
    free = load_spec(_spec(tmp_path, {"reasoning_effort": {"values": [None, "high"], "via": "gateway",
                                                           "models": ["*gpt-5*"]}}))
    unlimited = load_spec(_spec(tmp_path, {"reasoning_effort": {"values": [None, "high"], "via": "gateway"}}))
    assert parse_variant(free, "reasoning_effort=high").hash != parse_variant(unlimited, "reasoning_effort=high").hash


@pytest.mark.parametrize(("knob", "message"), [
    ({"values": [1, 2], "via": "env", "name": "X", "models": ["p/a"]}, "limits a `via: gateway` knob"),
    ({"values": ["p/a"], "via": "gateway", "models": ["p/a"]}, "cannot be limited to some models"),
    ({"values": [None, None], "via": "gateway"}, "not every one"),
    ({"values": {"a,b": 0.1}, "via": "gateway"}, "no spaces, commas or `=`"),
    ({"values": [1, "1"], "via": "env", "name": "X"}, "both named '1'; give them short names"),
])
def test_knob_mistakes_are_refused_with_the_fix(tmp_path: Path, knob: dict[str, Any], message: str) -> None:
    name = "model" if "cannot be limited" in message else "temperature"
    with pytest.raises(ConfigError) as info:
        load_spec(_spec(tmp_path, {name: knob}))
    assert message in str(info.value) and info.value.exit_code == 2


def test_reflect_needs_a_baseline_prompt_file(tmp_path: Path) -> None:
    (tmp_path / "v2.md").write_text("v2")
    shutil.copy(FIXTURES / "two_prompts_agent.py", tmp_path / "agent.py")
    path = _spec(tmp_path, {"prompt": {"files": [None, "v2.md"], "via": "file", "path": "{rollout_dir}/p.md"}},
                 upstreams={"p": {"kind": "openai-compatible", "base_url": "http://127.0.0.1:9/v1"}},
                 proposer={"model": "p/big"})
    assert baseline(load_spec(path)).settings == {"prompt": None}  # the spec itself is fine: eval runs it
    result = invoke_agl(["optimize", "agl.yaml", "--strategy", "reflect"], cwd=tmp_path)
    assert result.returncode == 2 and "starts with `null`" in result.stderr, result.stderr


def test_the_best_config_keeps_short_names_and_null(tmp_path: Path) -> None:
    from agl_cli.optimize.best_config import knob_changes, render_best

    (tmp_path / "terse.md").write_text(TERSE)
    path = _spec(tmp_path, {"system_prompt": {"files": [None, "terse.md"], "via": "gateway"},
                            "vote": {"values": {"single": "a", "vote3": "a,b,c"}, "via": "env", "name": "VOTE"}})
    spec = load_spec(path)
    winner = parse_variant(spec, "system_prompt=terse,vote=vote3")
    assert knob_changes(spec, baseline(spec), winner) == {
        "system_prompt": {"baseline": None, "winner": "terse.md"}, "vote": {"baseline": "a", "winner": "a,b,c"}}
    best = yaml.safe_load(render_best(path, spec, winner, header="best")[0])["knobs"]
    assert best["system_prompt"]["files"] == ["terse.md", None]
    assert list(best["vote"]["values"].items()) == [("vote3", "a,b,c"), ("single", "a")]


def test_the_gateway_applies_a_limited_knob_to_matching_models_only() -> None:
    checked = validate_knobs({"reasoning_effort": {"value": "high", "models": ["openai/gpt-5*", "o4-mini"]},
                              "temperature": None, "top_p": 0.5})
    assert checked == {"reasoning_effort": {"value": "high", "models": ["openai/gpt-5*", "o4-mini"]}, "top_p": 0.5}
    assert knobs_for_call(checked, "openai", "gpt-5-mini") == {"reasoning_effort": "high", "top_p": 0.5}
    assert knobs_for_call(checked, "azure", "o4-mini") == {"reasoning_effort": "high", "top_p": 0.5}
    assert knobs_for_call(checked, "openai", "gpt-4.1") == {"top_p": 0.5}
    with pytest.raises(ValueError, match="non-empty list"):
        validate_knobs({"top_p": {"value": 0.5, "models": []}})


def test_the_levers_reference_says_what_each_gateway_knob_touches() -> None:
    from rl_backend.gateway.knobs import KNOBS

    text = (REPO / "skills" / "agent-lightning" / "references" / "levers.md").read_text()
    section = text.split("## What each gateway knob touches", 1)[1].split("\n## ", 1)[0]
    for name in KNOBS:
        assert f"`{name}`" in section, name
    assert "`null`" in section and "`models:`" in section


# -- through the gateway, end to end ---------------------------------------------------------------------------------


def test_null_and_models_reach_only_what_they_should(tmp_path: Path, fake_server: FakeUpstream) -> None:
    fake_server.reset()
    fake_server.refused_params = {"small": {"reasoning_effort"}}  # as a model without reasoning answers
    shutil.copy(FIXTURES / "two_prompts_agent.py", tmp_path / "agent.py")
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "terse.md").write_text(TERSE)
    _spec(tmp_path, {
        "model": {"values": ["fake/small", "fake/large"], "via": "gateway"},
        "reasoning_effort": {"values": [None, "high"], "via": "gateway", "models": ["fake/large"]},
        "system_prompt": {"files": [None, "prompts/terse.md"], "via": "gateway"},
        "temperature": {"values": [0.2, 0.9], "via": "gateway"},
    }, upstreams={"fake": {"kind": "openai-compatible", "base_url": fake_server.base_url, "api_key_env": "FAKE_KEY"}},
        model="fake/small", concurrency=3)
    result = run_agl(["eval", "agl.yaml", "--json", "--no-report", "-q", "--variant", "baseline",
                      "--variant", "model=fake/large,reasoning_effort=high", "--variant", "reasoning_effort=high",
                      "--variant", "system_prompt=terse", "--no-knobs"], cwd=tmp_path,
                     env={"FAKE_KEY": UPSTREAM_KEY})
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert "variant reasoning_effort=high does what baseline does" in result.stderr
    by_name = {v["name"]: v for v in doc["variants"]}
    assert set(by_name) == {"baseline", "model=fake/large,reasoning_effort=high", "system_prompt=terse", "no-knobs"}
    assert all(v["accuracy"]["mean"] == 1.0 and v["missing"] == 0 for v in by_name.values()), doc["variants"]
    store = RunStore(Path(doc["run_dir"]) / "store.sqlite", read_only=True)
    sent: dict[str, list[dict[str, Any]]] = {}
    for rollout in store.rollouts():
        sent.setdefault(rollout.variant, []).extend(c.request for c in store.calls(rollout.id))
    store.close()

    def systems(name: str) -> set[str]:
        return {m["content"] for body in sent[name] for m in body["messages"] if m["role"] == "system"}

    agent_prompts = {"You sort support tickets into billing, bug or other.",
                     "You draft a short, polite reply to a support ticket."}
    # The baseline leaves both of the agent's prompts alone and sends no reasoning_effort.
    assert systems("baseline") == agent_prompts
    assert all("reasoning_effort" not in b and b["temperature"] == 0.2 for b in sent["baseline"])
    assert all(b["reasoning_effort"] == "high" and b["model"] == "large" for b in
               sent["model=fake/large,reasoning_effort=high"])
    assert systems("system_prompt=terse") == {TERSE}
    # --no-knobs: nothing set at all, not even the baseline's temperature.
    assert systems("no-knobs") == agent_prompts
    assert all("temperature" not in b and "reasoning_effort" not in b for b in sent["no-knobs"])
    assert not [s for s in fake_server.requests if s.body.get("model") == "small" and "reasoning_effort" in s.body]
