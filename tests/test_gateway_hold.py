"""A training pause with `hold_s`: new calls wait for the resume instead of getting a 429 the agent's SDK might give
up on; past the hold they get the 429 + Retry-After; the GatewayGate of the async loop drains and counts them."""

from __future__ import annotations

import threading
import time
from typing import Any

import openai
import pytest

from agl_cli.training.async_job import GatewayGate
from rl_backend.gateway.fake.harness import Harness

MSGS: Any = [{"role": "user", "content": "hello there"}]


def test_held_call_waits_for_the_resume_and_is_served_by_the_new_version(h: Harness) -> None:
    client = h.openai("r1")  # max_retries=0: a 429 would fail it
    gate = GatewayGate(h.gateway, hold_s=10, drain_timeout_s=5)
    pause = gate.pause()
    assert pause["drained"] and h.gateway.state.paused
    done: list[float] = []
    worker = threading.Thread(target=lambda: (client.chat.completions.create(model="x", messages=MSGS),
                                              done.append(time.monotonic())))
    worker.start()
    time.sleep(0.4)
    assert not done and h.gateway.in_flight == 0  # held before admission: a drain does not wait for it
    resumed_at = time.monotonic()
    resumed = gate.resume("step-1")
    worker.join(5)
    assert done and done[0] >= resumed_at
    assert resumed["calls_held"] == 1 and resumed["paused_s"] >= 0.4
    (record,) = h.calls("r1")
    assert record.model_version == "step-1" and record.error is None


def test_hold_expires_into_429_and_no_hold_refuses_at_once(h: Harness) -> None:
    client = h.openai("r2")
    h.gateway.pause(hold_s=0.3)
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError, match="paused") as err:
        client.chat.completions.create(model="x", messages=MSGS)
    assert time.monotonic() - started >= 0.3 and err.value.response.headers["retry-after"] == "2"
    h.gateway.pause()
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="x", messages=MSGS)
    assert time.monotonic() - started < 0.3
    h.gateway.resume()
    client.chat.completions.create(model="x", messages=MSGS)


def test_gate_waits_for_calls_in_flight(h: Harness) -> None:
    client = h.openai("r3")
    h.fake.fail("slow", delay_s=0.5)
    worker = threading.Thread(target=lambda: client.chat.completions.create(model="x", messages=MSGS))
    worker.start()
    deadline = time.monotonic() + 5
    while h.gateway.in_flight == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    pause = GatewayGate(h.gateway, drain_timeout_s=5).pause()
    assert pause == {**pause, "drained": True, "in_flight_at_pause": 1} and h.gateway.in_flight == 0
    worker.join(5)
    h.gateway.resume()
