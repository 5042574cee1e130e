"""Replay: serve recorded upstream responses back for the same requests, so an agent on a hosted API runs offline.

A recording is JSONL, one line per upstream response (written by `replay_recorder.py` when an upstream has `record_to:`):

    {"key": "<sha256>", "api": "openai.chat", "model": "gpt-5-mini", "match": {...}, "preview": "...",
     "status": 200, "headers": {"x-request-id": "..."}, "response": {...}}      # or "sse": "<raw event stream>"

`key` is a canonical hash of what decides the answer: the API, the model, the conversation (messages / input /
prompt), the system prompt, the tools, and the generation parameters in `PARAMS`. Fields that do not change the
answer (`user`, `metadata`, `store`, `stream_options`, ...) are left out, and JSON key order and spacing never
matter. The same request recorded several times (seeds at temperature > 0) is served in recorded order, cycling.

A request with no recording is answered 404 with a message that names the API, model and key, and says how the
closest recording differs (which message, tool list or parameter) — never with a made-up answer.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

# Path suffix -> API; longest first (".../chat/completions" also ends in "completions").
_APIS = (
    ("/chat/completions", "openai.chat"),
    ("/responses", "openai.responses"),
    ("/completions", "openai.completions"),
    ("/messages", "anthropic.messages"),
)
# Generation parameters that change the answer; everything else in a request body is ignored by the key.
PARAMS = (
    "frequency_penalty", "logit_bias", "logprobs", "max_completion_tokens", "max_output_tokens", "max_tokens", "n",
    "parallel_tool_calls", "presence_penalty", "reasoning", "reasoning_effort", "response_format", "return_token_ids",
    "seed", "stop", "stop_sequences", "stream", "temperature", "text", "thinking", "tool_choice", "top_k",
    "top_logprobs", "top_p", "verbosity",
)
MISS_STATUS = 404


def api_of_path(path: str) -> str | None:
    """'openai.chat' for a path ending in /chat/completions, and so on; None for an unknown endpoint."""
    for suffix, api in _APIS:
        if path.rstrip("/").endswith(suffix):
            return api
    return None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode()).hexdigest()


def request_parts(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """What decides the answer, split in parts so a miss can say which part differs."""
    conversation = body.get("messages", body.get("input", body.get("prompt")))
    if not isinstance(conversation, list):
        conversation = [] if conversation is None else [conversation]
    return {
        "api": api,
        "model": body.get("model"),
        "system": body.get("system", body.get("instructions")),
        "tools": body.get("tools", body.get("functions")),
        "params": {name: body[name] for name in PARAMS if body.get(name) is not None},
        "messages": conversation,
    }


def request_key(api: str, body: dict[str, Any]) -> str:
    """The canonical hash a recording is looked up by."""
    return _digest(request_parts(api, body))


def match_info(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """The compact fingerprint stored beside a recorded response: short hashes per part, per message."""
    parts = request_parts(api, body)
    return {
        "system": _digest(parts["system"])[:12],
        "tools": _digest(parts["tools"])[:12],
        "params": parts["params"],
        "messages": [_digest(m)[:12] for m in parts["messages"]],
    }


def preview(body: dict[str, Any], limit: int = 160) -> str:
    """The last message of a request as one short line of text, for people reading a recording or an error."""
    parts = request_parts("", body)
    if not parts["messages"]:
        return ""
    last = parts["messages"][-1]
    if isinstance(last, dict):
        role = last.get("role") or last.get("type") or "?"
        content = last.get("content")
        if isinstance(content, list):
            bits = []
            for block in content:
                if isinstance(block, dict) and block.get("type") in ("tool_result", "function_call_output"):
                    bits.append(f"[{block['type']}] {block.get('content') or block.get('output') or ''}")
                elif isinstance(block, dict):
                    bits.append(str(block.get("text") or block.get("content") or block.get("type") or ""))
            content = " ".join(bits)
        elif content is None and last.get("tool_calls"):
            content = "tool calls: " + ", ".join(
                str((c.get("function") or {}).get("name")) for c in last["tool_calls"] if isinstance(c, dict)
            )
        text = f"{role}: {content}"
    else:
        text = str(last)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Entry:
    key: str
    api: str
    model: str | None
    match: dict[str, Any]
    preview: str
    status: int
    headers: dict[str, str]
    response: Any = None
    sse: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> Entry:
        missing = [k for k in ("key", "api") if not isinstance(data.get(k), str)]
        if missing or ("response" not in data and not isinstance(data.get("sse"), str)):
            raise ValueError(f"{where}: a recording line needs `key`, `api` and `response` or `sse`")
        return cls(
            key=data["key"], api=data["api"], model=data.get("model"), match=data.get("match") or {},
            preview=str(data.get("preview") or ""), status=int(data.get("status") or 200),
            headers=dict(data.get("headers") or {}), response=data.get("response"), sse=data.get("sse"),
        )


@dataclass
class Recording:
    path: Path
    entries: dict[str, list[Entry]] = field(default_factory=dict)
    count: int = 0

    @classmethod
    def load(cls, path: Path | str) -> Recording:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"replay recording {path} does not exist: record one with `record_to: {path.name}` on a live upstream"
            )
        entries: dict[str, list[Entry]] = defaultdict(list)
        count = 0
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: not a JSON line: {exc}") from None
                entry = Entry.from_json(data, f"{path}:{number}")
                entries[entry.key].append(entry)
                count += 1
        return cls(path, dict(entries), count)

    def all(self) -> list[Entry]:
        return [e for group in self.entries.values() for e in group]

    def explain_miss(self, api: str, body: dict[str, Any], key: str) -> str:
        """Why a request has no recording: what it asked, and how the closest recorded request differs."""
        model = body.get("model")
        wanted = match_info(api, body)
        head = (
            f"replay: no recorded response for this request in {self.path} ({self.count} recordings). "
            f"Request: api={api} model={model!r} key={key[:16]} last message: {preview(body)!r}. "
        )
        same_api = [e for e in self.all() if e.api == api]
        if not same_api:
            return head + f"The recording holds no {api} calls at all. " + _RERECORD

        def shared_prefix(entry: Entry) -> int:
            recorded = entry.match.get("messages") or []
            n = 0
            for a, b in zip(wanted["messages"], recorded, strict=False):
                if a != b:
                    break
                n += 1
            return n

        def closeness(entry: Entry) -> tuple[int, int, int, int, int]:
            return (
                int(entry.model == model), shared_prefix(entry), int(entry.match.get("system") == wanted["system"]),
                int(entry.match.get("tools") == wanted["tools"]), int(entry.match.get("params") == wanted["params"]),
            )

        best = max(same_api, key=closeness)
        diffs = []
        if best.model != model:
            models = sorted({str(e.model) for e in same_api})
            diffs.append(f"model {model!r} was never recorded (recorded: {', '.join(models[:8])})")
        n, want_n = shared_prefix(best), len(wanted["messages"])
        recorded_n = len(best.match.get("messages") or [])
        first = request_parts(api, body)["messages"][:1]
        if n == 0 and first and isinstance(first[0], dict) and first[0].get("role") in ("system", "developer"):
            # OpenAI chat keeps the system prompt in messages[0]: is it the only difference?
            rest = wanted["messages"][1:]
            for entry in same_api:
                recorded = (entry.match.get("messages") or [])[1:]
                if entry.model == model and rest and recorded[: len(rest)] == rest:
                    return head + (
                        f"Closest recording (key {entry.key[:16]}, {entry.preview!r}): the system prompt (message 1) "
                        "differs; the rest of the conversation was recorded. " + _RERECORD
                    )
        if n == 0 and want_n:
            return head + (
                "No recorded request starts with this request's first message: this conversation was never recorded "
                "(a task, document or prompt outside the recording?). " + _RERECORD
            )
        if n < want_n:
            diffs.append(f"messages: the first {n} of {want_n} match a recording; message {n + 1} differs")
        elif want_n != recorded_n:
            diffs.append(f"messages: this request has {want_n}, the closest recording {recorded_n}")
        if best.match.get("system") != wanted["system"]:
            diffs.append("the system prompt differs")
        if best.match.get("tools") != wanted["tools"]:
            diffs.append("the tool definitions differ")
        recorded_params = best.match.get("params") or {}
        for name in sorted(set(recorded_params) | set(wanted["params"])):
            if recorded_params.get(name) != wanted["params"].get(name):
                diffs.append(
                    f"parameter {name}: {wanted['params'].get(name)!r} here, {recorded_params.get(name)!r} recorded"
                )
        detail = "; ".join(diffs) or "the request differs in a part the fingerprint does not show"
        return head + f"Closest recording (key {best.key[:16]}, {best.preview!r}): {detail}. " + _RERECORD


_RERECORD = (
    "Replay serves only what was recorded; record this request by running against the live upstream with "
    "`record_to:` set on it."
)


class ReplayUpstream:
    """An OpenAI- and Anthropic-compatible upstream (an ASGI app, served in-process) that answers from a Recording."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.served = 0
        self.misses: list[str] = []
        self._next: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    @property
    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self._serve, methods=["POST"])])

    def lookup(self, api: str, body: dict[str, Any]) -> tuple[str, Entry | None]:
        key = request_key(api, body)
        group = self.recording.entries.get(key)
        if not group:
            return key, None
        with self._lock:
            index = self._next[key]
            self._next[key] = index + 1
            self.served += 1
        return key, group[index % len(group)]

    async def _serve(self, request: Request) -> Response:
        path = request.url.path
        api = api_of_path(path)
        anthropic = api == "anthropic.messages"
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        if api is None or not isinstance(body, dict):
            what = f"no API is served at {path!r}" if api is None else "the request body is not a JSON object"
            return _error(400, f"replay: {what}", anthropic)
        key, entry = self.lookup(api, body)
        if entry is None:
            message = self.recording.explain_miss(api, body, key)
            with self._lock:
                self.misses.append(message)
            return _error(MISS_STATUS, message, anthropic, code="replay_miss")
        if entry.sse is not None:
            return Response(entry.sse, entry.status, headers=entry.headers, media_type="text/event-stream")
        return JSONResponse(entry.response, entry.status, headers=entry.headers)


def _error(status: int, message: str, anthropic: bool, code: str | None = None) -> JSONResponse:
    if anthropic:
        return JSONResponse({"type": "error", "error": {"type": "not_found_error", "message": message}}, status)
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}, status)
