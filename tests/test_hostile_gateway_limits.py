"""The gateway's limits under a hostile upstream or client: an answer that never ends stops at the upstream's
`timeout_s`, an answer too big to hold passes through with a bounded record, a request that never finishes arriving
is cut off, and a gateway serving pods listens on the pod's addresses, not on every interface. Real servers on
loopback (the gateway, the scripted fake misbehaving as asked, `agl gateway serve` as its own process); the openai
SDK as the agent."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness
from rl_backend.gateway.fake.procs import Proc, register, spawn_serve
from rl_backend.gateway.listen import NoPodAddress, pod_hosts
from rl_backend.store.db import RunStore
from tests.helpers import GATEWAY_SERVE

MSGS: Any = [{"role": "user", "content": "hello there"}]
ADMIN = "admin-secret-for-tests"


@pytest.fixture()
def upstream(fake_server: FakeUpstream) -> Iterator[FakeUpstream]:
    fake_server.reset()
    yield fake_server
    fake_server.reset()


def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Wait for a state the system shows (polled; never a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _harness(fake: FakeUpstream, **upstream_fields: Any) -> Harness:
    slow = fake.upstream("slow", api_key=UPSTREAM_KEY, **upstream_fields)
    return Harness(fake, upstreams={"slow": slow}, default_model="slow/m")


# -- 13. an upstream's timeout_s holds for streams that never end ------------------------------------------------------


def test_a_stream_that_never_ends_fails_at_the_upstreams_timeout(upstream: FakeUpstream) -> None:
    with _harness(upstream, timeout_s=1.0) as h:
        upstream.fail("endless", delay_s=0.05)  # a token every 50 ms, for ever: never silent, never done
        client = h.openai("r1", timeout=30.0)
        t0, tokens = time.monotonic(), 0
        with pytest.raises(openai.APIError, match="had not ended within the upstream's timeout_s of 1 s"):
            for _ in client.chat.completions.create(model="x", messages=MSGS, stream=True):
                tokens += 1
                assert time.monotonic() - t0 < 15, "the stream is still going past three times its timeout"
        assert tokens >= 5 and time.monotonic() - t0 < 5
        (call,) = h.calls()
        assert call.status_code == 502 and (call.error or "").startswith("upstream_timeout: the answer had not ended")
        assert call.response is not None and call.response["choices"][0]["message"]["content"].startswith("...")
        _until(lambda: upstream.cancelled == 1, "the gateway to hang up on the upstream")


def test_an_answer_that_never_ends_is_a_504_for_a_whole_call(upstream: FakeUpstream) -> None:
    with _harness(upstream, timeout_s=1.0) as h:
        upstream.fail("endless", delay_s=0.05)
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as late:
            h.openai("r1", timeout=15.0).chat.completions.create(model="x", messages=MSGS)
        assert late.value.status_code == 504 and "timeout_s of 1 s" in late.value.message
        assert time.monotonic() - t0 < 5
        _until(lambda: upstream.cancelled == 1, "the gateway to hang up on the upstream")


def test_idle_timeout_ends_a_silent_stream_long_before_timeout_s(upstream: FakeUpstream) -> None:
    with _harness(upstream, timeout_s=60.0, idle_timeout_s=0.3) as h:
        upstream.fail("slow_stream", delay_s=2.0)  # first event at once, then two seconds of silence
        t0 = time.monotonic()
        with pytest.raises(openai.APIError, match="sent nothing for 0.3 s"):
            list(h.openai("r1").chat.completions.create(model="x", messages=MSGS, stream=True))
        assert time.monotonic() - t0 < 1.8
        upstream.fail("slow", delay_s=2.0)  # and before the first byte
        with pytest.raises(openai.APIStatusError) as silent:
            h.openai("r2").chat.completions.create(model="x", messages=MSGS)
        assert silent.value.status_code == 504 and "sent nothing for 0.3 s" in silent.value.message


# -- 14. an answer too big to hold ---------------------------------------------------------------------------------


def test_a_huge_answer_reaches_the_agent_whole_and_the_record_keeps_a_bounded_part(upstream: FakeUpstream) -> None:
    size = 5 << 20
    with Harness(upstream, upstreams={"paid": upstream.upstream("paid", api_key=UPSTREAM_KEY, free=False)},
                 default_model="paid/tiny", prices={"tiny": {"input": 1.0, "output": 2.0}},
                 keep_response_bytes=1 << 20) as h:
        client = h.openai("r1", timeout=60.0)
        upstream.fail("huge", size=size)
        reply = client.chat.completions.create(model="x", messages=MSGS)
        assert reply.choices[0].message.content == "a" * size  # every byte, unchanged
        upstream.fail("huge", size=size)
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(model="x", messages=MSGS, stream=True) if c.choices)
        assert streamed == "a" * size
        whole, stream = h.calls()
    assert whole.status_code == stream.status_code == 200 and whole.error is None and stream.error is None
    for call in (whole, stream):
        note = call.response["agl_truncated"]  # type: ignore[index]
        assert note["kept_bytes"] == 1 << 20 and note["total_bytes"] > size
        assert len(json.dumps(call.response)) < 1.2 * (1 << 20)
        # Usage came through all the same, so the cost is known.
        assert call.output_tokens == size // 4 and call.cost_usd == pytest.approx((3 * 1.0 + size // 4 * 2.0) / 1e6)
        assert call.completion_token_ids is None
    assert whole.response["head"].startswith('{"id": "chatcmpl-huge"')  # type: ignore[index]
    assert stream.response["choices"][0]["message"]["content"].startswith("aaaa")  # type: ignore[index]


def test_a_huge_answer_agl_would_have_to_translate_is_refused_not_held(upstream: FakeUpstream) -> None:
    with Harness(upstream, upstreams={"slow": upstream.upstream("slow", api_key=UPSTREAM_KEY)}, default_model="slow/m",
                 keep_response_bytes=1 << 20) as h:
        claude = h.anthropic("r1", timeout=60.0)  # the Messages API, served by an OpenAI-compatible upstream
        upstream.fail("huge", size=2 << 20)
        with pytest.raises(anthropic.APIStatusError) as refused:
            claude.messages.create(model="slow/m", max_tokens=8, messages=MSGS)
        assert refused.value.status_code == 502 and "more than agl reads to translate" in refused.value.message
        (call,) = h.calls()
        assert (call.error or "").startswith("upstream_too_large")


def test_a_stream_event_too_big_to_read_fails_the_stream(upstream: FakeUpstream) -> None:
    with _harness(upstream) as h:
        upstream.fail("huge_event", size=33 << 20)  # one event, longer than an event may be, that never ends
        with pytest.raises(openai.APIError, match="passed 33554432 bytes without ending"):
            list(h.openai("r1", timeout=60.0).chat.completions.create(model="x", messages=MSGS, stream=True))
        (call,) = h.calls()
        assert call.status_code == 502 and (call.error or "").startswith("upstream_too_large")


def test_stream_events_read_the_same_however_the_bytes_are_split() -> None:
    """The decoder holds only an unfinished event (it no longer copies its whole buffer at every chunk): the events
    must not depend on where chunks end, CRLF split across two included."""
    import random

    from rl_backend.gateway.sse import SSEDecoder

    rng = random.Random(7)
    stream = b"".join(
        (f"event: e{i}\r\ndata: {'x' * rng.randint(0, 50)}\r\ndata: two\r\n\r\n" if i % 2 else f": ping\ndata: {i}\n\n")
        .encode() for i in range(200)
    )
    whole = [(e.event, e.data) for e in SSEDecoder().feed(stream)]
    assert len(whole) == 200 and whole[1] == ("e1", whole[1][1]) and whole[1][1].endswith("\ntwo")
    for _ in range(100):
        decoder, seen, at = SSEDecoder(), [], 0
        while at < len(stream):
            step = rng.randint(1, 40)
            seen += [(e.event, e.data) for e in decoder.feed(stream[at:at + step])]
            at += step
        seen += [(e.event, e.data) for e in decoder.flush()]
        assert seen == whole


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


# -- a gateway process of its own, for memory and for its server's limits -------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, fake_server: FakeUpstream) -> Iterator[tuple[Proc, Path]]:
    folder = tmp_path_factory.mktemp("served")
    (folder / "agl.yaml").write_text(yaml.safe_dump({
        "upstreams": {"slow": {"kind": "openai-compatible", "base_url": fake_server.base_url,
                               "api_key_env": "FAKE_KEY", "timeout_s": 1.5}},
        "model": "slow/m",
    }))
    store = folder / "gw.sqlite"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FAKE_KEY", UPSTREAM_KEY)
        gw = spawn_serve(GATEWAY_SERVE, [str(folder), "--store", str(store), "--request-timeout", "1"],
                         admin_token=ADMIN)
    yield gw, store
    assert gw.stop() == 0


def test_served_gateway_ends_endless_streams_and_holds_a_96_mb_answer_in_bounded_memory(
    served: tuple[Proc, Path], upstream: FakeUpstream
) -> None:
    gw, store = served
    reg = register(gw.url, ADMIN, "r1")
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["token"], max_retries=0, timeout=30)
    upstream.fail("endless", delay_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(openai.APIError, match="timeout_s of 1.5 s"):
        for _ in client.chat.completions.create(model="x", messages=MSGS, stream=True):
            assert time.monotonic() - t0 < 15, "the stream is still going"

    # 96 MB from the upstream, read by the agent as it comes (it keeps none of it).
    size = 96 << 20
    before = _peak_rss_kb(gw.pid)
    upstream.fail("huge", size=size)
    received = 0
    with httpx.stream("POST", reg["openai_base_url"] + "/chat/completions", json={"model": "x", "messages": MSGS},
                      headers={"authorization": f"Bearer {reg['token']}"}, timeout=60) as response:
        assert response.status_code == 200
        for part in response.iter_bytes():
            received += len(part)
            last = part
    assert received > size and last.endswith(b"}") and b'"usage"' in last
    grew_mb = (_peak_rss_kb(gw.pid) - before) / 1024
    # It held the record's 8 MiB, not the answer: 570-770 MB before for 100 MB.
    assert grew_mb < 80, f"the gateway's peak memory grew by {grew_mb:.0f} MB for a {size >> 20} MB answer"
    db = RunStore(store)  # the record was committed before the agent got the last byte
    try:
        big = db.calls("r1")[-1]
    finally:
        db.close()
    assert big.response is not None and big.response["agl_truncated"]["total_bytes"] == received
    assert big.output_tokens == size // 4


def _slowloris(url: str, partial: bytes) -> tuple[float, bytes]:
    """Send part of a request and wait for the server to close; returns (seconds it took, what the server said)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=20) as sock:
        sock.sendall(partial)
        t0, said = time.monotonic(), b""
        while True:
            data = sock.recv(4096)
            if not data:
                return time.monotonic() - t0, said
            said += data


HEAD = b"POST /rollouts/r1/openai/v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Slow: "


def test_served_gateway_closes_a_request_that_never_finishes_arriving(served: tuple[Proc, Path]) -> None:
    gw, _ = served
    took, said = _slowloris(gw.url, HEAD)  # half a head, then nothing
    assert took < 5 and said.startswith(b"HTTP/1.1 408")
    reg = register(gw.url, ADMIN, "r1")
    body_start = (f"POST /rollouts/r1/openai/v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "
                  f"{reg['token']}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
    took, _ = _slowloris(gw.url, body_start + b'{"model": "x", ')  # a whole head, a body that stops
    assert took < 5
    state = httpx.get(f"{gw.url}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}).json()
    assert state["in_flight"] == 0
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["token"], max_retries=0)
    assert client.chat.completions.create(model="x", messages=MSGS).choices[0].message.content  # still serving


def test_in_process_gateway_has_the_same_request_time_limit(upstream: FakeUpstream) -> None:
    with Harness(upstream, request_timeout_s=0.5) as h:
        took, said = _slowloris(h.base_url, HEAD)
        assert took < 3 and said.startswith(b"HTTP/1.1 408")
        assert h.openai("r1").chat.completions.create(model="x", messages=MSGS).choices


# -- 15. where a gateway serving pods listens ------------------------------------------------------------------------


def test_in_cluster_listens_on_the_pods_addresses_and_loopback_never_the_wildcard(tmp_path: Path,
                                                                                  upstream: FakeUpstream) -> None:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("POD_IP", "127.0.0.2")  # the pod's address as the downward API gives it (a loopback one here)
        gw = spawn_serve(GATEWAY_SERVE, ["--upstream", f"local=openai-compatible:{upstream.base_url}", "--in-cluster",
                                         "--store", str(tmp_path / "s.sqlite")], admin_token=ADMIN)
    try:
        port = int(gw.url.rsplit(":", 1)[1])
        assert gw.url == f"http://127.0.0.2:{port}"
        v6 = socket.has_ipv6 and "::1" in gw.info["listen"]
        assert gw.info["listen"] == ["127.0.0.2", "127.0.0.1", *(["::1"] if v6 else [])]
        for host in gw.info["listen"]:
            shown = f"[{host}]" if ":" in host else host
            assert httpx.get(f"http://{shown}:{port}/healthz").json() == {"ok": True}
        with pytest.raises(httpx.ConnectError):  # 0.0.0.0 would have answered here too
            httpx.get(f"http://127.0.0.3:{port}/healthz")
    finally:
        assert gw.stop() == 0


def test_pod_addresses_come_from_the_environment_or_the_host_name() -> None:
    assert pod_hosts({"POD_IPS": "10.1.2.3,fd00:10::7"})[:2] == ["10.1.2.3", "fd00:10::7"]
    assert pod_hosts({}, hostname="pod-7", resolve=lambda _: ["127.0.0.1", "10.9.8.7"])[0] == "10.9.8.7"
    assert "127.0.0.1" in pod_hosts({"POD_IP": "10.1.2.3"})
    with pytest.raises(NoPodAddress, match="cannot tell this pod's address"):
        pod_hosts({}, hostname="laptop", resolve=lambda _: ["127.0.1.1"])
    with pytest.raises(NoPodAddress):
        pod_hosts({"POD_IP": "0.0.0.0"})
