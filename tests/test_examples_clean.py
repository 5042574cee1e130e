"""Every shipped example runs without a warning: the first report a new user reads must not open with one (the
quickstart's agent once asked for `gpt-4o-mini`, served by SmolLM2 as a fallback, and its report opened with two).

Fast, for every `examples/*/agl*.yaml`: the model name its agent sends (its AGENT_MODEL, from the spec's
`agent.env` or the agent's default) goes through the gateway's own router and fallback rule, and must not fall
back to the default model.

Slow, the same specs run: one task through `agl eval`, agent and grader unchanged, upstreams kept under their own
names (so the gateway routes each call as it would for a user): an embedded one serves the tiny random chat model
instead of SmolLM2 (routing does not depend on the weights), a hosted API (not reachable from here) is the scripted
fake at a loopback URL, the coding example's scripted model is started, a replay plays its recording. The run
shows no model warning, prints no warning, its report carries no note, and its agent asked for exactly the name
the fast check read."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rl_backend.gateway.config import UpstreamSpec
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.resolver import default_model, describe
from rl_backend.gateway.routing import Router
from rl_backend.httpserver import ServerThread
from rl_backend.store.db import RunStore
from rl_backend.store.records import ModelUse
from tests.helpers import REPO, run_agl

EXAMPLES = REPO / "examples"
SPECS = sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.glob("*/agl*.yaml"))
SCRIPTED_PORT = ":8765/"  # where examples/coding/agl.scripted.yaml expects its scripted model
AGENT_MODEL = re.compile(r"""os\.environ\.get\(\s*["']AGENT_MODEL["']\s*,\s*["']([^"']+)["']\s*\)""")


def asked_model(spec: Path, config: dict) -> str:
    """The model name the example's agent sends: AGENT_MODEL from the spec's `agent.env`, else the agent's default."""
    env = (config["agent"].get("env") or {}).get("AGENT_MODEL")
    if env:
        return str(env)
    script = next(spec.parent / word for word in shlex.split(config["agent"]["command"]) if word.endswith(".py"))
    found = AGENT_MODEL.search(script.read_text())
    assert found, f"{script}: say how this example's agent names its model (this test reads AGENT_MODEL's default)"
    return found.group(1)


@pytest.mark.parametrize("spec", SPECS)
def test_each_examples_agent_names_a_model_its_spec_routes_by_name(spec: str) -> None:
    path = EXAMPLES / spec
    config = yaml.safe_load(path.read_text())
    upstreams = {name: UpstreamSpec.model_validate(u) for name, u in config["upstreams"].items()}
    router = Router({name: describe(name, u) for name, u in upstreams.items()},
                    default_model(upstreams, config.get("model")))
    knob = (config.get("knobs") or {}).get("model")
    knob_model = knob["values"][0] if knob and knob.get("via") == "gateway" else None
    asked = asked_model(path, config)
    route = router.resolve(asked, knob_model, "r-static")
    use = ModelUse(asked, f"{route.upstream.name}/{route.model}", route.kind, None, 1)
    assert not use.fell_back, f"{spec}: the agent asks for {asked!r}, which falls back to {use.served}"


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples as shipped, in a folder the runs may write to (several use each other's files by path)."""
    folder = tmp_path_factory.mktemp("examples") / "examples"
    shutil.copytree(EXAMPLES, folder, ignore=shutil.ignore_patterns(".agl", "__pycache__"))
    return folder


@pytest.fixture(scope="module")
def hosted_api() -> Iterator[FakeUpstream]:
    fake = FakeUpstream().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def scripted_model() -> Iterator[str]:
    spec = importlib.util.spec_from_file_location("coding_scripted_model", EXAMPLES / "coding" / "scripted_model.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    server = ServerThread(module.app).start()
    yield server.base_url + "/v1"
    server.stop()


def _runnable_here(config: dict, tiny: Path, fake: FakeUpstream, scripted: str) -> dict:
    """The spec with each upstream, under its own name, served by what runs on this machine."""
    for name, upstream in config.get("upstreams", {}).items():
        kind = upstream["kind"]
        if kind == "embedded":
            upstream["model"] = str(tiny)
        elif kind in ("openai", "anthropic"):
            upstream["base_url"] = fake.base_url if kind == "openai" else fake.url
        elif kind == "openai-compatible" and SCRIPTED_PORT in upstream.get("base_url", ""):
            upstream["base_url"] = scripted
        elif kind != "replay":
            raise AssertionError(f"upstream {name!r} of kind {kind}: say how this test serves it")
    return config


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS)
def test_each_example_runs_without_a_warning(spec: str, copy: Path, tiny_chat_model: Path, hosted_api: FakeUpstream,
                                             scripted_model: str, tmp_path: Path) -> None:
    path = copy / spec
    asked = asked_model(path, yaml.safe_load(path.read_text()))
    config = _runnable_here(yaml.safe_load(path.read_text()), tiny_chat_model, hosted_api, scripted_model)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {"OPENAI_API_KEY": "sk-examples-test-key-0123456789", "ANTHROPIC_API_KEY": "sk-ant-examples-test-key-0123",
           "AGL_CODING_REPOS": str(tmp_path / "repos"), "AGENT_MAX_TURNS": "2"}
    result = run_agl(["eval", path.name, "--limit", "1", "--json", "-q", "--runs-dir", str(tmp_path / "runs")],
                     cwd=path.parent, env=env, timeout=300)
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: no reward, which a random model may well earn
    doc = json.loads(result.stdout)
    assert [w for v in doc["variants"] for w in v["model_warnings"]] == []
    assert "warning" not in result.stderr.lower(), result.stderr
    report = (tmp_path / "runs" / doc["run_id"] / "report" / "report.md").read_text()
    assert "**Note:**" not in report, report.split("## Verdict", 1)[1][:2000]
    store = RunStore(tmp_path / "runs" / doc["run_id"] / "store.sqlite")
    try:
        requested = {use.requested for uses in store.model_use_by_rollout().values() for use in uses}
    finally:
        store.close()
    assert requested == {asked}  # what the fast check reads is what the agent sends


def test_every_example_is_covered() -> None:
    assert len(SPECS) >= 9 and {"quickstart/agl.yaml", "calc/agl.yaml", "anthropic_calc/agl.yaml"} <= set(SPECS)
