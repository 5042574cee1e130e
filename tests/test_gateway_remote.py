"""A gateway in another process as the one a run uses ($AGL_GATEWAY_URL): the admin calls endpoint, the remote
client (rl_backend/gateway/remote.py), and `agl eval` against a real `agl gateway serve` whose records end up in the
eval's own store."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness
from rl_backend.gateway.fake.procs import Proc, spawn_fast_fake, spawn_gateway
from rl_backend.gateway.remote import RemoteGateway, RemoteGatewayError, from_environment
from rl_backend.store.db import RunStore
from rl_backend.store.records import CallRecord, RolloutStatus
from tests.helpers import FIXTURES, GATEWAY_SERVE, run_agl

ADMIN = "admin-secret-for-remote-tests"
MSGS: Any = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def fake() -> FakeUpstream:
    return FakeUpstream(api_key=UPSTREAM_KEY)


@pytest.fixture()
def h(fake: FakeUpstream) -> Iterator[Harness]:
    fake.reset()
    with Harness(fake, admin_token=ADMIN) as harness:
        yield harness


def _register(h: Harness, rid: str) -> dict[str, Any]:
    r = httpx.post(f"{h.base_url}/admin/rollouts", json={"rollout_id": rid}, headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 201, r.text
    result: dict[str, Any] = r.json()
    return result


# -- the admin endpoint --------------------------------------------------------------------------------------------


def test_calls_endpoint_needs_the_admin_token_and_round_trips_call_records(h: Harness) -> None:
    import openai

    reg = _register(h, "r1")
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["token"], max_retries=0)
    client.chat.completions.create(model="x", messages=MSGS)
    "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(model="x", messages=MSGS,
                                                                                     stream=True) if c.choices)
    httpx.post(reg["reward_url"], json={"reward": 0.5, "detail": {"why": "half"}},
               headers={"authorization": f"Bearer {reg['token']}"}).raise_for_status()

    url = f"{h.base_url}/admin/rollouts/r1/calls"
    missing = httpx.get(url)
    assert missing.status_code == 401 and "Authorization: Bearer <admin token>" in missing.json()["error"]["message"]
    wrong = httpx.get(url, headers={"authorization": f"Bearer {reg['token']}"})  # a rollout token is not the admin's
    assert wrong.status_code == 401 and "AGL_GATEWAY_ADMIN_TOKEN" in wrong.json()["error"]["message"]

    admin = {"authorization": f"Bearer {ADMIN}"}
    body = httpx.get(url, headers=admin).json()
    calls = [CallRecord.model_validate(doc) for doc in body["calls"]]
    assert calls == h.calls("r1") and len(calls) == 2 and [c.stream for c in calls] == [False, True]
    assert calls[0].completion_token_ids  # token ids travel intact
    assert body["reward"] == {"reward": 0.5, "detail": {"why": "half"}}
    # Still there after the rollout is unregistered; a rollout that made no call (or never existed) has none.
    assert httpx.delete(f"{h.base_url}/admin/rollouts/r1", headers=admin).status_code == 200
    assert len(httpx.get(url, headers=admin).json()["calls"]) == 2
    assert httpx.get(f"{h.base_url}/admin/rollouts/nobody/calls", headers=admin).json() == {
        "rollout_id": "nobody", "calls": [], "reward": None}
    # `since` leaves out what an earlier registration of the same id recorded.
    later = httpx.get(url, params={"since": str(calls[-1].started_at + 1)}, headers=admin).json()
    assert later["calls"] == [] and later["reward"] is None
    bad = httpx.get(url, params={"since": "soon"}, headers=admin)
    assert bad.status_code == 400 and "since" in bad.json()["error"]["message"]


# -- the client ----------------------------------------------------------------------------------------------------


def test_remote_client_registers_copies_and_pauses(h: Harness, tmp_path: Path) -> None:
    import openai

    remote = RemoteGateway(h.base_url, ADMIN)
    try:
        assert remote.spend_limit is None and remote.state()["rollouts"] == 0
        token = remote.register_rollout("r1", {"temperature": 0.25})
        assert h.gateway.rollout_entry("r1") is not None
        with pytest.raises(ValueError, match="unknown gateway knob"):
            remote.register_rollout("r2", {"colour": 1})
        openai.OpenAI(base_url=h.openai_url("r1"), api_key=token, max_retries=0).chat.completions.create(
            model="x", messages=MSGS)
        remote.unregister_rollout("r1")
        remote.unregister_rollout("r1")  # already gone: fine
        assert h.gateway.rollout_entry("r1") is None

        local = RunStore(tmp_path / "local.sqlite")
        assert remote.copy_rollout("r1", local) == 1
        assert remote.copy_rollout("r1", local) == 1  # again: the same call ids, nothing doubled
        assert [c.call_id for c in local.calls("r1")] == [c.call_id for c in h.calls("r1")]
        assert local.calls("r1")[0].request["temperature"] == 0.25
        local.close()

        # The same rollout id in a later run: only that registration's calls come back.
        again = RemoteGateway(h.base_url, ADMIN)
        token = again.register_rollout("r1")
        openai.OpenAI(base_url=h.openai_url("r1"), api_key=token, max_retries=0).chat.completions.create(
            model="x", messages=MSGS)
        assert [c.call_id for c in again.fetch_calls("r1")] == [h.calls("r1")[-1].call_id]
        again.close()

        remote.pause()
        assert h.gateway.state.paused and remote.wait_idle(5) and remote.in_flight == 0
        remote.resume("step-2")
        assert not h.gateway.state.paused and h.gateway.state.model_version == "step-2"
    finally:
        remote.close()


def test_remote_client_errors_name_the_variable_to_fix(h: Harness) -> None:
    with pytest.raises(RemoteGatewayError, match="AGL_GATEWAY_ADMIN_TOKEN"):
        from_environment({"AGL_GATEWAY_URL": h.base_url, "AGL_GATEWAY_ADMIN_TOKEN": "wrong"})
    with pytest.raises(RemoteGatewayError, match="AGL_GATEWAY_ADMIN_TOKEN is not"):
        from_environment({"AGL_GATEWAY_URL": h.base_url})
    with pytest.raises(RemoteGatewayError, match="cannot reach the gateway .*AGL_GATEWAY_URL"):
        from_environment({"AGL_GATEWAY_URL": "http://127.0.0.1:9", "AGL_GATEWAY_ADMIN_TOKEN": ADMIN})
    assert from_environment({}) is None
    remote = from_environment({"AGL_GATEWAY_URL": h.base_url + "/", "AGL_GATEWAY_ADMIN_TOKEN": ADMIN})
    assert remote is not None and remote.base_url == h.base_url
    remote.close()


# -- agl eval through a real `agl gateway serve` ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fast_fake() -> Iterator[Proc]:
    proc = spawn_fast_fake()
    yield proc
    proc.kill()


def _write_study(folder: Path, upstream_url: str) -> None:
    shutil.copy(FIXTURES / "paid_agent.py", folder / "paid_agent.py")
    (folder / "tasks.jsonl").write_text("".join(json.dumps({"id": f"t{i}"}) + "\n" for i in range(3)))
    spec = {
        "name": "remote",
        "agent": {"command": "python paid_agent.py {task_file} {output_file}", "timeout_s": 30,
                  "env": {"PAID_CALLS": "2"}},
        "tasks": {"path": "tasks.jsonl"},
        "grader": {"entry": "paid_agent:grade"},
        # What this process would start without $AGL_GATEWAY_URL; with it, the remote gateway serves the upstreams.
        "upstreams": {"local": {"kind": "openai-compatible", "base_url": upstream_url}},
        "concurrency": 2,
    }
    (folder / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def test_eval_uses_the_gateway_at_agl_gateway_url(fast_fake: Proc, tmp_path: Path) -> None:
    _write_study(tmp_path, "http://127.0.0.1:9/v1")  # unreachable: only the remote gateway may call the fake
    gateway_store = tmp_path / "gateway.sqlite"
    gw = spawn_gateway(GATEWAY_SERVE, fast_fake.url, gateway_store, admin_token=ADMIN)
    try:
        env = {"AGL_GATEWAY_URL": gw.url, "AGL_GATEWAY_ADMIN_TOKEN": ADMIN}
        result = run_agl(["eval", "agl.yaml", "--json", "--no-report"], cwd=tmp_path, env=env, timeout=180)
        assert result.returncode == 0, result.stderr
        assert f"using the gateway at $AGL_GATEWAY_URL = {gw.url}" in result.stderr
        doc = json.loads(result.stdout)

        wrong = run_agl(["eval", "agl.yaml", "--json", "--no-report"], cwd=tmp_path,
                        env={**env, "AGL_GATEWAY_ADMIN_TOKEN": "not-the-token"}, timeout=120)
        assert wrong.returncode == 2 and "refused the admin token" in wrong.stderr
        assert "AGL_GATEWAY_ADMIN_TOKEN" in wrong.stderr and "Traceback" not in wrong.stderr
    finally:
        assert gw.stop() == 0

    local = RunStore(Path(doc["run_dir"]) / "store.sqlite")
    try:
        rollouts = local.rollouts()
        assert len(rollouts) == 3 and all(r.status == RolloutStatus.succeeded and r.reward == 1.0 for r in rollouts)
        calls = local.calls()
        assert sorted(c.rollout_id for c in calls) == sorted([r.id for r in rollouts] * 2)
        assert all(c.completion_token_ids and c.prompt_token_ids and c.status_code == 200 for c in calls)
        assert local.call_totals_by_rollout()[rollouts[0].id].calls == 2  # what reports and the ledger read
    finally:
        local.close()
    remote = RunStore(gateway_store)
    try:
        assert {c.call_id for c in remote.calls()} == {c.call_id for c in calls}
    finally:
        remote.close()


def test_in_a_pod_the_processes_a_run_starts_do_not_inherit_the_admin_token(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's pod gets the admin token in its environment; the processes the run starts after connecting
    (Ray's, verl's, graders: all of agl's uid, all readable at /proc/PID/environ) must not carry it."""
    import os
    import subprocess
    import sys

    from agl_cli.evaluation.services import remote_services

    monkeypatch.setenv("AGL_GATEWAY_URL", h.base_url)
    monkeypatch.setenv("AGL_GATEWAY_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    with remote_services() as services:
        assert services.gateway is not None and services.gateway.state()["paused"] is False  # the client works
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('AGL_GATEWAY_ADMIN_TOKEN'))"],
                               capture_output=True, text=True, timeout=30)
        assert child.stdout.strip() == "None"
    assert os.environ["AGL_GATEWAY_ADMIN_TOKEN"] == ADMIN  # given back when the run ends
