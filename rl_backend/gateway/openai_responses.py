"""OpenAI Responses through the gateway: knobs in, events passed on unchanged, the final response recorded.

A Responses stream ends with `response.completed` (or `.incomplete` / `.failed`), whose payload is the whole
response with its usage: that is what the record keeps. Responses servers return no token ids, so none are asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl_backend.gateway.exchange import Exchange, bad_request, check_common, check_fields, usage_from_openai
from rl_backend.gateway.jsonfast import loads
from rl_backend.gateway.routing import Route
from rl_backend.gateway.sse import SSEEvent, encode_json_event
from rl_backend.store.records import Api

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def validate_responses(body: dict[str, Any]) -> None:
    check_common(body)
    if not isinstance(body.get("input"), str | list):
        raise bad_request("`input` must be a string or an array of input items", "input")
    check_fields(body, string=("instructions",), int=("max_output_tokens",), object=("reasoning", "text"),
                 array=("tools",))


class ResponsesExchange(Exchange):
    api = Api.openai_responses
    dialect = "openai"
    path = "/responses"
    asks_token_ids = False
    validate = staticmethod(validate_responses)

    def __init__(self, body: dict[str, Any], route: Route, *, token_ids: bool, knobs: Mapping[str, Any]) -> None:
        super().__init__(body, route, token_ids=token_ids, knobs=knobs)
        self.final: dict[str, Any] | None = None
        self.partial: list[str] = []
        self.last_sequence = 0

    def upstream_body(self) -> dict[str, Any]:
        return dict(self.request_record)

    def _finish(self, response: dict[str, Any]) -> None:
        out = self.outcome
        out.response = response
        out.usage = usage_from_openai(response.get("usage"))
        out.upstream_model = response.get("model") if isinstance(response.get("model"), str) else None
        out.model_version = response.get("model_version") if isinstance(response.get("model_version"), str) else None
        err = response.get("error")
        if isinstance(err, dict) and err.get("message"):
            out.error = str(err["message"])

    def process_response(self, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("object") not in ("response", None) or "output" not in data:
            raise ValueError("the upstream's answer is not a response object")
        self._finish(data)
        return data

    @staticmethod
    def _kind(event: SSEEvent) -> str | None:
        if event.event:
            return event.event
        try:
            data = loads(event.data)
        except ValueError:
            return None
        return data.get("type") if isinstance(data, dict) else None

    def is_terminal(self, event: SSEEvent) -> bool:
        return self._kind(event) in TERMINAL

    def process_event(self, event: SSEEvent) -> list[bytes]:
        data = loads(event.data)
        if not isinstance(data, dict):
            raise ValueError(f"stream event is {type(data).__name__}, not an object")
        kind = data.get("type") or event.event
        if isinstance(data.get("sequence_number"), int):
            self.last_sequence = data["sequence_number"]
        if kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
            if self.keep_limit is None:
                self.partial.append(data["delta"])
            self.output_started = True
        elif isinstance(kind, str) and kind.endswith(".delta"):
            self.output_started = True
        elif kind in TERMINAL and isinstance(data.get("response"), dict):
            usage_from_openai(data["response"].get("usage"))  # usage that cannot be true fails the stream here
            self.final = data["response"]
        elif kind == "error":
            self.outcome.error = str(data.get("message") or data.get("error") or "error event")
        return [event.encode()]

    def stream_complete(self) -> bool:
        return self.final is not None

    def collect(self) -> None:
        if self.final is not None:
            error = self.outcome.error
            final = self.final if self.keep_limit is None else {k: v for k, v in self.final.items() if k != "output"}
            self._finish(final)
            self.outcome.error = self.outcome.error or error
        else:  # cut short: keep the text that did arrive
            self.outcome.response = {"object": "response", "status": "incomplete", "output_text": "".join(self.partial)}

    def error_event(self, message: str) -> bytes:
        # `error` makes the openai SDK raise; the other fields are the Responses API's own error event.
        payload = {
            "type": "error",
            "code": "upstream_error",
            "message": message,
            "param": None,
            "sequence_number": self.last_sequence + 1,
            "error": {"message": message, "type": "api_error"},
        }
        return encode_json_event(payload, "error")
