"""Deterministic replies of the fake upstream: text, tokens, token ids and logprobs derived from the request.

The reply to the last user message is `You said: <its text>`, or `X` when that text holds `[[reply:X]]`; with
`[[tool]]` and tools offered, a call of the first tool. Token ids hash the words, so the same request always gets
the same ids, and a test can recompute them.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Any


def token_id(word: str) -> int:
    return zlib.crc32(word.encode()) % 50_000


def text_of(content: Any) -> str:
    """The text of a message content: a string, or a list of parts with text (OpenAI or Anthropic)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif part.get("type") == "tool_result":
                    parts.append(text_of(part.get("content")))
        return " ".join(parts)
    return ""


@dataclass
class Reply:
    tokens: list[str]  # pieces of the text, concatenating to it
    finish: str  # stop | length | tool_calls
    prompt_ids: list[int]
    tool: dict[str, Any] | None = None  # {"id", "name", "arguments"} when the reply is a tool call
    ids: list[int] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    def logprob(self, i: int) -> float:
        return -0.01 * (i + 1)


def make_reply(prompt_texts: list[str], last_user: str, *, tools: list[Any] | None, max_tokens: Any) -> Reply:
    prompt_ids = [token_id(w) for text in prompt_texts for w in text.split()]
    if "[[tool]]" in last_user and tools:
        first = tools[0]
        name = first.get("name") or (first.get("function") or {}).get("name") or "tool"
        arguments = json.dumps({"city": "Paris", "n": len(prompt_ids)})
        pieces = [arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]]
        return Reply(
            tokens=pieces,
            finish="tool_calls",
            prompt_ids=prompt_ids,
            tool={"id": f"call_{len(prompt_ids)}", "name": name, "arguments": arguments},
            ids=[token_id(p) for p in pieces],
        )
    scripted = "[[reply:" in last_user
    text = last_user.split("[[reply:", 1)[1].split("]]", 1)[0] if scripted else f"You said: {last_user}"
    words = text.split(" ")
    tokens = [w + " " for w in words[:-1]] + [words[-1]]
    tokens = [t for t in tokens if t]
    finish = "stop"
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and 0 < max_tokens < len(tokens):
        tokens, finish = tokens[:max_tokens], "length"
    return Reply(tokens=tokens, finish=finish, prompt_ids=prompt_ids, ids=[token_id(t) for t in tokens])


def chat_reply(body: dict[str, Any]) -> Reply:
    messages = body.get("messages") or []
    texts = [f"{m.get('role')}: {text_of(m.get('content'))}" for m in messages if isinstance(m, dict)]
    users = [text_of(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") in ("user", "tool")]
    system = body.get("system")
    if system:  # Anthropic puts the system prompt beside the messages
        texts.insert(0, f"system: {text_of(system)}")
    limit = body.get("max_tokens", body.get("max_completion_tokens", body.get("max_output_tokens")))
    return make_reply(texts, users[-1] if users else "", tools=body.get("tools"), max_tokens=limit)
