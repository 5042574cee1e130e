"""Money under pressure: a budget in USD is a ceiling even with many streamed calls in flight, usage an upstream
cannot have meant is an error and never money, a variant's row counts every call the run paid for, and a price is
a finite number. The upstream is the scripted fake on loopback, misbehaving as asked; the agent is the openai SDK."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml
from typer.testing import CliRunner

from agl_cli.main import app
from rl_backend.gateway.budget import SpendLimit
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness
from rl_backend.gateway.pricing import PriceTable
from rl_backend.store.db import RunStore
from tests.helpers import run_agl

MSGS = [{"role": "user", "content": "hello there"}]
# USD per 1M tokens: output dominates, so a call's worst case (max_tokens 4) is close to what it costs (its 4 tokens
# cost $0.04), and the budgets below hold a handful of calls, as $10 holds a handful of $1.50 calls.
PRICES = {"tiny": {"input": 10.0, "output": 10_000.0}}
CALL_USD = 4 * 10_000.0 / 1e6 + 3 * 10.0 / 1e6  # "You said: hello there": 4 output tokens, 3 input tokens


@pytest.fixture()
def upstream(fake_server: FakeUpstream) -> Iterator[FakeUpstream]:
    fake_server.reset()
    yield fake_server
    fake_server.reset()


def _paid(fake: FakeUpstream, limit: SpendLimit | None) -> Harness:
    upstreams = {"paid": fake.upstream("paid", api_key=UPSTREAM_KEY, free=False),
                 "claude": fake.upstream("claude", api="anthropic", api_key=UPSTREAM_KEY, free=False)}
    return Harness(fake, upstreams=upstreams, default_model="paid/tiny", prices=PRICES, spend_limit=limit)


def _streamed_call(client: openai.OpenAI) -> str:
    stream = client.chat.completions.create(model="paid/tiny", messages=MSGS, max_tokens=4, stream=True)  # type: ignore[call-overload]
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


# -- 1. calls in flight are reserved -----------------------------------------------------------------------------


def test_calls_in_flight_reserve_their_worst_case_so_the_budget_is_never_passed(upstream: FakeUpstream) -> None:
    """Eight agents, five slow streamed calls each, a budget for about seven calls: admitting calls while the spend
    of finished calls was under the budget let every agent's call in flight finish past it."""
    upstream.chunk_delay_s = 0.03  # each call streams for a few tenths of a second: many overlap
    budget = 7.5 * CALL_USD
    limit = SpendLimit(budget, hint="raise budget.usd")
    with _paid(upstream, limit) as h:
        tokens = {f"agent{i}": h.rollout(f"agent{i}") for i in range(8)}

        def agent(rid: str) -> list[Any]:
            client = openai.OpenAI(base_url=h.openai_url(rid), api_key=tokens[rid], max_retries=0)
            seen: list[Any] = []
            for _ in range(5):
                try:
                    seen.append(_streamed_call(client))
                except openai.APIStatusError as exc:  # a real agent stops at an error it cannot retry
                    seen.append(exc)
                    break
            return seen

        with ThreadPoolExecutor(8) as pool:
            outcomes = [o for seen in pool.map(agent, tokens) for o in seen]
        records = h.calls()
        spend = h.gateway.state_dict()["spend"]

    answers = [o for o in outcomes if isinstance(o, str)]
    refusals = [o for o in outcomes if not isinstance(o, str)]
    assert answers and all(a == "You said: hello there" for a in answers)
    assert refusals, "nothing was refused: the budget was never reached"
    for refusal in refusals:
        assert refusal.status_code == 402
        body: Any = refusal.body
        assert body["code"] == "budget_exhausted" and " left " in body["message"] and "raise budget.usd" in body["message"]
    spent = sum(r.cost_usd or 0 for r in records)
    assert spent == pytest.approx(spend["spent_usd"])
    assert spent <= budget, f"spent ${spent:.4f} of a ${budget:.4f} budget"
    # Not stopped early: it spent until one more call's worst case (4 output tokens, the request's bytes) did not fit.
    assert spent > budget - 1.5 * CALL_USD
    assert spend["reserved_usd"] == 0 and spend["in_flight"] == 0
    # And calls did run at once: reserving is no queue of one.
    paid = sorted((r.started_at, r.ended_at) for r in records if r.status_code == 200)
    overlapping = max(sum(1 for s, e in paid if s <= start < e) for start, _ in paid)
    assert overlapping >= 3, paid


def test_a_call_that_can_never_fit_says_what_is_left_and_what_it_could_cost(upstream: FakeUpstream) -> None:
    with _paid(upstream, SpendLimit(0.05)) as h:
        client = h.openai("r1")
        with pytest.raises(openai.APIStatusError) as refused:  # no max_tokens: the stated cap is reserved
            client.chat.completions.create(model="paid/tiny", messages=MSGS)  # type: ignore[arg-type]
        message = refused.value.body["message"]  # type: ignore[index]
        assert refused.value.status_code == 402 and "has $0.0500 left" in message
        assert "32,768 output tokens" in message and "max_tokens on the call would reserve less" in message
        assert not upstream.requests  # refused before anything went upstream
        assert client.chat.completions.create(model="paid/tiny", messages=MSGS, max_tokens=4).choices  # type: ignore[arg-type]


def test_the_worst_case_counts_images_and_any_request_shape(upstream: FakeUpstream) -> None:
    """Each image part reserves thousands of input tokens, however short its URL; tool schemas of any shape
    (`"type": ["string", "null"]`) are read without trouble."""
    tools = [{"type": "function", "function": {"name": "find", "parameters": {
        "type": "object", "properties": {"q": {"type": ["string", "null"]}}}}}]
    image = [{"role": "user", "content": [{"type": "text", "text": "hello there"},
                                          {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]
    with _paid(upstream, SpendLimit(0.05)) as h:
        client = h.openai("r1")
        assert client.chat.completions.create(model="paid/tiny", messages=MSGS, max_tokens=4, tools=tools).choices  # type: ignore[arg-type]
        with pytest.raises(openai.APIStatusError) as refused:  # 3,000 tokens at $10 per 1M: $0.03 more
            client.chat.completions.create(model="paid/tiny", messages=image, max_tokens=4)  # type: ignore[arg-type]
        assert refused.value.status_code == 402
        counted = re.search(r"about ([\d,]+) input tokens", refused.value.body["message"])  # type: ignore[index]
        assert counted is not None and int(counted.group(1).replace(",", "")) > 3_000


# -- 2. usage that cannot be true ----------------------------------------------------------------------------------


IMPOSSIBLE = [
    pytest.param({"prompt_tokens": -1_000_000}, "negative", id="negative"),
    pytest.param({"completion_tokens": 2.5}, "whole number", id="fractional"),
    pytest.param({"prompt_tokens": "12"}, "not a count", id="string"),
    pytest.param({"completion_tokens": 10**12}, "more tokens than any model", id="absurd"),
    pytest.param({"prompt_tokens_details": {"cached_tokens": 99}}, "larger than its whole", id="cached-above-input"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("override", "said"), IMPOSSIBLE)
def test_usage_that_cannot_be_true_is_an_upstream_error_never_money(
    upstream: FakeUpstream, override: dict[str, Any], said: str, stream: bool
) -> None:
    limit = SpendLimit(1.0)
    with _paid(upstream, limit) as h:
        client = h.openai("r1")
        upstream.fail("usage", usage=override)
        with pytest.raises(openai.APIError, match="usage that cannot be true") as failed:
            if stream:
                _streamed_call(client)
            else:
                client.chat.completions.create(model="paid/tiny", messages=MSGS, max_tokens=4)  # type: ignore[arg-type]
        if not stream:
            assert isinstance(failed.value, openai.APIStatusError) and failed.value.status_code == 502
        (call,) = h.calls("r1")
        assert call.status_code == 502 and (call.error or "").startswith("upstream_impossible_usage:")
        assert said in (call.error or "")
        assert call.cost_usd is None and call.input_tokens is None and call.output_tokens is None
        # The upstream answered, so it may have billed: the budget counts the call's whole worst case.
        assert limit.spent_usd >= CALL_USD


def test_after_negative_usage_the_budget_still_holds(upstream: FakeUpstream) -> None:
    """A cost of minus $10 would have let $30 of calls pass a $10 budget."""
    budget = 5 * CALL_USD
    limit = SpendLimit(budget)
    with _paid(upstream, limit) as h:
        client = h.openai("r1")
        upstream.fail("usage", usage={"prompt_tokens": -1_000_000})
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="paid/tiny", messages=MSGS, max_tokens=4)  # type: ignore[arg-type]
        answered = 0
        for _ in range(30):
            try:
                client.chat.completions.create(model="paid/tiny", messages=MSGS, max_tokens=4)  # type: ignore[arg-type]
            except openai.APIStatusError as exc:
                assert exc.status_code == 402
                break
            answered += 1
        records = h.calls()
    assert 0 < answered < 5
    assert all((r.cost_usd or 0) >= 0 for r in records)
    assert sum(r.cost_usd or 0 for r in records) <= limit.spent_usd <= budget


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_impossible_anthropic_usage_is_an_error_too(upstream: FakeUpstream, stream: bool) -> None:
    with _paid(upstream, SpendLimit(1.0)) as h:
        claude = anthropic.Anthropic(base_url=h.anthropic_url("r1"), api_key=h.rollout("r1"), max_retries=0)
        upstream.fail("usage", usage={"input_tokens": -40})
        with pytest.raises(anthropic.APIError, match="usage that cannot be true"):
            if stream:
                with claude.messages.stream(model="claude/tiny", max_tokens=4, messages=MSGS) as events:  # type: ignore[arg-type]
                    events.get_final_message()
            else:
                claude.messages.create(model="claude/tiny", max_tokens=4, messages=MSGS)  # type: ignore[arg-type]
        (call,) = h.calls("r1")
        assert (call.error or "").startswith("upstream_impossible_usage: usage.input_tokens is -40")
        assert call.cost_usd is None


# -- 11. the variant row of a run the budget stopped ------------------------------------------------------------------

AGENT = textwrap.dedent('''\
    import sys
    import openai

    client = openai.OpenAI(max_retries=0)
    for turn in range(5):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello there"}], max_tokens=4)
    open(sys.argv[2], "w").write("right")
''')


def test_a_run_stopped_by_the_budget_shows_every_call_it_paid_for(tmp_path: Path, upstream: FakeUpstream) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps({"id": f"q{i}"}) + "\n" for i in range(4)))
    spec = {
        "agent": {"command": "python agent.py {task_file} {output_file}", "timeout_s": 60},
        "tasks": {"path": "tasks.jsonl"},
        "grader": {"command": "python -c 'print(1)'"},
        "upstreams": {"paid": {"kind": "openai-compatible", "base_url": upstream.base_url, "api_key_env": "PAID_KEY",
                               "free": False}},
        "model": "paid/tiny",
        "prices": {"paid/tiny": PRICES["tiny"]},
        "concurrency": 4,
        "budget": {"usd": round(7.5 * CALL_USD, 6)},  # 20 calls planned, about 7 affordable: every rollout stops
    }
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    result = run_agl(["eval", "agl.yaml", "--json", "-q", "--no-report"], cwd=tmp_path, env={"PAID_KEY": UPSTREAM_KEY})
    assert result.returncode in (0, 1), result.stderr
    doc = json.loads(result.stdout)
    assert doc["status"] == "budget_reached"
    (row,) = doc["variants"]
    assert doc["spend"]["usd"] > 0
    assert row["cost_usd"] == pytest.approx(doc["spend"]["usd"])
    store = RunStore(Path(doc["run_dir"]) / "store.sqlite")
    try:
        recorded = store.calls()
    finally:
        store.close()
    assert row["calls"] == len(recorded) > len(upstream.requests) > 0  # the refused calls are calls too
    assert row["tokens"]["output"] == sum(c.output_tokens or 0 for c in recorded) > 0
    assert doc["spend"]["usd"] <= spec["budget"]["usd"]  # type: ignore[index]


def test_the_rollouts_budget_has_no_such_hole(tmp_path: Path) -> None:
    """budget.rollouts is checked and counted in one step before a rollout starts, so concurrency cannot pass it."""
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps({"id": f"q{i}"}) + "\n" for i in range(12)))
    spec = {"agent": {"command": "python -c \"import sys; open(sys.argv[1], 'w').write('x')\" {output_file}"},
            "tasks": {"path": "tasks.jsonl"}, "grader": {"command": "python -c 'print(1)'"},
            "concurrency": 8, "budget": {"rollouts": 3}}
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    result = run_agl(["eval", "agl.yaml", "--json", "-q", "--no-report"], cwd=tmp_path)
    doc = json.loads(result.stdout)
    assert doc["status"] == "budget_reached" and doc["spend"]["rollouts_launched"] == 3, result.stderr
    assert doc["variants"][0]["finished"] == 3


# -- 16. prices ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("price", ["1e308", "1.0e+308", ".inf", ".nan", "true", "-1", "20000", "cheap"])
def test_a_price_that_is_no_finite_sane_number_is_a_config_error(tmp_path: Path, price: str) -> None:
    (tmp_path / "tasks.jsonl").write_text('{"id": "a"}\n')
    (tmp_path / "agl.yaml").write_text(textwrap.dedent(f'''\
        agent: {{command: "python agent.py {{task_file}} {{output_file}}"}}
        tasks: {{path: tasks.jsonl}}
        grader: {{command: "python grade.py {{task_file}} {{output_file}}"}}
        upstreams: {{paid: {{kind: openai-compatible, base_url: "http://127.0.0.1:9/v1", free: false}}}}
        model: paid/m
        prices:
          paid/m: {{input: 1.0, output: {price}}}
        budget: {{usd: 5}}
    '''))
    runner = CliRunner()
    for args in (["eval", str(tmp_path / "agl.yaml"), "--json", "--runs-dir", str(tmp_path / "runs")],
                 ["gateway", "serve", str(tmp_path / "agl.yaml"), "--port", "0", "--json"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        said = " ".join(result.output.split())
        assert "agl.yaml:7" in said and "prices.paid/m.output" in said and "price must be" in said
        assert "Infinity" not in said and "Traceback" not in said
    assert not (tmp_path / "runs").exists()


def test_prices_given_to_the_gateway_directly_are_checked_too() -> None:
    for bad in (True, float("inf"), 1e308, -0.5):
        with pytest.raises(ValueError, match="price for 'm', `output`"):
            PriceTable({"m": {"input": 1.0, "output": bad}})
    assert PriceTable({"m": {"input": "2.5", "output": 1e-1}}).lookup("m") is not None  # YAML's 1e-1 is a string
