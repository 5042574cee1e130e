"""A cluster's gateway restarted mid-train (an eviction, a node upgrade, an OOM kill) carries on: the trainer
registered the policy's servers once, every running agent holds the token it was given, and the trainer may have
paused the gateway for an update. A real `agl gateway serve --in-cluster` is killed with SIGKILL and started again
on the same store and port (the Service's address does not change): the rollouts' tokens still work, the calls
still reach the policy's servers, and the pause holds until the trainer resumes it."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from rl_backend.gateway.fake.procs import Proc, register, spawn_fast_fake, spawn_serve
from rl_backend.gateway.remote import RemoteGateway
from rl_backend.store.db import RunStore
from rl_backend.store.gateway_state import state_path
from tests.helpers import GATEWAY_SERVE

pytestmark = pytest.mark.timeout(120)
ADMIN = "admin-token-for-the-restart-test"
ASK: Any = {"model": "anything", "messages": [{"role": "user", "content": "hi"}]}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_gateway_killed_and_restarted_mid_train_keeps_tokens_policy_servers_and_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({
        "name": "gw", "upstreams": {"local": {"kind": "embedded", "model": "smollm2-135m-instruct"}},
        "model": "local/smollm2-135m-instruct"}))
    store, port = tmp_path / "store.sqlite", _free_port()
    args = [str(tmp_path), "--store", str(store), "--in-cluster", "--host", "127.0.0.1"]

    def start() -> Proc:
        # spawn_serve adds `--port 0`; the later --port wins, as the Service keeps pointing at one port
        return spawn_serve(GATEWAY_SERVE, [*args, "--port", str(port)], admin_token=ADMIN)

    fake = spawn_fast_fake()  # the policy's server (vLLM-style answers)
    gw = start()
    try:
        trainer = RemoteGateway(gw.url, ADMIN)
        trainer.set_endpoints("local", [fake.url], model="policy-7b")
        reg = register(gw.url, ADMIN, "r1", {"temperature": 0.5})
        register(gw.url, ADMIN, "r2")
        trainer.unregister_rollout("r2")  # ended before the restart: its token must stay dead
        agent: Any = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["token"], max_retries=0, timeout=10)
        assert agent.chat.completions.create(**ASK).choices[0].message.content
        trainer.pause()  # the trainer updates the policy...
        gw.kill()  # ...and the gateway's pod is evicted meanwhile
        gw = start()
        assert trainer.state()["paused"] is True  # a call now would reach servers that are asleep
        with pytest.raises(openai.RateLimitError):
            agent.chat.completions.create(**ASK)
        trainer.resume(model_version="step-3")
        reply = agent.chat.completions.create(**ASK)  # the agent's token, from before the restart
        assert reply.choices[0].message.content
        assert register(gw.url, ADMIN, "r1", {"temperature": 0.5})["token"] == reg["token"]  # a retried register
        stale: Any = openai.OpenAI(base_url=f"{gw.url}/rollouts/r2/openai/v1", api_key="agl-not-it", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            stale.chat.completions.create(**ASK)
        trainer.close()
        assert gw.stop() == 0
    finally:
        gw.kill()
        fake.kill()
    assert stat.S_IMODE(os.stat(state_path(store)).st_mode) == 0o600  # it holds tokens
    db = RunStore(store)
    try:
        calls = [c for c in db.calls() if c.error is None]
    finally:
        db.close()
    assert [(c.rollout_id, c.upstream, c.model, c.model_version) for c in calls][-1] == ("r1", "local", "policy-7b",
                                                                                         "step-3")
