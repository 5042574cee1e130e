"""Which adapter serves a call: the API the agent spoke and the API its routed upstream speaks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rl_backend.gateway.anthropic_messages import MessagesExchange
from rl_backend.gateway.exchange import Exchange
from rl_backend.gateway.messages_via_chat import MessagesViaChatExchange
from rl_backend.gateway.openai_chat import ChatExchange, bad_route
from rl_backend.gateway.openai_completions import CompletionsExchange
from rl_backend.gateway.openai_responses import ResponsesExchange
from rl_backend.gateway.routing import Route

_OPENAI_ONLY: dict[str, Callable[..., Exchange]] = {
    "chat": ChatExchange, "completions": CompletionsExchange, "responses": ResponsesExchange,
}


def build_exchange(kind: str, body: dict[str, Any], route: Route, *, token_ids: bool, knobs: Mapping[str, Any]) -> Exchange:
    """Raises GatewayError (400) when the request is malformed or cannot go to that upstream."""
    anthropic_upstream = route.upstream.api == "anthropic"
    if kind == "messages":
        cls: type[Any] = MessagesExchange if anthropic_upstream else MessagesViaChatExchange
        exchange: Exchange = cls(body, route, token_ids=token_ids, knobs=knobs)
        return exchange
    if kind not in _OPENAI_ONLY:
        raise ValueError(f"unknown API kind {kind!r}")
    if anthropic_upstream:
        raise bad_route(f"openai.{kind}", route)
    exchange = _OPENAI_ONLY[kind](body, route, token_ids=token_ids, knobs=knobs)
    return exchange
