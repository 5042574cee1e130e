"""Model routing: which upstream, which model name and which replica serve a call.

`upstream/model` names an upstream directly; any other name goes to the default model; a rollout's `model` knob
overrides both. The route says which of the three happened, and the call record keeps it: an agent whose name
fell back to the default model is shown as such, never silently measured as the model it asked for.

A rollout always lands on the same replica of a multi-URL upstream (hash of its id), so a vLLM fleet reuses its
prefix cache across the turns of one agent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from rl_backend.gateway.config import ResolvedUpstream
from rl_backend.gateway.errors import GatewayError
from rl_backend.store.records import RouteKind


@dataclass(frozen=True)
class Route:
    upstream: ResolvedUpstream
    model: str
    replica: int  # index into upstream.base_urls of this rollout's replica
    kind: RouteKind = RouteKind.named  # why this model: recorded with the call, so a fallback is never silent


def replica_index(rollout_id: str, n: int) -> int:
    if n <= 1:
        return 0
    digest = hashlib.sha256(rollout_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


class Router:
    def __init__(self, upstreams: Mapping[str, ResolvedUpstream], default_model: str | None) -> None:
        if not upstreams:
            raise ValueError("the gateway needs at least one upstream")
        for name, up in upstreams.items():
            if not up.base_urls and not up.registered_later:
                raise ValueError(f"upstream {name!r} has no base URL")
        self.upstreams = dict(upstreams)
        self.default_model = default_model
        if default_model is not None:
            self._split(default_model, what="default_model")

    def _split(self, name: str, *, what: str) -> tuple[ResolvedUpstream, str | None]:
        """'upstream/model' (the model part may hold more slashes) or a bare upstream name."""
        head, sep, tail = name.partition("/")
        if head in self.upstreams:
            return self.upstreams[head], (tail or None) if sep else None
        raise ValueError(
            f"{what} {name!r} names no upstream; write it as 'upstream/model' with upstream one of {sorted(self.upstreams)}"
        )

    def known(self) -> list[str]:
        return sorted(self.upstreams)

    def set_endpoints(self, name: str, base_urls: list[str], model: str | None = None) -> ResolvedUpstream:
        """Serve upstream `name` (one that is `registered_later`) from `base_urls` from the next call on, every call
        asking for `model` when given. Calls in flight finish where they are."""
        upstream = self.upstreams.get(name)
        if upstream is None or not upstream.registered_later:
            later = sorted(n for n, u in self.upstreams.items() if u.registered_later)
            raise ValueError(f"upstream {name!r} does not take registered endpoints (those that do: {later or 'none'})")
        if not base_urls:
            raise ValueError("give at least one base URL")
        updated = upstream.model_copy(update={"base_urls": list(base_urls), "serve_as": model or upstream.serve_as})
        self.upstreams[name] = updated
        return updated

    def resolve(self, request_model: str | None, knob_model: str | None, rollout_id: str) -> Route:
        if knob_model is not None:
            upstream, model = self._split(knob_model, what="the rollout's model knob")
            kind = RouteKind.knob
        else:
            head, sep, tail = (request_model or "").partition("/")
            if sep and tail and head in self.upstreams:
                upstream, model = self.upstreams[head], tail
                kind = RouteKind.named
            elif self.default_model is not None:
                upstream, model = self._split(self.default_model, what="default_model")
                kind = RouteKind.default
            else:
                raise GatewayError(
                    400,
                    f"model {request_model!r} names no upstream of this gateway and it has no default model: ask "
                    f"for 'upstream/model' with upstream one of {self.known()}, or set `model:` in agl.yaml",
                    param="model",
                    code="model_not_found",
                )
        if not upstream.base_urls:
            raise GatewayError(
                503,
                f"upstream {upstream.name!r} is the model being trained, and its servers have not registered yet "
                "(the trainer registers them once they are up): retry shortly",
                code="upstream_not_ready",
                headers={"retry-after": "5"},
            )
        # A bare upstream name as the default: that upstream's own default model, else the name the agent used.
        model = upstream.serve_as or model or upstream.default_model or request_model
        if not model:
            raise GatewayError(400, f"no model name to send to upstream {upstream.name!r}: give `model`", param="model")
        return Route(upstream, model, replica_index(rollout_id, len(upstream.base_urls)), kind)
