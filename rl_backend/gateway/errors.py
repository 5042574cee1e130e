"""Errors the gateway answers with, in the error shape of the API the agent speaks (OpenAI or Anthropic).

An agent's SDK turns these bodies into its own exception types, so the message is what a person reads when an
agent fails: it says what was wrong and what to change.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from starlette.responses import Response

from rl_backend.gateway.jsonfast import dumps

Dialect = Literal["openai", "anthropic"]

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class GatewayError(Exception):
    """A request the gateway refuses or cannot serve; carries the HTTP status and a message for a person."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_type(status: int, dialect: Dialect) -> str:
    table = _ANTHROPIC_TYPES if dialect == "anthropic" else _OPENAI_TYPES
    return table.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(
    status: int, message: str, dialect: Dialect, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    if dialect == "anthropic":
        return {"type": "error", "error": {"type": error_type(status, dialect), "message": message}}
    return {"error": {"message": message, "type": error_type(status, dialect), "param": param, "code": code}}


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(
        dumps(body),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


def error_response(exc: GatewayError, dialect: Dialect) -> Response:
    body = error_body(exc.status, exc.message, dialect, param=exc.param, code=exc.code)
    return json_response(exc.status, body, exc.headers)


def upstream_error_message(body: bytes, limit: int = 500) -> str:
    """The human message inside an upstream's error body (either dialect), else the body's start."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body[:limit].decode("utf-8", "replace")
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])[:limit]
        if isinstance(err, str):
            return err[:limit]
        if isinstance(data.get("detail"), str):  # FastAPI-style servers
            return str(data["detail"])[:limit]
    return body[:limit].decode("utf-8", "replace")
