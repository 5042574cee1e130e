"""OpenAI-shaped response bodies and stream chunks, with vLLM's token-id extensions and `model_version`.

vLLM extensions, present when the request had `"return_token_ids": true`: chat responses carry top-level
`prompt_token_ids` and per-choice `token_ids`; completions carry both per choice. In streams, each chunk's choice
carries the new `token_ids`, and the first chunk carries `prompt_token_ids`. `token_ids` include the stop token
that ended the turn (e.g. `<|im_end|>`), which the text leaves out, as vLLM does.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .detok import TokenText
from .engine import Completion, Delta
from .protocol import Parsed
from .sampling import Choice

# OpenAI reports log-probabilities too small for a float as this; JSON has no -Infinity.
_MIN_LOGPROB = -9999.0


def _lp(x: float) -> float:
    return x if x > _MIN_LOGPROB else _MIN_LOGPROB


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()


@dataclass
class Reply:
    """Builds the bodies for one request: ids and timestamps fixed once, shared by all its chunks."""

    parsed: Parsed
    kind: str  # "chat" or "text"
    tokens: TokenText
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + uuid.uuid4().hex

    # ---- logprobs --------------------------------------------------------------------------------------------

    def _chat_logprobs(self, choices: list[Choice]) -> dict[str, Any]:
        content = []
        for c in choices:
            text, raw = self.tokens.get(c.token_id)
            tops = []
            for tid, lp in c.top:
                t_text, t_raw = self.tokens.get(tid)
                tops.append({"token": t_text, "logprob": _lp(lp), "bytes": t_raw})
            content.append({"token": text, "logprob": _lp(c.logprob), "bytes": raw, "top_logprobs": tops})
        return {"content": content, "refusal": None}

    def _text_logprobs(self, choices: list[Choice], offset: int) -> dict[str, Any]:
        tokens, lps, tops, offsets = [], [], [], []
        for c in choices:
            text, _ = self.tokens.get(c.token_id)
            tokens.append(text)
            lps.append(_lp(c.logprob))
            tops.append({self.tokens.get(t)[0]: _lp(lp) for t, lp in c.top} if self.parsed.params.top_logprobs else None)
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def _usage(self, completion_tokens: int) -> dict[str, int]:
        prompt = len(self.parsed.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}

    def _head(self, chunk: bool) -> dict[str, Any]:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {
            "id": self.id,
            "object": obj + (".chunk" if chunk and self.kind == "chat" else ""),
            "created": self.created,
            "model": self.parsed.model,
            "system_fingerprint": None,
        }

    # ---- whole responses -------------------------------------------------------------------------------------

    def full(self, out: Completion) -> dict[str, Any]:
        p = self.parsed
        choice: dict[str, Any] = {"index": 0, "finish_reason": out.finish_reason}
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": out.text, "refusal": None, "tool_calls": None}
            choice["logprobs"] = self._chat_logprobs(out.logprobs) if p.logprobs else None
        else:
            choice["text"] = out.text
            choice["logprobs"] = self._text_logprobs(out.logprobs, 0) if p.logprobs else None
        body = self._head(chunk=False)
        if p.return_token_ids:
            choice["token_ids"] = out.token_ids
            if self.kind == "chat":
                body["prompt_token_ids"] = p.prompt_ids
            else:
                choice["prompt_token_ids"] = p.prompt_ids
        body["choices"] = [choice]
        body["usage"] = self._usage(len(out.token_ids))
        body["model_version"] = out.model_version
        return body

    # ---- stream chunks ---------------------------------------------------------------------------------------

    def first_chunk(self, model_version: str) -> dict[str, Any] | None:
        """The chat stream's opening chunk (the assistant role); completions streams have none."""
        if self.kind != "chat":
            return None
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        body = self._head(chunk=True)
        if self.parsed.return_token_ids:
            body["prompt_token_ids"] = self.parsed.prompt_ids
            choice["token_ids"] = []
        body["choices"] = [choice]
        body["model_version"] = model_version
        if self.parsed.include_usage:
            body["usage"] = None
        return body

    def chunk(self, d: Delta, first: bool, text_offset: int) -> dict[str, Any]:
        p = self.parsed
        choice: dict[str, Any] = {"index": 0}
        if self.kind == "chat":
            choice["delta"] = {"content": d.text}
            choice["logprobs"] = self._chat_logprobs(d.logprobs) if p.logprobs else None
        else:
            choice["text"] = d.text
            choice["logprobs"] = self._text_logprobs(d.logprobs, text_offset) if p.logprobs else None
        choice["finish_reason"] = d.finish_reason
        body = self._head(chunk=True)
        if p.return_token_ids:
            choice["token_ids"] = d.token_ids
            if first and self.kind != "chat":
                choice["prompt_token_ids"] = p.prompt_ids
        body["choices"] = [choice]
        body["model_version"] = d.model_version
        if p.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, completion_tokens: int, model_version: str) -> dict[str, Any]:
        body = self._head(chunk=True)
        body["choices"] = []
        body["usage"] = self._usage(completion_tokens)
        body["model_version"] = model_version
        return body
