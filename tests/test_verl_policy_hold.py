"""The policy's calls are held at the gateway while verl's rollout servers sleep for an update.

verl's sync loop puts the vLLM replicas to sleep before the update (level 2 discards their weights) and wakes them
with the new weights in `update_weights`: a call that reached a server in between would be answered by no weights at
all. `VerlTrainer` pauses the gateway (the collocated-async loop's GatewayGate: calls in flight finish, new ones wait)
before the servers sleep and resumes it once the new weights are synced, so a late call waits and is served, and
recorded, by the new weights. Here the gateway and the agent's SDK are real; the replicas are a scripted upstream
that fails every call while "asleep" (verl's CheckpointEngineManager cannot run without verl's Ray workers; the
vLLM tier, tests/test_verl_vllm_cpu.py, runs the real one).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from agl_cli.training.async_job import GatewayGate
from rl_backend.gateway.fake.harness import Harness
from rl_backend.trainer.verl_backend.config import VerlSettings
from rl_backend.trainer.verl_backend.trainer import VerlTrainer, VerlWeightSink

MSGS: Any = [{"role": "user", "content": "hello there"}]


class Replicas:
    """The part of verl's CheckpointEngineManager the trainer drives: asleep, the server fails every call."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.asleep = False
        self.requests_while_asleep = 0
        self._seen = 0

    def sleep_replicas(self) -> None:
        self.asleep = True
        self._seen = len(self.h.fake.requests)
        self.h.fake.fail("status", times=1000, status=503)  # what a server without weights could at best say

    def update_weights(self, global_steps: int | None = None) -> None:
        self.requests_while_asleep += len(self.h.fake.requests) - self._seen
        self.h.fake.reset()
        self.asleep = False


def _wait_for(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_call_during_the_update_waits_for_the_new_weights_and_is_recorded_with_them(h: Harness) -> None:
    replicas = Replicas(h)
    trainer = VerlTrainer(None, VerlSettings(spec_name="t", model_path="m"), log_fn=lambda _: None,
                          gate=GatewayGate(h.gateway, hold_s=30, drain_timeout_s=5))
    trainer._ppo = SimpleNamespace(checkpoint_manager=replicas)
    sink = VerlWeightSink(trainer, on_version=h.gateway.set_model_version)
    client = h.openai("late")  # max_retries=0: a refusal would fail the call
    client.chat.completions.create(model="x", messages=MSGS)  # before the update: served by step-0

    trainer.sleep_replicas()  # what train_step does first
    results: list[Any] = []
    late = threading.Thread(target=lambda: results.append(client.chat.completions.create(model="x", messages=MSGS)))
    late.start()
    _wait_for(lambda: h.gateway.calls_held == 1, "the late call to be held")
    assert replicas.asleep and not results

    trainer.step = 1  # the update made
    sink.load_state_dict({}, "step-1")  # the sync loop serves the new weights: verl's update_weights, then resume
    late.join(10)
    assert results and results[0].choices[0].message.content
    assert replicas.requests_while_asleep == 0 and not h.gateway.state.paused
    first, second = h.calls("late")
    assert (first.model_version, second.model_version) == ("step-0", "step-1")
    assert second.error is None and second.status_code == 200


def test_without_a_gateway_the_trainer_only_sleeps_and_syncs(h: Harness) -> None:
    replicas = Replicas(h)
    trainer = VerlTrainer(None, VerlSettings(spec_name="t", model_path="m"), log_fn=lambda _: None)
    trainer._ppo = SimpleNamespace(checkpoint_manager=replicas)
    trainer.sleep_replicas()
    assert replicas.asleep and not h.gateway.state.paused
    trainer.sync_weights()
    assert not replicas.asleep
