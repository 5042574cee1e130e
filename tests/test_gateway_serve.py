"""`agl gateway serve` as a real process: rollouts registered over HTTP, calls through the openai SDK, refusals,
an agl.yaml as config, and a kill -9 under load that loses no call an agent got an answer to."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from rl_backend.gateway.fake.procs import Proc, register, spawn_fast_fake, spawn_gateway, spawn_serve
from rl_backend.store.db import RunStore
from tests.helpers import GATEWAY_SERVE

ADMIN = "admin-secret-for-tests"
MSGS: Any = [{"role": "user", "content": "hello there"}]


def _calls(path: Path) -> list[Any]:
    store = RunStore(path)
    try:
        return store.calls()
    finally:
        store.close()


@pytest.fixture(scope="module")
def fake() -> Iterator[Proc]:
    proc = spawn_fast_fake()
    yield proc
    proc.kill()


def test_serve_registers_rollouts_over_http_and_records_sdk_calls(fake: Proc, tmp_path: Path) -> None:
    store = tmp_path / "gw.sqlite"
    gw = spawn_gateway(GATEWAY_SERVE, fake.url, store, admin_token=ADMIN)
    try:
        assert gw.info["store"] == str(store.resolve()) and gw.info["upstreams"] == ["local"]
        assert "admin_token" not in gw.info  # given through the environment, never echoed
        admin = {"authorization": f"Bearer {ADMIN}"}
        assert httpx.post(f"{gw.url}/admin/rollouts", json={"rollout_id": "r1"}).status_code == 401
        bad = httpx.post(f"{gw.url}/admin/rollouts", json={"rollout_id": "r1", "knobs": {"colour": 1}}, headers=admin)
        assert bad.status_code == 400 and "unknown gateway knob" in bad.json()["error"]["message"]
        reg = register(gw.url, ADMIN, "r1", {"temperature": 0.25})
        assert reg["openai_base_url"] == f"{gw.url}/rollouts/r1/openai/v1"
        # Registering again is idempotent (a controller retrying gets the same token); other knobs are a conflict.
        assert register(gw.url, ADMIN, "r1", {"temperature": 0.25})["token"] == reg["token"]
        again = httpx.post(f"{gw.url}/admin/rollouts", json={"rollout_id": "r1", "knobs": {"temperature": 1}}, headers=admin)
        assert again.status_code == 409

        client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["token"], max_retries=0)
        raw = client.chat.completions.with_raw_response.create(model="x", messages=MSGS)
        whole = raw.parse()
        call_id = raw.headers["x-agl-call-id"]
        stream = client.chat.completions.create(model="x", messages=MSGS, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert whole.choices[0].message.content == text == "You said: hello there"

        gone = httpx.delete(f"{gw.url}/admin/rollouts/r1", headers=admin)
        assert gone.status_code == 200
        with pytest.raises(openai.AuthenticationError, match="valid while the rollout runs"):
            client.chat.completions.create(model="x", messages=MSGS)
        assert httpx.delete(f"{gw.url}/admin/rollouts/r1", headers=admin).status_code == 404
        state = httpx.get(f"{gw.url}/admin/state", headers=admin).json()
        assert (state["calls_recorded"], state["rollouts"]) == (2, 0)
    finally:
        assert gw.stop() == 0  # SIGTERM: a clean stop
    recs = _calls(store)
    assert [r.stream for r in recs] == [False, True] and recs[0].call_id == call_id
    assert all(r.request["temperature"] == 0.25 and r.status_code == 200 for r in recs)
    assert recs[0].completion_token_ids  # --token-ids: the fake answered vLLM-style


def test_serve_refuses_wide_binds_without_an_admin_token_and_bad_flags(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from agl_cli.main import app

    monkeypatch.delenv("AGL_GATEWAY_ADMIN_TOKEN", raising=False)
    monkeypatch.setenv("POD_IP", "not-an-address")
    monkeypatch.chdir(tmp_path)
    up = ["--upstream", "local=openai-compatible:http://127.0.0.1:9/v1", "--store", str(tmp_path / "s.sqlite")]
    cases = [
        (["--in-cluster"], "without an admin token"),
        (["--host", "0.0.0.0"], "without an admin token"),
        (["--in-cluster", "--admin-token", "t"], "cannot tell this pod's address"),
        (["--request-timeout", "0"], "--request-timeout must be"),
        (["--port", "70000"], "--port must be"),
        (["--token-ids", "other"], "name upstreams that do not exist"),
    ]
    runner = CliRunner()
    for extra, needle in cases:
        result = runner.invoke(app, ["gateway", "serve", *up, *extra])
        assert result.exit_code == 2 and needle in result.output, result.output
    result = runner.invoke(app, ["gateway", "serve", "--upstream", "local=ftp:x"])
    assert result.exit_code == 2 and "name=kind:url" in result.output
    result = runner.invoke(app, ["gateway", "serve"])
    assert result.exit_code == 2 and "no upstreams" in result.output
    assert not (tmp_path / "s.sqlite").exists()  # refused before anything was created


def test_serve_reads_upstreams_from_agl_yaml_and_generates_a_loopback_admin_token(fake: Proc, tmp_path: Path) -> None:
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({
        "name": "gw-only",
        "upstreams": {"vllm": {"kind": "openai-compatible", "base_url": fake.url, "model": "tiny"}},
        "model": "vllm/tiny",
    }))
    gw = spawn_serve(GATEWAY_SERVE, [str(tmp_path), "--store", str(tmp_path / "s.sqlite")])
    try:
        assert gw.info["default_model"] == "vllm/tiny" and gw.info["upstreams"] == ["vllm"]
        token = gw.info["admin_token"]  # none given on loopback: one was made and shown once
        reg = register(gw.url, token, "y1")
        reply = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["token"], max_retries=0).chat.completions.create(
            model="whatever", messages=MSGS
        )
        assert reply.model == "tiny"
    finally:
        gw.stop()



def _one_call(gw: Proc, rollout_id: str) -> Any:
    reg = register(gw.url, gw.info["admin_token"], rollout_id)
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["token"], max_retries=0)
    return client.chat.completions.create(model="house-model", messages=MSGS).model_dump()


def test_serve_sets_upstreams_up_as_eval_does_record_free_and_replay(fake: Proc, tmp_path: Path) -> None:
    """The one resolver: `record_to:` keeps the answers, `free: false` leaves an unpriced call's cost unknown (never
    $0), the only upstream takes names that match none, and `kind: replay` serves the recording back."""
    live = {"kind": "openai-compatible", "base_url": fake.url, "record_to": "recordings/rec.jsonl", "free": False}
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({"upstreams": {"hosted": live}}))
    gw = spawn_serve(GATEWAY_SERVE, [str(tmp_path / "agl.yaml"), "--store", str(tmp_path / "live.sqlite")])
    try:
        assert gw.info["default_model"] == "hosted"
        answered = _one_call(gw, "rec1")
    finally:
        assert gw.stop() == 0
    recording = tmp_path / "recordings" / "rec.jsonl"  # relative to agl.yaml's folder
    assert [json.loads(line)["model"] for line in recording.read_text().splitlines()] == ["house-model"]
    (call,) = _calls(tmp_path / "live.sqlite")
    assert (call.status_code, call.model, call.cost_usd) == (200, "house-model", None)

    replay = {"kind": "replay", "path": "recordings/rec.jsonl"}
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({"upstreams": {"hosted": replay}}))
    gw = spawn_serve(GATEWAY_SERVE, [str(tmp_path / "agl.yaml"), "--store", str(tmp_path / "replay.sqlite")])
    try:
        assert _one_call(gw, "rep1") == answered
    finally:
        assert gw.stop() == 0
    (call,) = _calls(tmp_path / "replay.sqlite")
    assert call.status_code == 200 and call.upstream == "hosted" and call.cost_usd is None

def test_kill_9_under_load_loses_no_answered_call(fake: Proc, tmp_path: Path) -> None:
    store = tmp_path / "gw.sqlite"
    gw = spawn_gateway(GATEWAY_SERVE, fake.url, store, admin_token=ADMIN)
    regs = [register(gw.url, ADMIN, f"k{i}") for i in range(8)]
    answered: list[str] = []  # response ids the agents received in full
    failures: list[str] = []
    stop = threading.Event()

    async def agents() -> None:
        clients = [openai.AsyncOpenAI(base_url=r["openai_base_url"], api_key=r["token"], max_retries=0, timeout=10)
                   for r in regs]

        async def agent(i: int) -> None:
            client, n = clients[i % len(clients)], 0
            while not stop.is_set():
                n += 1
                msgs = [{"role": "user", "content": f"agent {i} call {n}"}]
                try:
                    if n % 2:
                        chunks = [c async for c in await client.chat.completions.create(model="x", messages=msgs, stream=True)]
                        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).endswith(f"call {n}")
                        answered.append(chunks[0].id)
                    else:
                        answered.append((await client.chat.completions.create(model="x", messages=msgs)).id)
                except Exception as exc:  # noqa: BLE001 - the kill breaks calls in every way; counted, checked below
                    failures.append(type(exc).__name__)
                    await asyncio.sleep(0.01)

        try:
            await asyncio.gather(*(agent(i) for i in range(16)))
        finally:
            for c in clients:
                await c.close()

    worker = threading.Thread(target=lambda: asyncio.run(agents()))
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while len(answered) < 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        # Another process holds the store's write lock when the gateway dies, so records pile up uncommitted: a
        # gateway that answered before committing would lose every call it answered meanwhile.
        blocker = sqlite3.connect(store, timeout=10)
        blocker.execute("BEGIN IMMEDIATE")
        time.sleep(0.5)
        gw.kill()  # SIGKILL mid-load: no flush, no shutdown
        blocker.rollback()
        blocker.close()
        time.sleep(0.3)
    finally:
        stop.set()
        worker.join(30)
    assert len(answered) >= 200 and failures and "AssertionError" not in failures, (len(answered), failures[:5])
    # The same store, a new process: it opens cleanly and serves.
    again = spawn_gateway(GATEWAY_SERVE, fake.url, store, admin_token=ADMIN)
    try:
        reg = register(again.url, ADMIN, "after")
        openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["token"], max_retries=0).chat.completions.create(
            model="x", messages=MSGS
        )
    finally:
        assert again.stop() == 0
    recs = _calls(store)
    stored = {(r.response or {}).get("id") for r in recs}
    missing = [rid for rid in answered if rid not in stored]
    assert not missing, f"{len(missing)} answered calls are not in the store, e.g. {missing[:3]}"
    assert len({r.call_id for r in recs}) == len(recs) and len(recs) >= len(answered) + 1
