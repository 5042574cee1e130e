"""`agl gateway export`: recorded calls as JSONL (round trip) and as OpenTelemetry GenAI spans (file and endpoint)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from rl_backend.gateway import export
from rl_backend.store.db import RunStore
from rl_backend.store.records import Api, CallRecord
from tests.helpers import invoke_agl, run_agl


def _records() -> list[CallRecord]:
    base = 1_780_000_000.123456
    return [
        CallRecord(
            call_id="call-1", rollout_id="r1", api=Api.openai_chat, upstream="local", request_model="gpt-x",
            model="tiny", request={"model": "tiny", "messages": [{"role": "user", "content": "hé"}], "temperature": 0.5},
            response={"id": "chatcmpl-1", "choices": [{"message": {"content": "ok"}}]}, status_code=200,
            input_tokens=7, output_tokens=2, cached_tokens=3, cost_usd=0.0, started_at=base, ended_at=base + 0.25,
            latency_s=0.25, ttft_s=0.1, prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5], logprobs=[-0.1, -0.2],
            knobs_applied={"temperature": 0.5}, stream=True,
        ),
        CallRecord(
            call_id="call-2", rollout_id="r1", api=Api.anthropic_messages, upstream="claude", request_model="claude-x",
            model="claude-x", request={"max_tokens": 5}, status_code=529, error="upstream_http_529: overloaded",
            started_at=base + 1, ended_at=base + 1.5,
        ),
        CallRecord(
            call_id="call-3", rollout_id="r2", api=Api.openai_completions, upstream="local", model="tiny",
            status_code=200, started_at=base + 2, latency_s=0.125,
        ),
    ]


@pytest.fixture()
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "store.sqlite"
    store = RunStore(path)
    store.insert_calls(_records())
    store.close()
    return path


def test_jsonl_round_trip(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "calls.jsonl"
    result = run_agl(["gateway", "export", str(store_path), "--out", str(out)], tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    back = [CallRecord.model_validate_json(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert back == _records()
    # A run folder works as well as its store file, and stdout is the default.
    result = run_agl(["gateway", "export", str(store_path.parent), "--rollout", "r2"], tmp_path, timeout=60)
    assert [json.loads(line)["call_id"] for line in result.stdout.splitlines()] == ["call-3"]


def test_otlp_json_has_one_genai_span_per_call_with_its_times(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "spans.otlp.jsonl"
    result = run_agl(["gateway", "export", str(store_path), "--format", "otlp", "--out", str(out)], tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    spans = [s for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(spans) == 3
    records = {r.call_id: r for r in _records()}
    for span in spans:
        attrs = {a["key"]: a["value"] for a in span["attributes"]}
        record = records[attrs["agl.call.id"]["stringValue"]]
        end = record.ended_at if record.ended_at is not None else record.started_at + (record.latency_s or 0)
        assert int(span["startTimeUnixNano"]) == round(record.started_at * 1e6) * 1000
        assert abs(int(span["endTimeUnixNano"]) - end * 1e9) < 2000
        assert span["kind"] == 3 and len(span["traceId"]) == 32 and len(span["spanId"]) == 16
        assert attrs["gen_ai.system"]["stringValue"] == record.api.value.split(".")[0]
        assert attrs["gen_ai.operation.name"]["stringValue"] in ("chat", "text_completion")
        if record.request_model:
            assert attrs["gen_ai.request.model"]["stringValue"] == record.request_model
    first = next(s for s in spans if s["name"] == "chat gpt-x")
    attrs = {a["key"]: a["value"] for a in first["attributes"]}
    assert attrs["gen_ai.usage.input_tokens"] == {"intValue": "7"} and attrs["gen_ai.usage.output_tokens"] == {"intValue": "2"}
    assert attrs["gen_ai.request.temperature"] == {"doubleValue": 0.5}
    assert attrs["gen_ai.response.id"]["stringValue"] == "chatcmpl-1"
    failed = next(s for s in spans if s["name"] == "chat claude-x")
    assert failed["status"]["code"] == 2 and "overloaded" in failed["status"]["message"]
    # The calls of one rollout share a trace.
    assert len({s["traceId"] for s in spans}) == 2


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["content-length"]))
        type(self).received.append((self.path, body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def collector() -> Iterator[tuple[str, type[_Collector]]]:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    handler = type("Collector", (_Collector,), {"received": []})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()


def test_spans_go_to_an_otlp_endpoint(store_path: Path, collector: tuple[str, type[_Collector]]) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    url, handler = collector
    store = RunStore(store_path)
    records = store.calls()
    store.close()
    assert export.send_otlp(records, url) == 3
    assert [path for path, _ in handler.received] == ["/v1/traces"]
    request = ExportTraceServiceRequest.FromString(handler.received[0][1])
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert sorted(s.name for s in spans) == ["chat claude-x", "chat gpt-x", "text_completion tiny"]
    by_name = {s.name: s for s in spans}
    assert by_name["chat gpt-x"].start_time_unix_nano == round(records[0].started_at * 1e6) * 1000
    assert by_name["chat gpt-x"].kind == 3 and by_name["chat claude-x"].status.code == 2
    assert {a.key for a in by_name["chat gpt-x"].attributes} >= {"gen_ai.request.model", "gen_ai.usage.input_tokens"}
    result = run_agl(["gateway", "export", str(store_path), "--format", "otlp", "--endpoint", url], store_path.parent,
                     timeout=60)
    assert result.returncode == 0 and "sent 3 spans" in result.stderr, result.stderr
    assert len(handler.received) == 2
    result = invoke_agl(["gateway", "export", str(store_path), "--endpoint", url], store_path.parent)
    assert result.returncode == 2 and "--format otlp" in result.stderr
