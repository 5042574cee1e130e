"""The gateway's spend ceiling: a call is admitted only when the budget can pay its worst case.

Launch checks (the study's ledger, the eval runner) stop starting rollouts at the budget, but rollouts already
running keep calling the model; this is what makes the budget a ceiling. Before a call goes upstream it reserves its
worst case (`WorstCase`): its `max_tokens` (or `STATED_OUTPUT_CAP` when it sets none) at the model's output price,
plus its prompt at the dearest input price, counted as one token per byte of the request (a token is never shorter
than a byte) and `IMAGE_TOKENS` per image or file. The reservation is held while the call runs and settled when it
ends: the call's cost is charged and the rest released. A call whose cost cannot be known (the upstream answered,
then its usage never came, or came impossible) is charged its whole reservation.

So the spend of finished calls plus the reservations in flight never exceeds the budget. A call that does not fit
waits while other calls' reservations are in flight (they usually release most of theirs); one that would not fit
even with nothing in flight is refused with HTTP 402, code `budget_exhausted` (no SDK retries a 402), saying what
is left; it is recorded with that error, and its rollout is remembered so the runner reports it as stopped by the
budget, never as a wrong answer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

REFUSAL_CODE = "budget_exhausted"
REFUSAL_STATUS = 402
# Output tokens reserved for a call that sets no max_tokens (max_completion_tokens, max_output_tokens). Such a call
# can in principle write more; agl.yaml's `max_tokens` knob, or max_tokens in the agent, makes the reservation exact.
STATED_OUTPUT_CAP = 32_768
# Input tokens reserved per image, file or audio part of a request, whatever its size there (a URL is short; the
# image behind it is not). The largest images the hosted APIs take cost about 1,600 to 2,500 tokens.
IMAGE_TOKENS = 3_000
_MEDIA_TYPES = frozenset({"image_url", "input_image", "image", "file", "input_file", "document", "input_audio"})
# Where each upstream API takes the answer's token limit (the first one set wins).
_LIMIT_FIELDS = {
    "/chat/completions": ("max_completion_tokens", "max_tokens"),
    "/completions": ("max_tokens",),
    "/responses": ("max_output_tokens",),
    "/v1/messages": ("max_tokens",),
}


@dataclass(frozen=True)
class WorstCase:
    """The most one call can cost: what it reserves against the budget."""

    input_tokens: int  # the prompt's tokens, estimated from above
    output_tokens: int  # max_tokens times the answers asked for (or the stated cap)
    stated_cap: bool  # the request set no max_tokens: STATED_OUTPUT_CAP was assumed
    usd: float

    def describe(self) -> str:
        limit = f"the stated cap of {STATED_OUTPUT_CAP:,}" if self.stated_cap else "its max_tokens"
        return (f"up to ${self.usd:.4f} (at most {self.output_tokens:,} output tokens, {limit}, and about "
                f"{self.input_tokens:,} input tokens)")


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _media_parts(value: Any, depth: int = 0) -> int:
    """Image, file and audio parts anywhere in a request body (bounded depth: bodies were parsed with a limit)."""
    if depth > 64:
        return 0
    if isinstance(value, dict):
        kind = value.get("type")  # a JSON schema in a tool may say "type": ["string", "null"]
        own = 1 if isinstance(kind, str) and kind in _MEDIA_TYPES else 0
        return own + sum(_media_parts(v, depth + 1) for v in value.values() if isinstance(v, dict | list))
    if isinstance(value, list):
        return sum(_media_parts(v, depth + 1) for v in value if isinstance(v, dict | list))
    return 0


def _answers(path: str, body: dict[str, Any]) -> int:
    """How many answers one request makes the upstream write (and bill): n, best_of, a batch of prompts."""
    copies = max(_positive_int(body.get("n")) or 1, _positive_int(body.get("best_of")) or 1)
    prompt = body.get("prompt")
    if path == "/completions" and isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        copies *= len(prompt)  # a list of prompts (strings, or lists of token ids) is a batch
    return copies


def worst_case_tokens(path: str, body: dict[str, Any], body_bytes: int) -> tuple[int, int, bool]:
    """(input tokens, output tokens, stated cap used) at most, for a request `body` of `body_bytes` bytes sent to an
    upstream endpoint `path` (/chat/completions, /completions, /responses, /v1/messages)."""
    input_tokens = body_bytes + IMAGE_TOKENS * _media_parts(body)
    limit = None
    for name in _LIMIT_FIELDS.get(path, ("max_completion_tokens", "max_tokens", "max_output_tokens")):
        limit = _positive_int(body.get(name))
        if limit is not None:
            break
    output = limit if limit is not None else STATED_OUTPUT_CAP
    return input_tokens, output * _answers(path, body), limit is None


class SpendLimit:
    """Spend against a ceiling in USD: reservations of the calls in flight, and what finished calls were charged.

    Used on the gateway's event loop and read from the runner's thread: the lock keeps the totals and the refused
    set consistent for readers on other threads.
    """

    def __init__(self, limit_usd: float, *, spent_usd: float = 0.0, hint: str = "") -> None:
        if limit_usd < 0:
            raise ValueError(f"a budget must be non-negative, got {limit_usd:g}")
        self.limit_usd = limit_usd
        self.spent_usd = spent_usd  # charged by finished calls (and, on a resume, by the run before)
        self.reserved_usd = 0.0  # held by the calls in flight
        self.in_flight = 0  # calls holding a reservation
        self.hint = hint
        self.refused_calls = 0
        self._refused_rollouts: set[str] = set()
        self._lock = threading.Lock()

    def reserve(self, usd: float) -> bool:
        """Hold `usd` for a call if the budget can pay it on top of what is spent and reserved; False if not."""
        with self._lock:
            if self.spent_usd + self.reserved_usd + usd > self.limit_usd:
                return False
            self.reserved_usd += usd
            self.in_flight += 1
            return True

    def fits_alone(self, usd: float) -> bool:
        """Whether `usd` would fit once every call in flight has settled at no cost: if not, waiting cannot help."""
        return self.spent_usd + usd <= self.limit_usd

    def charge(self, cost_usd: float | None) -> None:
        """A call that reserved nothing (a free model's) cost something after all: count it."""
        if cost_usd:
            with self._lock:
                self.spent_usd += cost_usd

    def settle(self, reserved_usd: float, charged_usd: float) -> None:
        """A call that reserved `reserved_usd` ended, costing `charged_usd`: release the one, charge the other."""
        with self._lock:
            self.reserved_usd = max(self.reserved_usd - reserved_usd, 0.0) if self.in_flight > 1 else 0.0
            self.in_flight -= 1
            self.spent_usd += charged_usd

    def refuse(self, rollout_id: str, worst: WorstCase) -> str:
        """Count a call that can never fit, and say why (what is left, what the call could cost, the hint)."""
        with self._lock:
            self.refused_calls += 1
            self._refused_rollouts.add(rollout_id)
            left = max(self.limit_usd - self.spent_usd, 0.0)
        message = (
            f"the budget of ${self.limit_usd:g} has ${left:.4f} left (${self.spent_usd:.4f} spent), and this call "
            f"could cost {worst.describe()}: agl refuses it, so the budget is never passed"
        )
        if worst.stated_cap:
            message += "; a max_tokens on the call would reserve less"
        return message + (f"; {self.hint}" if self.hint else "")

    def was_refused(self, rollout_id: str) -> bool:
        with self._lock:
            return rollout_id in self._refused_rollouts

    def as_dict(self) -> dict[str, float | int]:
        with self._lock:
            return {"limit_usd": self.limit_usd, "spent_usd": self.spent_usd, "reserved_usd": self.reserved_usd,
                    "in_flight": self.in_flight, "refused_calls": self.refused_calls}
