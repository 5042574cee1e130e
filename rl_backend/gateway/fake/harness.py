"""A gateway wired to fake upstreams (in-process, or on loopback once started), with a fresh run store: for tests."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rl_backend.gateway.app import Gateway, start_gateway
from rl_backend.gateway.config import ResolvedUpstream
from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.upstream import RetryPolicy
from rl_backend.httpserver import ServerThread
from rl_backend.store.db import RunStore

FAST_RETRY = RetryPolicy(max_attempts=3, backoff_base_s=0.01, backoff_cap_s=0.05, connect_timeout_s=2.0)
UPSTREAM_KEY = "sk-upstream-secret-0123456789"


class Harness:
    """`gateway` in front of `fake` (upstream "local", OpenAI API, vLLM-style) and `fake_anthropic` ("claude")."""

    def __init__(
        self,
        fake: FakeUpstream,
        *,
        fake_anthropic: FakeUpstream | None = None,
        store_dir: Path | None = None,
        upstreams: dict[str, ResolvedUpstream] | None = None,
        default_model: str | None = "local/tiny",
        request_timeout_s: float | None = None,
        **gateway_options: Any,
    ) -> None:
        self.fake = fake
        self.fake_anthropic = fake_anthropic
        self._tmp = None if store_dir is not None else tempfile.TemporaryDirectory(prefix="agl-gw-")
        path = Path(store_dir if store_dir is not None else self._tmp.name) / "store.sqlite"  # type: ignore[union-attr]
        self.store_path = path
        self.store = RunStore(path)
        if upstreams is None:
            upstreams = {"local": fake.upstream("local", api_key=UPSTREAM_KEY, returns_token_ids=True)}
            if fake_anthropic is not None:
                upstreams["claude"] = fake_anthropic.upstream("claude", api="anthropic", api_key=UPSTREAM_KEY, free=False)
        gateway_options.setdefault("retry", FAST_RETRY)
        self.gateway = Gateway(upstreams, self.store, default_model=default_model, **gateway_options)
        self.server: ServerThread = (start_gateway(self.gateway) if request_timeout_s is None
                                     else start_gateway(self.gateway, request_timeout_s=request_timeout_s))
        self.base_url = self.server.base_url

    def rollout(self, rollout_id: str, knobs: dict[str, Any] | None = None) -> str:
        return self.gateway.register_rollout(rollout_id, knobs)

    def openai_url(self, rollout_id: str) -> str:
        return f"{self.base_url}/rollouts/{rollout_id}/openai/v1"

    def anthropic_url(self, rollout_id: str) -> str:
        return f"{self.base_url}/rollouts/{rollout_id}/anthropic"

    def openai(self, rollout_id: str, knobs: dict[str, Any] | None = None, **client_options: Any) -> Any:
        import openai

        client_options.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.openai_url(rollout_id), api_key=self.rollout(rollout_id, knobs), **client_options)

    def async_openai(self, rollout_id: str, knobs: dict[str, Any] | None = None, **client_options: Any) -> Any:
        import openai

        client_options.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(
            base_url=self.openai_url(rollout_id), api_key=self.rollout(rollout_id, knobs), **client_options
        )

    def anthropic(self, rollout_id: str, knobs: dict[str, Any] | None = None, **client_options: Any) -> Any:
        import anthropic

        client_options.setdefault("max_retries", 0)
        return anthropic.Anthropic(
            base_url=self.anthropic_url(rollout_id), api_key=self.rollout(rollout_id, knobs), **client_options
        )

    def calls(self, rollout_id: str | None = None) -> list[Any]:
        self.gateway.flush()
        return self.store.calls(rollout_id)

    def close(self) -> None:
        self.server.stop()
        self.store.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
