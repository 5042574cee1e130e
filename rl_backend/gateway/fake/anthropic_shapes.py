"""Anthropic Messages bodies and stream events of the fake upstream."""

from __future__ import annotations

import json
from typing import Any

from rl_backend.gateway.fake.replies import Reply

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _usage(reply: Reply, cached: int) -> dict[str, Any]:
    return {
        "input_tokens": len(reply.prompt_ids) - cached,
        "output_tokens": len(reply.ids),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def message(body: dict[str, Any], reply: Reply, *, n: int, cached: int) -> dict[str, Any]:
    if reply.tool:
        content = [
            {"type": "tool_use", "id": f"toolu_{n}", "name": reply.tool["name"], "input": json.loads(reply.tool["arguments"])}
        ]
    else:
        content = [{"type": "text", "text": reply.text}]
    return {
        "id": f"msg_fake{n}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": content,
        "stop_reason": _STOP[reply.finish],
        "stop_sequence": None,
        "usage": _usage(reply, cached),
    }


def message_events(body: dict[str, Any], reply: Reply, *, n: int, cached: int) -> list[tuple[str, dict[str, Any]]]:
    start = message(body, reply, n=n, cached=cached)
    start.update(content=[], stop_reason=None, usage={**start["usage"], "output_tokens": 1})
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": start}), ("ping", {})]
    if reply.tool:
        block = {"type": "tool_use", "id": f"toolu_{n}", "name": reply.tool["name"], "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": t} for t in reply.tokens]
    else:
        block = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": t} for t in reply.tokens]
    events.append(("content_block_start", {"index": 0, "content_block": block}))
    events += [("content_block_delta", {"index": 0, "delta": d}) for d in deltas]
    events.append(("content_block_stop", {"index": 0}))
    events.append(
        (
            "message_delta",
            {"delta": {"stop_reason": _STOP[reply.finish], "stop_sequence": None}, "usage": {"output_tokens": len(reply.ids)}},
        )
    )
    events.append(("message_stop", {}))
    return [(name, {"type": name, **data}) for name, data in events]
