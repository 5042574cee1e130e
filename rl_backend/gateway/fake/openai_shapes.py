"""OpenAI-compatible bodies and stream chunks of the fake upstream, vLLM-style when token ids are asked for.

Like vLLM: `return_token_ids` adds `prompt_token_ids` (top level for chat, per choice for completions) and
`token_ids` per choice; like OpenAI: `stream_options.include_usage` adds `"usage": null` to every chunk and a final
usage chunk with no choices.
"""

from __future__ import annotations

from typing import Any

from rl_backend.gateway.fake.replies import Reply, text_of

CREATED = 1_700_000_000


def usage(reply: Reply, cached: int, *, responses: bool = False) -> dict[str, Any]:
    p, c = len(reply.prompt_ids), len(reply.ids)
    inp, out = ("input", "output") if responses else ("prompt", "completion")  # Responses' names, or chat's
    return {
        f"{inp}_tokens": p,
        f"{out}_tokens": c,
        "total_tokens": p + c,
        f"{inp}_tokens_details": {"cached_tokens": cached},
        f"{out}_tokens_details": {"reasoning_tokens": 0},
    }


def _chat_lp(reply: Reply, i: int) -> dict[str, Any]:
    tok = reply.tokens[i]
    return {"token": tok, "logprob": reply.logprob(i), "bytes": list(tok.encode()), "top_logprobs": []}


def chat_completion(body: dict[str, Any], reply: Reply, *, n: int, cached: int, version: str | None) -> dict[str, Any]:
    ids = body.get("return_token_ids") is True
    message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
    if reply.tool:
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": reply.tool["id"],
                "type": "function",
                "function": {"name": reply.tool["name"], "arguments": reply.tool["arguments"]},
            }
        ]
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": reply.finish, "logprobs": None}
    if body.get("logprobs") is True:
        choice["logprobs"] = {"content": [_chat_lp(reply, i) for i in range(len(reply.tokens))]}
    if ids:
        choice["token_ids"] = reply.ids
    data: dict[str, Any] = {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": CREATED,
        "model": body.get("model"),
        "choices": [choice],
        "usage": usage(reply, cached),
    }
    if ids:
        data["prompt_token_ids"] = reply.prompt_ids
    if version:
        data["model_version"] = version
    return data


def chat_chunks(body: dict[str, Any], reply: Reply, *, n: int, cached: int, version: str | None) -> list[dict[str, Any]]:
    ids = body.get("return_token_ids") is True
    lp = body.get("logprobs") is True
    options = body.get("stream_options") or {}
    with_usage = options.get("include_usage") is True
    head = {"id": f"chatcmpl-fake-{n}", "object": "chat.completion.chunk", "created": CREATED, "model": body.get("model")}
    if version:
        head["model_version"] = version

    def chunk(delta: dict[str, Any], finish: str | None = None, i: int | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if i is not None and lp:
            choice["logprobs"] = {"content": [_chat_lp(reply, i)]}
        if i is not None and ids:
            choice["token_ids"] = [reply.ids[i]]
        c = {**head, "choices": [choice]}
        if with_usage:
            c["usage"] = None
        return c

    first = chunk({"role": "assistant", "content": ""})
    if ids:
        first["prompt_token_ids"] = reply.prompt_ids
    chunks = [first]
    if reply.tool:
        tool = reply.tool
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": tool["id"],
                            "type": "function",
                            "function": {"name": tool["name"], "arguments": reply.tokens[0]},
                        }
                    ]
                },
                i=0,
            )
        )
        for i in range(1, len(reply.tokens)):
            chunks.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": reply.tokens[i]}}]}, i=i))
    else:
        chunks += [chunk({"content": tok}, i=i) for i, tok in enumerate(reply.tokens)]
    chunks.append(chunk({}, reply.finish))
    if with_usage:
        chunks.append({**head, "choices": [], "usage": usage(reply, cached)})
    return chunks


def completion_reply_inputs(body: dict[str, Any]) -> tuple[list[str], str]:
    prompt = body.get("prompt")
    text = prompt if isinstance(prompt, str) else " ".join(p for p in prompt or [] if isinstance(p, str))
    return [text], text


def _completion_lp(reply: Reply, idx: list[int]) -> dict[str, Any]:
    return {
        "tokens": [reply.tokens[i] for i in idx],
        "token_logprobs": [reply.logprob(i) for i in idx],
        "top_logprobs": [{} for _ in idx],
        "text_offset": [sum(len(t) for t in reply.tokens[:i]) for i in idx],
    }


def completion(body: dict[str, Any], reply: Reply, *, n: int, cached: int, version: str | None) -> dict[str, Any]:
    ids = body.get("return_token_ids") is True
    choice: dict[str, Any] = {"index": 0, "text": reply.text, "finish_reason": reply.finish, "logprobs": None}
    if isinstance(body.get("logprobs"), int) and not isinstance(body.get("logprobs"), bool):
        choice["logprobs"] = _completion_lp(reply, list(range(len(reply.tokens))))
    if ids:
        choice["prompt_token_ids"] = reply.prompt_ids
        choice["token_ids"] = reply.ids
    data = {
        "id": f"cmpl-fake-{n}",
        "object": "text_completion",
        "created": CREATED,
        "model": body.get("model"),
        "choices": [choice],
        "usage": usage(reply, cached),
    }
    if version:
        data["model_version"] = version
    return data


def completion_chunks(body: dict[str, Any], reply: Reply, *, n: int, cached: int, version: str | None) -> list[dict[str, Any]]:
    ids = body.get("return_token_ids") is True
    lp = isinstance(body.get("logprobs"), int) and not isinstance(body.get("logprobs"), bool)
    with_usage = (body.get("stream_options") or {}).get("include_usage") is True
    head = {"id": f"cmpl-fake-{n}", "object": "text_completion", "created": CREATED, "model": body.get("model")}
    chunks = []
    for i, tok in enumerate(reply.tokens):
        choice: dict[str, Any] = {
            "index": 0,
            "text": tok,
            "logprobs": _completion_lp(reply, [i]) if lp else None,
            "finish_reason": reply.finish if i == len(reply.tokens) - 1 else None,
        }
        if ids:
            choice["token_ids"] = [reply.ids[i]]
            if i == 0:
                choice["prompt_token_ids"] = reply.prompt_ids
        c = {**head, "choices": [choice]}
        if with_usage:
            c["usage"] = None
        chunks.append(c)
    if with_usage:
        chunks.append({**head, "choices": [], "usage": usage(reply, cached)})
    return chunks


def responses_inputs(body: dict[str, Any]) -> tuple[list[str], str]:
    inp = body.get("input")
    if isinstance(inp, str):
        return [str(body.get("instructions") or ""), inp], inp
    texts = [str(body.get("instructions") or "")]
    last = ""
    for item in inp or []:
        if isinstance(item, dict):
            t = text_of(item.get("content"))
            texts.append(t)
            if item.get("role") == "user":
                last = t
    return texts, last


def response_object(body: dict[str, Any], reply: Reply, *, n: int, cached: int, status: str = "completed") -> dict[str, Any]:
    done = status == "completed"
    return {
        "id": f"resp_fake{n}",
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "model": body.get("model"),
        "instructions": body.get("instructions"),
        "output": [
            {
                "type": "message",
                "id": f"msg_fake{n}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        ]
        if done
        else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "usage": usage(reply, cached, responses=True) if done else None,
    }


def response_events(body: dict[str, Any], reply: Reply, *, n: int, cached: int) -> list[tuple[str, dict[str, Any]]]:
    item_id = f"msg_fake{n}"
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": response_object(body, reply, n=n, cached=cached, status="in_progress")}),
        (
            "response.output_item.added",
            {
                "output_index": 0,
                "item": {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []},
            },
        ),
        (
            "response.content_part.added",
            {
                "item_id": item_id,
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
        ),
    ]
    for tok in reply.tokens:
        events.append(
            (
                "response.output_text.delta",
                {"item_id": item_id, "output_index": 0, "content_index": 0, "delta": tok, "logprobs": []},
            )
        )
    events.append(
        (
            "response.output_text.done",
            {"item_id": item_id, "output_index": 0, "content_index": 0, "text": reply.text, "logprobs": []},
        )
    )
    events.append(("response.completed", {"response": response_object(body, reply, n=n, cached=cached)}))
    return [(name, {"type": name, "sequence_number": i, **data}) for i, (name, data) in enumerate(events)]
