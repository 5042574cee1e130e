"""A stand-in for a hosted provider with two models, `small-1` and `large-1`, that triage support tickets: an
OpenAI-compatible Chat Completions server on loopback whose answers depend on which model is asked, what the system
prompt says and what the ticket says — as a real provider's would — and on nothing agl knows.

How its "models" answer (deterministic, so a test can count on the outcome):

- a ticket states what the customer needs (a sentence with a word of its label: billing, account_access, shipping)
  and, in a tricky ticket, mentions another topic in passing ("The delivery itself was fine.");
- a plain ticket is labelled right by both models;
- a tricky ticket fools a model with a chance set per model and per prompt: the prompt that says to ignore topics
  mentioned in passing (`PASSING_RULE` in its text) helps the large model much more than the small one. Whether a
  given ticket fools a given model is decided by the ticket's own text (a hash: its "difficulty"), the same for
  every model, so a stronger configuration errs on a subset of a weaker one's tickets, as models tend to;
- usage counts words as tokens (prompt: every message; completion: the reply), so the prices in agl.yaml give the
  large model's calls 20 times the small model's cost and a longer prompt a higher one.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rl_backend.gateway.fake.openai_shapes import chat_completion
from rl_backend.gateway.fake.replies import Reply, text_of, token_id
from rl_backend.httpserver import ServerThread

KEY = "sk-triage-stand-in"
LABELS = {"billing": ("invoice", "charged", "refund"), "account_access": ("password", "log in", "locked out"),
          "shipping": ("parcel", "delivery", "tracking")}  # the words a model reads a ticket's need from
PASSING_RULE = "mentioned in passing"
BASIC_PROMPT = "Label the support ticket as billing, account_access or shipping. Answer with the label only."
CAREFUL_PROMPT = (BASIC_PROMPT + " Label it by what the customer needs done; ignore topics " + PASSING_RULE
                  + ", such as a delivery that was fine or an invoice that is not the problem.")
# Chance that a tricky ticket fools (model, prompt follows the rule): the rule helps the large model far more.
FOOLED = {("small-1", False): 0.8, ("small-1", True): 0.6, ("large-1", False): 0.65, ("large-1", True): 0.0}
NEEDS = {"billing": "I was {w} twice for order {n} and need the money back.",
         "account_access": "I cannot get in: my {w} stopped working on the app for account {n}.",
         "shipping": "My {w} for order {n} has not moved in a week."}
PASSING = {"billing": "The invoice itself looks right.", "account_access": "Logging in works fine otherwise.",
           "shipping": "The delivery itself was fine."}
KEYWORDS = {"billing": "charged", "account_access": "password", "shipping": "parcel"}


def make_tickets(n: int, *, seed: int, tricky_share: float = 0.7) -> list[dict[str, Any]]:
    """`n` tickets with their true label; a `tricky_share` of them also mention another topic in passing."""
    rng = random.Random(seed)
    tickets = []
    for i in range(n):
        label = rng.choice(sorted(LABELS))
        text = NEEDS[label].format(w=KEYWORDS[label], n=rng.randint(1000, 9999))
        if rng.random() < tricky_share:
            decoy = rng.choice([other for other in sorted(LABELS) if other != label])
            text += " " + PASSING[decoy]
        tickets.append({"ticket": text, "label": label, "i": i})
    return tickets


def _difficulty(ticket: str) -> float:
    return int.from_bytes(hashlib.sha256(ticket.encode()).digest()[:8], "big") / 2**64


def answer(model: str, system: str, ticket: str) -> str:
    """What the stand-in `model` answers to one ticket under one system prompt."""
    first = ticket.split(".")[0]
    need = next(label for label, words in LABELS.items() if any(w in first for w in words))
    decoy = next((label for label, sentence in PASSING.items() if sentence in ticket), None)
    careful = PASSING_RULE in system
    if decoy is not None and _difficulty(ticket) < FOOLED[(model, careful)]:
        return decoy
    return need


class TriageProvider:
    """The stand-in on a loopback port; `requests` keeps (model, system prompt) of every call it answered."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.server: ServerThread | None = None

    async def _chat(self, request: Request) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {KEY}":
            return JSONResponse({"error": {"message": "bad key", "type": "authentication_error"}}, 401)
        body = json.loads(await request.body())
        model = body.get("model")
        if model not in ("small-1", "large-1"):
            return JSONResponse({"error": {"message": f"The model `{model}` does not exist", "type":
                                           "invalid_request_error", "code": "model_not_found"}}, 404)
        messages = body.get("messages") or []
        system = " ".join(text_of(m.get("content")) for m in messages if m.get("role") == "system")
        ticket = text_of(next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), ""))
        self.requests.append((model, system))
        label = answer(model, system, ticket)
        prompt_words = [w for m in messages for w in text_of(m.get("content")).split()]
        reply = Reply(tokens=[label], finish="stop", prompt_ids=[token_id(w) for w in prompt_words],
                      ids=[token_id(label)])
        return JSONResponse(chat_completion(body, reply, n=len(self.requests), cached=0, version=f"{model}-2025-01-01"))

    def start(self) -> TriageProvider:
        app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])
        self.server = ServerThread(app).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    @property
    def base_url(self) -> str:
        assert self.server is not None, "start() the provider first"
        return self.server.base_url + "/v1"
