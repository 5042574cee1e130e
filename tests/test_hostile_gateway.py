"""Hostile input to the gateway: every refusal is a 4xx in the API's own error shape, never a 500, and nothing is
said about a rollout to a caller that cannot show its token."""

from __future__ import annotations

import httpx
import openai
import pytest

from rl_backend.gateway.fake.harness import Harness

MSGS = [{"role": "user", "content": "hello there"}]


def _post_raw(url: str, body: bytes, token: str) -> httpx.Response:
    return httpx.post(url, content=body, headers={"authorization": f"Bearer {token}",
                                                  "content-type": "application/json"}, timeout=10)


@pytest.mark.parametrize("depth", [300, 1000, 100_000])
def test_deeply_nested_body_is_a_400_in_the_api_shape(h: Harness, depth: int) -> None:
    token = h.rollout("r1")
    body = b'{"model": "x", "messages": [], "metadata": ' + b"[" * depth + b"]" * depth + b"}"
    r = _post_raw(h.openai_url("r1") + "/chat/completions", body, token)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "nested" in error["message"]
    r = _post_raw(f"{h.base_url}/rollouts/r1/anthropic/v1/messages", body, token)
    assert r.status_code == 400 and r.json()["type"] == "error" and "nested" in r.json()["error"]["message"]
    assert h.fake.requests == []  # refused before anything went upstream
    # The gateway still serves the rollout afterwards.
    client = openai.OpenAI(base_url=h.openai_url("r1"), api_key=token, max_retries=0)
    assert client.chat.completions.create(model="x", messages=MSGS).choices[0].message.content


def test_a_moderately_nested_body_still_works(h: Harness) -> None:
    token = h.rollout("r1")
    nested: object = "leaf"
    for _ in range(60):  # tool schemas nest a few dozen levels
        nested = {"properties": nested}
    client = openai.OpenAI(base_url=h.openai_url("r1"), api_key=token, max_retries=0)
    reply = client.chat.completions.create(model="x", messages=MSGS, metadata={"deep": str(nested)[:100]},
                                           extra_body={"schema": nested})
    assert reply.choices[0].message.content
    assert len(h.calls("r1")) == 1


@pytest.mark.parametrize("reward", ["1" + "0" * 400, "1e400", "2000000", "true", '"0.5"'])
def test_a_reported_reward_that_is_no_usable_number_is_a_400(h: Harness, reward: str) -> None:
    token = h.rollout("r1")
    r = _post_raw(f"{h.base_url}/rollouts/r1/reward", ('{"reward": ' + reward + "}").encode(), token)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "reward" and "unusable" in r.json()["error"]["message"]
    assert h.store.reported_reward("r1") is None
    ok = _post_raw(f"{h.base_url}/rollouts/r1/reward", b'{"reward": 0.75}', token)
    assert ok.status_code == 200 and h.store.reported_reward("r1") == (0.75, None)


def test_no_token_learns_nothing_about_rollout_ids(h: Harness) -> None:
    token = h.rollout("registered")
    paths = ["/openai/v1/chat/completions", "/anthropic/v1/messages", "/reward", "/openai/v1/models"]
    for rid in ("registered", "never-registered"):
        for path in paths:
            method = httpx.get if path.endswith("models") else httpx.post
            kwargs = {} if method is httpx.get else {"json": {"model": "x", "messages": MSGS}}
            r = method(f"{h.base_url}/rollouts/{rid}{path}", **kwargs)  # type: ignore[operator]
            assert r.status_code == 401, (rid, path, r.status_code)
            wrong = method(f"{h.base_url}/rollouts/{rid}{path}", headers={"x-api-key": "agl-guess"},  # type: ignore[operator]
                           **kwargs)
            assert wrong.status_code == 401, (rid, path, wrong.status_code)
    # A real token of one rollout, used on another id, is refused the same way whether that id exists or not.
    for rid in ("never-registered", "also-missing"):
        r = httpx.post(f"{h.base_url}/rollouts/{rid}/openai/v1/chat/completions",
                       json={"model": "x", "messages": MSGS}, headers={"x-api-key": token})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert h.fake.requests == []


@pytest.mark.parametrize("bad_id", ["../../etc", "a..b", "r1\r\nX-Injected: 1", "r" * 60_000, "", "-lead", "sp ace",
                                    "ünï", 17])
def test_admin_refuses_unsafe_rollout_ids(fake: object, bad_id: object) -> None:
    with Harness(fake, admin_token="admin-secret-123") as h:  # type: ignore[arg-type]
        admin = {"authorization": "Bearer admin-secret-123"}
        r = httpx.post(f"{h.base_url}/admin/rollouts", json={"rollout_id": bad_id}, headers=admin)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "rollout_id" and "not allowed" in r.json()["error"]["message"]
        assert len(r.text) < 2000  # a 60 KB id is not echoed back whole
        assert h.gateway.state_dict()["rollouts"] == 0
        with pytest.raises(ValueError, match="not allowed"):
            h.gateway.register_rollout(bad_id)  # type: ignore[arg-type]
        good = httpx.post(f"{h.base_url}/admin/rollouts", json={"rollout_id": "rabc123-1"}, headers=admin)
        assert good.status_code == 201
        assert httpx.delete(f"{h.base_url}/admin/rollouts/a..b", headers=admin).status_code == 400
        assert httpx.get(f"{h.base_url}/admin/rollouts/a..b/calls", headers=admin).status_code == 400
