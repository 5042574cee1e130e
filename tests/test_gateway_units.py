"""Gateway building blocks without servers: SSE decoding, prices, knobs, routing, retries, the writer, translation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from rl_backend.gateway.anthropic_translate import chat_to_message, messages_to_chat
from rl_backend.gateway.config import ResolvedUpstream
from rl_backend.gateway.errors import GatewayError
from rl_backend.gateway.knobs import apply_knobs, validate_knobs
from rl_backend.gateway.pricing import PriceTable, Usage, upstream_is_free
from rl_backend.gateway.routing import Router, replica_index
from rl_backend.gateway.sse import SSEDecoder, encode_event
from rl_backend.gateway.upstream import retry_after_s
from rl_backend.gateway.writer import RecordWriter
from rl_backend.store.db import RunStore
from rl_backend.store.records import Api, CallRecord


def test_sse_decoder_handles_split_chunks_crlf_comments_and_multiline_data() -> None:
    raw = b": keep-alive\r\n\r\nevent: ping\r\ndata: {}\r\n\r\ndata: line1\ndata: line2\n\ndata: [DONE]"
    decoder = SSEDecoder()
    events = []
    for i in range(len(raw)):  # one byte at a time: events must still come out whole
        events += decoder.feed(raw[i : i + 1])
    events += decoder.flush()
    assert [(e.event, e.data) for e in events] == [("ping", "{}"), (None, "line1\nline2"), (None, "[DONE]")]
    assert encode_event("a\nb", "x") == b"event: x\ndata: a\ndata: b\n\n"


def test_price_lookup_and_cost() -> None:
    table = PriceTable({"gpt-4o": {"input": 1.0, "output": 2.0}})
    assert table.lookup("gpt-4o-2024-08-06") == table.lookup("gpt-4o")
    assert table.lookup("gpt-4o-mini-2024-07-18") == table.lookup("gpt-4o-mini") != table.lookup("gpt-4o")
    assert table.lookup("o3-mini") != table.lookup("o3") and table.lookup("gpt-4oops") is None
    usage = Usage(input_tokens=1000, output_tokens=100, cached_tokens=200)
    paid = ResolvedUpstream(name="openai", api="openai", base_urls=["https://api.openai.com/v1"])
    assert table.cost(paid, ["gpt-4o"], usage) == pytest.approx((1000 * 1.0 + 100 * 2.0) / 1e6)
    mini = (800 * 0.15 + 200 * 0.075 + 100 * 0.6) / 1e6
    assert table.cost(paid, ["nope", "gpt-4o-mini"], usage) == pytest.approx(mini)
    assert table.cost(paid, ["unknown"], usage) is None
    assert table.cost(paid.model_copy(update={"free": True}), ["unknown"], usage) == 0.0
    with pytest.raises(ValueError, match="needs `input` and `output`"):
        PriceTable({"x": {"input": 1.0}})


def test_declared_prices_by_upstream_and_model_beat_the_loopback_rule() -> None:
    """agl.yaml's `prices:` keyed by upstream/model (or model) win over the shipped table and over the rule that a
    loopback upstream is free; only `free: true` beats a declared price. An unpriced model on a paid upstream costs
    None (unknown), never 0."""
    table = PriceTable({"triage/small-1": {"input": 0.1, "output": 0.4},
                        "large-1": {"input": 2.0, "cached_input": 0.5, "output": 8.0},
                        "triage/gpt-4o": {"input": 9.0, "output": 9.0}})
    local = ResolvedUpstream(name="triage", api="openai", base_urls=["http://127.0.0.1:9/v1"])
    other = local.model_copy(update={"name": "other"})
    usage = Usage(input_tokens=1000, output_tokens=100, cached_tokens=200)
    assert table.cost(local, ["small-1"], usage) == pytest.approx((1000 * 0.1 + 100 * 0.4) / 1e6)
    assert table.cost(local, ["large-1"], usage) == pytest.approx((800 * 2.0 + 200 * 0.5 + 100 * 8.0) / 1e6)
    assert table.cost(local, ["gpt-4o"], usage) == pytest.approx((1000 * 9.0 + 100 * 9.0) / 1e6)
    # the upstream/model key is for that upstream only; elsewhere the loopback rule (free) still holds
    assert table.cost(other, ["small-1"], usage) == 0.0 and table.knows(other, "small-1")
    # an upstream with prices declared for it is a paid one: its undeclared models have an unknown cost, not $0
    assert table.cost(local, ["tiny-3"], usage) is None and not table.knows(local, "tiny-3")
    assert table.cost(local.model_copy(update={"free": True}), ["large-1"], usage) == 0.0
    unpriced = other.model_copy(update={"free": False})
    assert table.cost(unpriced, ["tiny-3"], usage) is None and not table.knows(unpriced, "tiny-3")
    assert table.knows(unpriced, "large-1") and table.cost(other, ["tiny-3"], usage) == 0.0


def test_which_upstreams_are_free() -> None:
    def up(urls: list[str], **kw: Any) -> ResolvedUpstream:
        return ResolvedUpstream(name="u", api="openai", base_urls=urls, **kw)

    assert upstream_is_free(up(["http://127.0.0.1:8000/v1"]))
    assert upstream_is_free(up(["http://localhost:8000/v1", "http://[::1]:9/v1"]))
    assert not upstream_is_free(up(["https://api.openai.com/v1"]))
    assert upstream_is_free(up(["http://10.0.0.5:8000/v1"], returns_token_ids=True))
    assert not upstream_is_free(up(["http://127.0.0.1:8000/v1"], free=False))


def test_knob_validation_and_application() -> None:
    assert validate_knobs({"temperature": 0, "model": None, "system_prompt": "Hi"}) == {
        "temperature": 0,
        "system_prompt": {"text": "Hi", "mode": "replace"},
    }
    for bad in ({"max_tokens": 0}, {"top_p": float("nan")}, {"model": "gpt-4o"}, {"system_prompt": {"mode": "x"}}):
        with pytest.raises(ValueError):
            validate_knobs(bad)
    body: dict[str, Any] = {"input": [{"role": "system", "content": "old"}, {"role": "user", "content": "q"}]}
    applied = apply_knobs(Api.openai_responses, body, validate_knobs({"system_prompt": "new", "reasoning_effort": "high"}))
    assert body["instructions"] == "new" and body["input"] == [{"role": "user", "content": "q"}]
    assert body["reasoning"] == {"effort": "high"} and set(applied) == {"system_prompt", "reasoning_effort"}
    msg: dict[str, Any] = {"system": [{"type": "text", "text": "old"}]}
    applied = apply_knobs(
        Api.anthropic_messages, msg,
        validate_knobs({"system_prompt": {"text": "new", "mode": "prepend"}, "reasoning_effort": "low"}),
    )
    assert msg["system"] == [{"type": "text", "text": "new"}, {"type": "text", "text": "old"}]
    assert applied["reasoning_effort"] == "low" and applied["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_router_rules_and_replica_hash() -> None:
    ups = {"a": ResolvedUpstream(name="a", api="openai", base_urls=["http://x/v1", "http://y/v1", "http://z/v1"])}
    router = Router(ups, "a/m")
    assert router.resolve("a/q", None, "r").model == "q"
    assert router.resolve("gpt-4o", None, "r").model == "m"
    assert router.resolve("gpt-4o", "a/k", "r").model == "k"
    assert {replica_index(f"r{i}", 3) for i in range(60)} == {0, 1, 2}
    assert replica_index("same", 3) == replica_index("same", 3)
    with pytest.raises(ValueError, match="names no upstream"):
        Router(ups, "b/m")
    with pytest.raises(GatewayError, match="no default model"):
        Router(ups, None).resolve("gpt-4o", None, "r")


def test_retry_after_forms() -> None:
    def resp(headers: dict[str, str]) -> httpx.Response:
        return httpx.Response(429, headers=headers)

    assert retry_after_s(resp({"retry-after": "3"})) == 3.0
    assert retry_after_s(resp({"retry-after-ms": "250", "retry-after": "3"})) == 0.25
    assert retry_after_s(resp({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
    assert retry_after_s(resp({"retry-after": "soon"})) is None
    assert retry_after_s(resp({})) is None


def _record(i: int) -> CallRecord:
    return CallRecord(call_id=f"c{i}", rollout_id="r", api=Api.openai_chat, upstream="u")


def test_writer_batches_awaits_and_flushes(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s.sqlite")
    writer = RecordWriter(store)

    async def main() -> int:
        await asyncio.gather(*(writer.write(_record(i)) for i in range(50)))
        count = store.count_calls()  # every awaited write is committed
        await writer.write(_record(0))  # a repeated call id is ignored, not an error
        return count + await writer.call(lambda s: s.count_calls())

    assert asyncio.run(main()) == 100
    for i in range(50, 80):
        writer.submit(_record(i))
    assert writer.flush(5)
    assert store.count_calls() == 80
    writer.close()
    store.close()


def test_messages_to_chat_orders_tool_results_first_and_keeps_images() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 9,
        "system": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}],
        "stop_sequences": ["END"],
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm"},
                    {"type": "text", "text": "a"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "see"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "boom"}],
                        "is_error": True,
                    },
                ],
            },
        ],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    }
    chat = messages_to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "S1\nS2"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "a",
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"x": 1})}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "Error: boom"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
            ],
        },
    ]
    assert (chat["stop"], chat["max_tokens"], chat["parallel_tool_calls"]) == (["END"], 9, False)
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}


def test_chat_to_message_maps_stops_and_bad_tool_arguments() -> None:
    data = {
        "id": "c1",
        "choices": [
            {
                "message": {"content": "x", "tool_calls": [{"id": "t", "function": {"name": "f", "arguments": "{oops"}}]},
                "finish_reason": "stop",
                "stop_reason": "END",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}},
    }
    msg = chat_to_message(data, "m", ["END"])
    assert (msg["stop_reason"], msg["stop_sequence"], msg["id"]) == ("stop_sequence", "END", "msg_c1")
    assert msg["content"][1] == {"type": "tool_use", "id": "t", "name": "f", "input": "{oops"}
    assert msg["usage"] == {
        "input_tokens": 6,
        "output_tokens": 3,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
    }


def test_writer_commits_a_lone_call_inline_and_queues_while_the_store_is_locked(tmp_path: Path) -> None:
    import sqlite3

    store = RunStore(tmp_path / "s.sqlite")
    writer = RecordWriter(store)

    async def main() -> tuple[int, bool, int]:
        await writer.write(_record(1), alone=True)  # committed right here: no writer thread needed
        inline_visible = store.count_calls()
        blocker = sqlite3.connect(tmp_path / "s.sqlite", timeout=5)
        blocker.execute("BEGIN IMMEDIATE")  # another process writing: the inline path must not wait on the loop
        task = asyncio.ensure_future(writer.write(_record(2), alone=True))
        await asyncio.sleep(0.2)
        waited = not task.done()
        blocker.rollback()
        blocker.close()
        await task  # the writer thread commits it once the lock is free
        return inline_visible, waited, store.count_calls()

    assert asyncio.run(main()) == (1, True, 2)
    assert writer.written == 2
    writer.close()
    store.close()


def test_rows_redact_secrets_echoed_into_requests_responses_and_errors() -> None:
    from rl_backend.store.codec import encode_call

    secret = 'sk-"odd"-secret'
    record = CallRecord(
        call_id="c", api=Api.openai_chat, upstream="u", request={"messages": [{"content": f"my key is {secret}"}]},
        response={"echo": secret}, error=f"upstream_http_401: bad key {secret}",
    )
    row = " ".join(str(v) for v in encode_call(record, (secret, "")))
    assert "odd" not in row and row.count("[redacted]") == 3


def test_reasoning_effort_maps_to_an_anthropic_thinking_budget() -> None:
    def apply_anthropic_messages(body: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
        return apply_knobs(Api.anthropic_messages, body, knobs)

    body = {"model": "claude", "max_tokens": 500, "temperature": 0.2, "messages": [{"role": "user", "content": "hi"}]}
    applied = apply_anthropic_messages(body, {"reasoning_effort": "medium"})
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert body["max_tokens"] == 4096 + 500  # the answer keeps the room the agent asked for
    assert body["temperature"] == 1  # the API allows thinking only at temperature 1
    assert applied["reasoning_effort"] == "medium" and applied["thinking"]["budget_tokens"] == 4096
    off: dict = {"model": "claude", "max_tokens": 100, "messages": []}
    assert apply_anthropic_messages(off, {"reasoning_effort": "minimal"})["thinking"] == {"type": "disabled"}
    unknown: dict = {"model": "claude", "max_tokens": 100, "messages": []}
    assert apply_anthropic_messages(unknown, {"reasoning_effort": "turbo"}) == {} and "thinking" not in unknown
