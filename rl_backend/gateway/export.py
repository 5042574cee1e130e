"""Recorded calls out of the run store: JSONL (one CallRecord per line) and OpenTelemetry GenAI spans.

Spans follow the GenAI semantic conventions (`gen_ai.*` attributes from `CallRecord.otel_attributes()`), one per
call, kind CLIENT, named `<operation> <model>`, timed by the call's own start and end. All calls of a rollout share
one trace (its id is a hash of the rollout id), so a tracing UI shows a rollout as one trace; ids are deterministic,
so exporting twice gives the same spans.

OTLP/JSON files are JSON Lines: each line one `ExportTraceServiceRequest` of up to `batch` spans (what the
OpenTelemetry Collector's `otlpjsonfile` receiver reads). `send_otlp` posts the same spans to an OTLP/HTTP endpoint
through `opentelemetry-exporter-otlp-proto-http`, an optional dependency (`pip install 'agl[otel]'`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from rl_backend.store.records import CallRecord

SERVICE_NAME = "agl-gateway"
SCOPE_NAME = "agl.gateway"
SPAN_KIND_CLIENT = 3  # OTLP's enum value
STATUS_ERROR = 2


def jsonl_lines(records: Iterable[CallRecord]) -> Iterator[str]:
    """One JSON object per call (CallRecord's own JSON: `CallRecord.model_validate_json` reads it back)."""
    for record in records:
        yield record.model_dump_json() + "\n"


def trace_id_of(record: CallRecord) -> str:
    return hashlib.sha256(f"agl-trace:{record.rollout_id or record.call_id}".encode()).hexdigest()[:32]


def span_id_of(record: CallRecord) -> str:
    return hashlib.sha256(f"agl-span:{record.call_id}".encode()).hexdigest()[:16]


def _ns(seconds: float) -> int:
    # Through whole microseconds: a float of epoch seconds holds no more, and this keeps the digits exact.
    return round(seconds * 1e6) * 1000


def times_ns(record: CallRecord) -> tuple[int, int]:
    """(start, end) in Unix nanoseconds; a call without an end time ends at start + latency."""
    start = _ns(record.started_at)
    if record.ended_at is not None:
        end = _ns(record.ended_at)
    elif record.latency_s is not None:
        end = start + _ns(record.latency_s)
    else:
        end = start
    return start, max(start, end)


def span_attributes(record: CallRecord) -> dict[str, Any]:
    attrs = record.otel_attributes()
    attrs["agl.call.id"] = record.call_id
    response = record.response or {}
    if isinstance(response.get("id"), str):
        attrs["gen_ai.response.id"] = response["id"]
    if record.status_code is not None:
        attrs["http.response.status_code"] = record.status_code
    if record.error:
        attrs["error.type"] = record.error.split(":", 1)[0]
    if record.cached_tokens is not None:
        attrs["gen_ai.usage.cache_read.input_tokens"] = record.cached_tokens
    return attrs


def span_name(record: CallRecord) -> str:
    operation = record.otel_attributes().get("gen_ai.operation.name", "chat")
    model = record.request_model or record.model
    return f"{operation} {model}" if model else str(operation)


def failed(record: CallRecord) -> bool:
    return bool(record.error) or (record.status_code is not None and record.status_code >= 400)


def _any_value(value: Any) -> dict[str, Any]:
    """An attribute value in OTLP/JSON (proto3 JSON: 64-bit integers are strings)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": str(value)}


def otlp_span(record: CallRecord) -> dict[str, Any]:
    start, end = times_ns(record)
    span: dict[str, Any] = {
        "traceId": trace_id_of(record),
        "spanId": span_id_of(record),
        "name": span_name(record),
        "kind": SPAN_KIND_CLIENT,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [{"key": k, "value": _any_value(v)} for k, v in span_attributes(record).items()],
    }
    if failed(record):
        span["status"] = {"code": STATUS_ERROR, "message": record.error or f"HTTP {record.status_code}"}
    return span


def otlp_requests(records: Iterable[CallRecord], *, batch: int = 512, version: str = "") -> Iterator[dict[str, Any]]:
    """ExportTraceServiceRequest documents of up to `batch` spans each (none when there are no records)."""
    spans: list[dict[str, Any]] = []

    def document() -> dict[str, Any]:
        scope: dict[str, Any] = {"name": SCOPE_NAME, **({"version": version} if version else {})}
        return {
            "resourceSpans": [
                {
                    "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": SERVICE_NAME}}]},
                    "scopeSpans": [{"scope": scope, "spans": spans}],
                }
            ]
        }

    for record in records:
        spans.append(otlp_span(record))
        if len(spans) >= batch:
            yield document()
            spans = []
    if spans:
        yield document()


def otlp_exporter_available() -> bool:
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def send_otlp(records: Iterable[CallRecord], endpoint: str, *, headers: dict[str, str] | None = None,
              version: str = "", batch: int = 512, timeout_s: float = 30.0) -> int:
    """Post the spans to an OTLP/HTTP (protobuf) endpoint; returns how many were sent. Raises RuntimeError when the
    endpoint refuses them, ImportError without the exporter installed."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    if not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    resource = Resource.create({"service.name": SERVICE_NAME})
    scope = InstrumentationScope(SCOPE_NAME, version or None)
    exporter = OTLPSpanExporter(endpoint=endpoint, headers=headers, timeout=timeout_s)
    sent = 0
    pending: list[ReadableSpan] = []

    def flush() -> None:
        nonlocal sent
        if pending and exporter.export(pending) is not SpanExportResult.SUCCESS:
            raise RuntimeError(f"the OTLP endpoint {endpoint} did not accept {len(pending)} spans")
        sent += len(pending)
        pending.clear()

    try:
        for record in records:
            start, end = times_ns(record)
            context = SpanContext(
                trace_id=int(trace_id_of(record), 16), span_id=int(span_id_of(record), 16), is_remote=False,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            status = Status(StatusCode.ERROR, record.error or f"HTTP {record.status_code}") if failed(record) else Status()
            pending.append(
                ReadableSpan(
                    name=span_name(record), context=context, resource=resource, attributes=span_attributes(record),
                    kind=SpanKind.CLIENT, status=status, start_time=start, end_time=end, instrumentation_scope=scope,
                )
            )
            if len(pending) >= batch:
                flush()
        flush()
    finally:
        exporter.shutdown()
    return sent
