"""OpenAI (legacy) Completions through the gateway; token ids and logprobs asked for and recorded like chat.

vLLM puts `prompt_token_ids` and `token_ids` on each choice of a completion (the first stream chunk of a choice
carries the prompt ids), and logprobs as `{tokens, token_logprobs, top_logprobs, text_offset}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl_backend.gateway.exchange import bad_request, check_common, check_fields, int_list, usage_from_openai
from rl_backend.gateway.openai_chat import OpenAIExchange, ask_upstream, read_answer
from rl_backend.gateway.routing import Route
from rl_backend.store.records import Api


def validate_completions(body: dict[str, Any]) -> None:
    check_common(body)
    prompt = body.get("prompt")
    ok = isinstance(prompt, str) or (
        isinstance(prompt, list)
        and bool(prompt)
        and (
            all(isinstance(p, str) for p in prompt)
            or all(isinstance(p, int) and not isinstance(p, bool) for p in prompt)
            or all(isinstance(p, list) for p in prompt)
        )
    )
    if not ok:
        raise bad_request("`prompt` must be a string, an array of strings, or token ids", "prompt")
    check_fields(body, int=("max_tokens", "n", "logprobs", "seed", "best_of"), bool=("echo", "return_token_ids"),
                 object=("stream_options",))


def _token_logprobs(choice: Mapping[str, Any]) -> list[float] | None:
    lp = choice.get("logprobs")
    values = lp.get("token_logprobs") if isinstance(lp, dict) else None
    if not isinstance(values, list):
        return None
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


class CompletionsExchange(OpenAIExchange):
    api = Api.openai_completions
    path = "/completions"
    validate = staticmethod(validate_completions)

    def __init__(self, body: dict[str, Any], route: Route, *, token_ids: bool, knobs: Mapping[str, Any]) -> None:
        super().__init__(body, route, token_ids=token_ids, knobs=knobs)
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.keep = True  # False once the stream outgrew what the record keeps
        self.model_version: str | None = None

    @staticmethod
    def asks_logprobs(body: dict[str, Any]) -> bool:
        return body.get("logprobs") is not None

    def upstream_body(self) -> dict[str, Any]:
        # 1, not 0: a server that tests `if logprobs:` would read 0 as "no logprobs".
        return ask_upstream(dict(self.request_record), stream=self.stream, token_ids=self.token_ids,
                            logprobs=None if self.want_logprobs else 1)

    def process_response(self, data: Any) -> Any:
        first = read_answer(data, self.outcome, "text_completion")
        self.outcome.prompt_token_ids = int_list(first.get("prompt_token_ids"))
        self.outcome.logprobs = _token_logprobs(first)
        return self._finish_response(data)

    def _fold(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "created", "model"):
            if chunk.get(key) is not None and key not in self.head:
                self.head[key] = chunk[key]
        if chunk.get("usage") is not None:
            usage_from_openai(chunk["usage"])  # usage that cannot be true fails the stream here, before it is kept
            self.usage = chunk["usage"]
        if isinstance(chunk.get("model_version"), str):
            self.model_version = chunk["model_version"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            state = self.choices.setdefault(
                int(choice.get("index") or 0),
                {"text": [], "finish": None, "tokens": [], "lps": [], "ids": [], "prompt_ids": None},
            )
            if choice.get("finish_reason"):
                state["finish"] = choice["finish_reason"]
            if not self.keep:
                continue
            if isinstance(choice.get("text"), str) and choice["text"]:
                state["text"].append(choice["text"])
                self.output_started = True
            lp = choice.get("logprobs")
            if isinstance(lp, dict):
                state["tokens"].extend(lp.get("tokens") or [])
                state["lps"].extend(_token_logprobs(choice) or [])
            state["ids"].extend(int_list(choice.get("token_ids")) or [])
            if state["prompt_ids"] is None:
                state["prompt_ids"] = int_list(choice.get("prompt_token_ids"))

    def _stop_keeping(self) -> None:
        self.keep = False

    def collect(self) -> None:
        out = self.outcome
        choices = []
        for index in sorted(self.choices):
            state = self.choices[index]
            logprobs = {"tokens": state["tokens"], "token_logprobs": state["lps"]} if self.want_logprobs else None
            choices.append(
                {"index": index, "text": "".join(state["text"]), "finish_reason": state["finish"], "logprobs": logprobs}
            )
        out.response = {**self.head, "object": "text_completion", "choices": choices, "usage": self.usage}
        out.usage = usage_from_openai(self.usage)
        out.upstream_model = self.head.get("model")
        out.model_version = self.model_version
        first = self.choices.get(0)
        if first is not None:
            out.prompt_token_ids = first["prompt_ids"]
            out.completion_token_ids = first["ids"] or None
            out.logprobs = first["lps"] or None
