"""Numbers a user can trust for their own models: a ticket-triage agent on an OpenAI-compatible provider (a fake one
on loopback) with two models at different prices, `small-1` and `large-1`.

- declared prices (`prices:` in agl.yaml) give each variant its true cost, even on a loopback upstream;
- a model without a price has an unknown cost, shown as such (never $0), in the summary, the report and compare;
- `budget.usd` with an unpriced model on a paid upstream refuses to start (exit 2, naming the `prices:` entry);
- an agent that picks `large-1` through its own setting (an env knob) is served by the default `small-1`, and agl
  says so, with counts, and refuses to call that a comparison of two models;
- `${VAR}` in `base_url`.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agl_cli.main import app
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY
from tests.helpers import FIXTURES, run_agl, write_tasks

AGENT = FIXTURES / "triage_agent.py"
SMALL = {"input": 0.1, "output": 0.4}  # USD per 1M tokens
LARGE = {"input": 2.0, "output": 8.0}  # 20x small-1
TASKS = 3
CALLS_PER_TASK = 2
WIDE = {"COLUMNS": "250"}  # rich tables in one line each, so a cell can be read back


def _spec(folder: Path, *, prices: dict[str, Any], knobs: dict[str, Any], budget: dict[str, Any] | None = None) -> Path:
    write_tasks(folder / "tasks.jsonl", [{"id": f"t{i}", "ticket": f"printer {i} is on fire", "label": "hardware"}
                                         for i in range(TASKS)])
    spec: dict[str, Any] = {
        "name": "triage",
        "agent": {"command": f"python {AGENT} {{task_file}} {{output_file}}", "timeout_s": 60},
        "tasks": {"path": "tasks.jsonl"},
        "grader": {"command": f"python {AGENT} --grade {{task_file}} {{output_file}}"},
        "upstreams": {"triage": {"kind": "openai-compatible", "base_url": "${TRIAGE_URL}", "api_key_env": "TRIAGE_KEY"}},
        "model": "triage/small-1",
        "prices": prices,
        "knobs": knobs,
        "concurrency": 3,
    }
    if budget is not None:
        spec["budget"] = budget
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _env(fake: FakeUpstream) -> dict[str, str]:
    return {"TRIAGE_URL": fake.base_url, "TRIAGE_KEY": UPSTREAM_KEY, **WIDE}


def _calls(run_dir: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(run_dir / "store.sqlite") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(
            "SELECT r.variant, c.request_model, c.upstream, c.model, c.served_model, c.route, c.input_tokens, "
            "c.output_tokens, c.cost_usd FROM calls c JOIN rollouts r ON r.id = c.rollout_id")]


def _run_dir(stderr: str) -> Path:
    line = next(line for line in stderr.splitlines() if line.startswith("run stored in "))
    return Path(line.removeprefix("run stored in ").strip())


def test_declared_prices_give_each_variant_its_true_cost(tmp_path: Path, fake_server: FakeUpstream) -> None:
    fake_server.reset()
    _spec(tmp_path, prices={"triage/small-1": SMALL, "triage/large-1": LARGE},
          knobs={"model": {"values": ["triage/small-1", "triage/large-1"], "via": "gateway"}}, budget={"usd": 1.0})
    result = run_agl(["eval", "agl.yaml", "--variant", "baseline", "--variant", "model=triage/large-1", "--json"],
                     cwd=tmp_path, env=_env(fake_server), timeout=300)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    by_name = {v["name"]: v for v in doc["variants"]}
    small, large = by_name["baseline"], by_name["model=triage/large-1"]
    # the ground truth: every recorded call's tokens times its model's declared price
    expected: dict[str, float] = {"baseline": 0.0, "model=triage/large-1": 0.0}
    calls = _calls(Path(doc["run_dir"]))
    assert len(calls) == 2 * TASKS * CALLS_PER_TASK
    for call in calls:
        price = SMALL if call["model"] == "small-1" else LARGE
        cost = (call["input_tokens"] * price["input"] + call["output_tokens"] * price["output"]) / 1e6
        assert call["cost_usd"] == pytest.approx(cost, rel=1e-12)
        expected[call["variant"]] += cost
    assert small["cost_usd"] == pytest.approx(expected["baseline"], rel=1e-9) and small["cost_usd"] > 0
    assert large["cost_usd"] == pytest.approx(expected["model=triage/large-1"], rel=1e-9)
    assert large["cost_usd"] == pytest.approx(20 * small["cost_usd"], rel=1e-9)  # same tokens, 20x the price
    assert small["unpriced_calls"] == large["unpriced_calls"] == 0
    assert small["served_by"] == ["triage/small-1"] and large["served_by"] == ["triage/large-1"]
    assert small["model_warnings"] == large["model_warnings"] == []
    assert {(c["request_model"], c["route"], c["served_model"]) for c in calls if c["variant"] != "baseline"} == {
        ("small-1", "knob", "large-1")}

    compared = run_agl(["compare", f"{doc['run_id']}:baseline", f"{doc['run_id']}:model=triage/large-1", "--json"],
                       cwd=tmp_path, env=WIDE)
    assert compared.returncode == 0, compared.stderr
    cost = json.loads(compared.stdout)["comparisons"][0]["cost_usd_per_task"]
    assert cost["difference"]["mean"] == pytest.approx((large["cost_usd"] - small["cost_usd"]) / TASKS, rel=1e-9)
    assert cost["unpriced_calls"] == {"baseline": 0, "candidate": 0}


def test_a_missing_price_is_unknown_never_zero_and_a_budget_refuses_to_start(tmp_path: Path,
                                                                            fake_server: FakeUpstream) -> None:
    fake_server.reset()
    knobs = {"model": {"values": ["triage/small-1", "triage/large-1"], "via": "gateway"}}
    _spec(tmp_path, prices={"triage/small-1": SMALL}, knobs=knobs, budget={"usd": 1.0})
    env = _env(fake_server)
    refused = CliRunner().invoke(app, ["eval", str(tmp_path / "agl.yaml"), "--runs-dir", str(tmp_path / "runs")],
                                 env=env)
    assert refused.exit_code == 2, refused.output
    assert "budget.usd ($1) cannot be enforced: triage/large-1 has no price" in refused.output
    assert "prices:" in refused.output and "triage/large-1: {input:" in refused.output
    assert not (tmp_path / "runs").exists() and not fake_server.requests  # nothing ran, nothing was spent

    _spec(tmp_path, prices={"triage/small-1": SMALL}, knobs=knobs)  # the same, without the budget
    result = run_agl(["eval", "agl.yaml", "--variant", "baseline", "--variant", "model=triage/large-1"],
                     cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    unpriced = TASKS * CALLS_PER_TASK
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 5}
    assert f"— ({unpriced} unpriced calls)" in rows["model=triage/large-1"]
    assert "$" not in rows["model=triage/large-1"]  # no dollar figure at all for the unpriced variant
    # small-1's cost per task: a few millionths of a dollar, shown with its digits, not as $0.0000
    assert re.search(r"\$0\.0000+[1-9]\d", rows["baseline"])

    run_dir = _run_dir(result.stderr)
    report = (run_dir / "report" / "report.md").read_text()
    assert f"— ({unpriced} unpriced calls)" in report and "is unknown" in report
    compared = run_agl(["compare", f"{run_dir.name}:baseline", f"{run_dir.name}:model=triage/large-1", "--json"],
                       cwd=tmp_path, env=WIDE)
    assert compared.returncode == 0, compared.stderr
    cost = json.loads(compared.stdout)["comparisons"][0]["cost_usd_per_task"]
    assert cost["difference"]["mean"] is None and cost["unpriced_calls"] == {"baseline": 0, "candidate": unpriced}
    text = run_agl(["compare", f"{run_dir.name}:baseline", f"{run_dir.name}:model=triage/large-1"], cwd=tmp_path,
                   env=WIDE)
    assert f"cost/task unknown (candidate: {unpriced} unpriced calls)" in text.stdout


def test_a_model_named_by_the_agent_that_falls_back_to_the_default_is_never_silent(tmp_path: Path,
                                                                                   fake_server: FakeUpstream) -> None:
    fake_server.reset()
    _spec(tmp_path, prices={"triage/small-1": SMALL, "triage/large-1": LARGE},
          knobs={"agent_model": {"values": ["small-1", "large-1"], "via": "env", "name": "TRIAGE_MODEL"}})
    result = run_agl(["eval", "agl.yaml", "--variant", "baseline", "--variant", "agent_model=large-1"],
                     cwd=tmp_path, env=_env(fake_server), timeout=300)
    assert result.returncode == 0, result.stderr
    calls = TASKS * CALLS_PER_TASK
    warning = (f"warning: variant agent_model=large-1: {calls} of {calls} calls asked for 'large-1' and were served "
               "by triage/small-1")
    assert warning in result.stderr
    assert "variant baseline" not in result.stderr  # small-1 asked for by its bare name is what served it
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 5}
    assert "triage/small-1" in rows["agent_model=large-1"] and "triage/large-1" not in result.stdout

    run_dir = _run_dir(result.stderr)
    recorded = {(c["variant"], c["request_model"], c["upstream"], c["model"], c["route"], c["served_model"])
                for c in _calls(run_dir)}
    assert recorded == {("baseline", "small-1", "triage", "small-1", "default", "small-1"),
                        ("agent_model=large-1", "large-1", "triage", "small-1", "default", "small-1")}
    report = (run_dir / "report" / "report.md").read_text()
    assert "asked for 'large-1' and were served by triage/small-1" in report

    compared = run_agl(["compare", f"{run_dir.name}:baseline", f"{run_dir.name}:agent_model=large-1"],
                       cwd=tmp_path, env=WIDE)
    assert compared.returncode == 2, compared.stdout + compared.stderr
    assert "asked for different models (small-1 vs large-1)" in compared.stderr
    assert "every call of both was served by triage/small-1" in compared.stderr
    assert "not a comparison of two models" in compared.stderr


def test_values_come_from_the_environment_and_a_missing_one_names_its_line(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _spec(tmp_path, prices={}, knobs={})
    monkeypatch.delenv("TRIAGE_URL", raising=False)
    result = CliRunner().invoke(app, ["eval", str(tmp_path / "agl.yaml")])
    assert result.exit_code == 2, result.output
    line = next(i for i, text in enumerate((tmp_path / "agl.yaml").read_text().splitlines(), 1) if "base_url" in text)
    assert f"agl.yaml:{line}: `upstreams.triage.base_url`: ${{TRIAGE_URL}} is not set" in result.output
    assert "${NAME:-value}" in result.output


def test_under_a_budget_the_gateway_refuses_a_call_it_could_not_price(fake: FakeUpstream) -> None:
    """The backstop behind the start-up check: a model named only at run time (by the agent) with no price."""
    import openai

    from rl_backend.gateway.budget import SpendLimit
    from rl_backend.gateway.fake.harness import Harness

    fake.reset()
    paid = fake.upstream("triage", api_key=UPSTREAM_KEY)
    with Harness(fake, upstreams={"triage": paid}, default_model="triage/small-1",
                 prices={"triage/small-1": SMALL}, spend_limit=SpendLimit(1.0)) as h:
        client = h.openai("r1")
        client.chat.completions.create(model="triage/small-1", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="triage/large-1", messages=[{"role": "user", "content": "hi"}])
        body: Any = refused.value.body
        assert body["code"] == "model_unpriced" and "triage/large-1: {input:" in body["message"]
        assert len(fake.requests) == 1  # the refused call never reached the upstream


def test_init_writes_the_default_models_price(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "agl.yaml"
    made = runner.invoke(app, ["init", "--model", "triage/small-1", "--price", "0.1,0.4,0.05", "--out", str(out)])
    assert made.exit_code == 0, made.output
    assert yaml.safe_load(out.read_text())["prices"] == {"triage/small-1": {"input": 0.1, "output": 0.4,
                                                                            "cached_input": 0.05}}
    unknown = runner.invoke(app, ["init", "--model", "triage/small-1", "--out", str(tmp_path / "b.yaml")])
    assert unknown.exit_code == 0 and "warning: no price for triage/small-1" in unknown.output
    assert yaml.safe_load((tmp_path / "b.yaml").read_text())["prices"] == {}
    shipped = runner.invoke(app, ["init", "--model", "openai/gpt-4.1-mini", "--out", str(tmp_path / "c.yaml")])
    assert shipped.exit_code == 0 and "no price" not in shipped.output
    bad = runner.invoke(app, ["init", "--price", "cheap", "--out", str(tmp_path / "d.yaml")])
    assert bad.exit_code == 2 and "INPUT,OUTPUT[,CACHED_INPUT]" in bad.output
