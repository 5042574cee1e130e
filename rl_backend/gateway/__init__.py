"""The model gateway: an OpenAI- and Anthropic-compatible proxy that attributes every call to a rollout and records it.

`Gateway` and `start_gateway` load lazily, so importing this package (for `config`) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_backend.gateway.app import Gateway, start_gateway
    from rl_backend.gateway.upstream import RetryPolicy

__all__ = ["Gateway", "RetryPolicy", "start_gateway"]


def __getattr__(name: str) -> Any:
    if name in ("Gateway", "start_gateway"):
        from rl_backend.gateway import app

        return getattr(app, name)
    if name == "RetryPolicy":
        from rl_backend.gateway.upstream import RetryPolicy

        return RetryPolicy
    raise AttributeError(name)
