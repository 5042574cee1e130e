"""Wire formats shared by the gateway, the runner, the trainer and the CLI: rollouts, model calls, rewards.

Defined once here; everything that writes or reads the run store goes through these models.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

# A reward is a score from 0 (wrong) to 1 (right), partial credit between: accuracy is their mean, shown as a
# percentage with an interval that assumes that range, and a pass is a reward at or above a threshold within it.
MIN_REWARD, MAX_REWARD = 0.0, 1.0


def check_reward(value: object) -> float:
    """A reward as a float, or ValueError quoting the value: a finite number from MIN_REWARD to MAX_REWARD."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"the score is {_quote(value)}, not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"the score is {value}, not a finite number")
    if not MIN_REWARD <= value <= MAX_REWARD:  # exact for integers of any size, which float() would overflow on
        raise ValueError(
            f"the score is {_quote(value)}, outside the accepted range {MIN_REWARD:g} to {MAX_REWARD:g} (1 is right, "
            "0 wrong, partial credit between): scale a score of another range, e.g. points / max_points"
        )
    return float(value)


def _quote(value: object, limit: int = 60) -> str:
    try:
        text = repr(value)
    except ValueError:  # Python refuses to write out integers of more than 4300 digits
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"  # type: ignore[attr-defined]
    return text if len(text) <= limit else f"{text[: limit - 20]}...{text[-12:]} ({len(text)} characters)"


class RolloutStatus(str, Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    timed_out = "timed_out"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RolloutStatus.succeeded, RolloutStatus.failed, RolloutStatus.timed_out)


class RewardSource(str, Enum):
    grader = "grader"
    agent = "agent"
    none = "none"


class FailureKind(str, Enum):
    """Why a rollout has no reward: the failure breakdown of reports groups by these."""

    agent_crashed = "agent_crashed"
    agent_timeout = "agent_timeout"
    no_output = "no_output"
    grader_crashed = "grader_crashed"
    grader_garbage = "grader_garbage"
    no_reward_reported = "no_reward_reported"
    budget_exhausted = "budget_exhausted"
    interrupted = "interrupted"
    infra = "infra"


class Api(str, Enum):
    openai_chat = "openai.chat"
    openai_responses = "openai.responses"
    openai_completions = "openai.completions"
    anthropic_messages = "anthropic.messages"


class Rollout(BaseModel):
    """One attempt of one (variant, task, seed). `key` names the triple; `id` names the attempt."""

    id: str
    key: str
    variant: str
    task_id: str
    split: str | None = None
    seed: int = 0
    attempt: int = 1
    status: RolloutStatus = RolloutStatus.queued
    reward: float | None = None
    reward_source: RewardSource = RewardSource.none
    grader_detail: dict[str, Any] | None = None
    failure: FailureKind | None = None
    error: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    stdout_tail: str | None = None
    stderr_tail: str | None = None
    output: str | None = None

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


class RouteKind(str, Enum):
    """How the gateway chose the model of a call."""

    named = "named"  # the agent asked for upstream/model
    knob = "knob"  # the variant's `model` knob overrode the agent's name
    default = "default"  # the agent's name matched no upstream: the default model served it


class AgentProcess(BaseModel):
    """A running agent process as a run records it, so that a resume after agl was killed can end what is left.

    `pid` leads the process group `pgid`; `start_ticks` (its start time, in clock ticks since boot) tells it from a
    later process that reused the pid; `tag` is an environment entry its descendants inherit wherever they go (a new
    process group or session), so they can be found and checked as this rollout's; `owner_pid` is the agl process
    that started it (with its own start time), so a live run's agents are never taken for leftovers."""

    rollout_id: str
    pid: int
    pgid: int
    start_ticks: int | None = None
    command: str
    tag: str
    owner_pid: int
    owner_start_ticks: int | None = None
    started_at: float = Field(default_factory=time.time)


class CallRecord(BaseModel):
    """One model call as the gateway saw it, whatever API it came in on.

    `request_model` is the name the agent asked for; `upstream` and `model` are where the gateway sent the call and
    the name it sent; `served_model` is the name the upstream's answer reported (a dated snapshot, or whatever a
    server that ignores the name has loaded); `route` says why that model was chosen."""

    call_id: str
    rollout_id: str | None = None
    api: Api
    upstream: str
    request_model: str | None = None
    model: str | None = None
    served_model: str | None = None
    route: RouteKind | None = None
    request: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] | None = None
    stream: bool = False
    status_code: int | None = None
    error: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost_usd: float | None = None
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    model_version: str | None = None
    knobs_applied: dict[str, Any] = Field(default_factory=dict)

    def otel_attributes(self) -> dict[str, Any]:
        """The call as OpenTelemetry GenAI semantic-convention attributes."""
        system, operation = self.api.value.split(".", 1)
        attrs: dict[str, Any] = {
            "gen_ai.system": system,
            "gen_ai.operation.name": "chat" if operation in ("chat", "messages", "responses") else "text_completion",
            "gen_ai.request.model": self.request_model,
            "gen_ai.response.model": self.served_model or self.model,
            "gen_ai.usage.input_tokens": self.input_tokens,
            "gen_ai.usage.output_tokens": self.output_tokens,
            "agl.rollout.id": self.rollout_id,
            "agl.upstream": self.upstream,
            "agl.stream": self.stream,
            "agl.cost_usd": self.cost_usd,
            "agl.latency_s": self.latency_s,
            "agl.ttft_s": self.ttft_s,
            "agl.model_version": self.model_version,
        }
        for name in ("temperature", "top_p", "max_tokens"):
            if name in self.request:
                attrs[f"gen_ai.request.{name}"] = self.request[name]
        return {k: v for k, v in attrs.items() if v is not None}


@dataclass(frozen=True)
class CallTotals:
    """What the calls of one rollout (or of several, added up) used. A call without a price (`cost_usd` NULL) makes
    the cost unknown: `cost_usd` is then None, never the sum of the priced calls alone."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    priced_usd: float = 0.0  # the sum over the calls that have a price
    unpriced_calls: int = 0

    @property
    def cost_usd(self) -> float | None:
        return None if self.unpriced_calls else self.priced_usd

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: CallTotals) -> CallTotals:
        return CallTotals(
            self.calls + other.calls, self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens,
            self.priced_usd + other.priced_usd, self.unpriced_calls + other.unpriced_calls,
        )

    @classmethod
    def total(cls, parts: Iterable[CallTotals]) -> CallTotals:
        result = cls()
        for part in parts:
            result = result + part
        return result


@dataclass(frozen=True)
class ModelUse:
    """Calls of one rollout grouped by what the agent asked for and what served it."""

    requested: str | None  # the agent's model name
    served: str  # upstream/model the gateway sent the call to
    route: RouteKind | None  # None for calls recorded before agl kept it
    reported: str | None  # the name the upstream's answer gave, when it gave one
    calls: int

    @property
    def fell_back(self) -> bool:
        """The agent asked for a model by a name that matched no upstream, and the default model, under another
        name, answered instead."""
        if self.route != RouteKind.default or not self.requested:
            return False
        return self.requested not in (self.served, self.served.partition("/")[2])
