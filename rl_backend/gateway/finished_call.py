"""The CallRecord of one finished (or failed) call, from what its exchange collected and how it ended."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rl_backend.gateway.exchange import Exchange
from rl_backend.gateway.oversize import TRUNCATED, truncation_note
from rl_backend.gateway.pricing import PriceTable
from rl_backend.store.records import CallRecord


@dataclass
class Ending:
    """How the call went, as the proxy saw it."""

    call_id: str
    rollout_id: str
    request_model: str | None
    started_at: float  # time.time() at arrival
    t0: float  # the same instant on perf_counter
    status: int | None
    error: str | None
    failure_body: dict[str, Any] | None
    ttft_s: float | None
    model_version: str | None  # the gateway's current one, for upstreams that report none
    answered: bool = False  # the upstream began a 2xx answer (so it may have billed, whatever usage says)
    received_bytes: int = 0  # of the answer's body, as the upstream sent it


def build_record(ex: Exchange, end: Ending, prices: PriceTable) -> CallRecord:
    if ex.stream:
        ex.collect()
    out = ex.outcome
    if ex.keep_limit is not None:  # the answer outgrew what a record keeps: say so, and keep no partial token ids
        out.response = {**(out.response or {}), TRUNCATED: truncation_note(ex.keep_limit, end.received_bytes)}
        out.completion_token_ids = out.logprobs = None
    error = end.error
    if out.error and not error:
        error = f"upstream_error_event: {out.error}"
    usage = out.usage
    if usage.input_tokens is None and end.status is not None and end.status >= 400 and not end.answered:
        cost: float | None = 0.0  # refused, or never answered: not billed
    else:  # None (unknown) when the upstream answered but its usage never came, or came impossible
        cost = prices.cost(ex.route.upstream, [ex.route.model, out.upstream_model], usage)
    # Every value below already has its field's type: skip pydantic's validation on the hot path.
    return CallRecord.model_construct(
        call_id=end.call_id,
        rollout_id=end.rollout_id,
        api=ex.api,
        upstream=ex.route.upstream.name,
        request_model=end.request_model,
        model=ex.route.model,
        served_model=out.upstream_model,
        route=ex.route.kind,
        request=ex.request_record,
        response=out.response if out.response is not None else end.failure_body,
        stream=ex.stream,
        status_code=end.status,
        error=error,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=usage.cached_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        cost_usd=cost,
        started_at=end.started_at,
        ended_at=time.time(),
        latency_s=time.perf_counter() - end.t0,
        ttft_s=end.ttft_s,
        prompt_token_ids=out.prompt_token_ids,
        completion_token_ids=out.completion_token_ids,
        logprobs=out.logprobs,
        model_version=out.model_version or end.model_version,
        knobs_applied=ex.knobs_applied,
    )
