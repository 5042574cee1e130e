"""Reading what an HTTP client sent: its credential, which API dialect it speaks, and its JSON body."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from rl_backend.gateway.errors import Dialect, GatewayError
from rl_backend.gateway.jsonfast import deeper_than, loads


def dialect_of(path: str) -> Dialect:
    return "anthropic" if "/anthropic/" in path else "openai"


def presented_token(request: Request) -> str | None:
    """The bearer token or x-api-key the client sent (OpenAI and Anthropic SDKs use one or the other)."""
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("x-api-key") or None


async def read_json_object(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object, or a 4xx saying what is wrong with it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise GatewayError(413, f"request body of {int(declared)} bytes is over this gateway's limit of {limit} bytes")
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise GatewayError(413, f"request body is over this gateway's limit of {limit} bytes")
    return parse_json_object(bytes(buf))


# Deeper than any real request (tool schemas nest a few dozen levels); shallow enough that the record of the request
# can always be written back out as JSON.
MAX_BODY_DEPTH = 128


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise GatewayError(400, "the request has no body: send a JSON object")
    try:
        data = loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise GatewayError(400, f"the request body must be a JSON object, got a JSON {type(data).__name__}")
    # Counting brackets is C-fast; only a body with enough of them to be too deep is walked.
    if raw.count(b"[") + raw.count(b"{") > MAX_BODY_DEPTH and deeper_than(data, MAX_BODY_DEPTH):
        raise GatewayError(400, f"the request body is nested more than {MAX_BODY_DEPTH} levels deep")
    return data
