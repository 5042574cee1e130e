"""Wire formats shared by the gateway, the runner, the trainer and the CLI: rollouts, model calls, rewards.

Defined once here; everything that writes or reads the run store goes through these models.
"""

from __future__ import annotations

import math
import time
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

# Rewards are bounded so that sums, squares and intervals over thousands of them stay finite.
MAX_ABS_REWARD = 1e6


def check_reward(value: object) -> float:
    """A reward as a float, or ValueError quoting the value: a number, finite, and within +-MAX_ABS_REWARD."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"the score is {_quote(value)}, not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"the score is {value}, not a finite number")
    if abs(value) > MAX_ABS_REWARD:  # exact for integers of any size, which float() would overflow on
        raise ValueError(f"the score is {_quote(value)}, outside the accepted range -{MAX_ABS_REWARD:g} to {MAX_ABS_REWARD:g}")
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
    """One model call as the gateway saw it, whatever API it came in on."""

    call_id: str
    rollout_id: str | None = None
    api: Api
    upstream: str
    request_model: str | None = None
    model: str | None = None
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
            "gen_ai.response.model": self.model,
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
