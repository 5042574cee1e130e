"""From upstream specs (agl.yaml's `upstreams:`, `agl gateway serve --upstream`) to the upstreams a gateway calls: the
one way every command that runs a gateway (eval, optimize, train, `gateway serve`) sets them up.

Per kind: `embedded` loads its model in this process and serves it in-process, unless it is the policy a trainer
serves (its servers register with the gateway later); `replay` answers from its recording in-process; `openai`,
`anthropic` and `openai-compatible` are called over the network, with the API key read here and nowhere else.
`record_to:` on any of them keeps a copy of every answer. Whether a call costs anything starts here too: `free:` on
the upstream decides; unset, pricing.py's rule (a model served here, or on loopback, is free unless `prices:` names
it), except that a replay is priced like the API it recorded.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_backend.gateway.config import POLICY_KEY_ENV, ResolvedUpstream, UpstreamSpec
from rl_backend.gateway.transport import IN_PROCESS_URL, InProcessTransport, Transport

DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


class UpstreamSetupError(ValueError):
    """An upstream that cannot be set up as given (a missing key, an unreadable recording): a configuration error,
    with `hint`, the fix."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass
class EmbeddedModel:
    """A `kind: embedded` upstream's model, loaded in this process; training swaps the weights of its engine."""

    engine: Any

    def stop(self) -> None:
        self.engine.stop()


@dataclass
class Upstreams:
    resolved: dict[str, ResolvedUpstream]
    models: dict[str, EmbeddedModel] = field(default_factory=dict)  # by upstream name


def default_model(specs: Mapping[str, UpstreamSpec], declared: str | None) -> str | None:
    """Where a call whose model names no upstream goes: the declared `model`, else the only upstream there is (its
    own model, else the name the agent asked for)."""
    if declared is not None or len(specs) != 1:
        return declared
    name, only = next(iter(specs.items()))
    return f"{name}/{only.model}" if only.model else name


def describe(name: str, spec: UpstreamSpec, *, policy: bool = False, token_ids: bool = False) -> ResolvedUpstream:
    """The upstream as the gateway will see it, before anything starts (no key, no transport): its API, its URLs,
    whether it returns token ids, and what decides its price. `policy`: an embedded upstream a trainer serves."""
    if spec.kind == "embedded":
        return ResolvedUpstream(
            name=name, api="openai", base_urls=[] if policy else [IN_PROCESS_URL + "/v1"], default_model=spec.model,
            timeout_s=spec.timeout_s, idle_timeout_s=spec.idle_timeout_s, returns_token_ids=True, free=spec.free,
            registered_later=policy,
        )
    if spec.kind == "replay":
        api = spec.api or "openai"
        return ResolvedUpstream(
            name=name, api=api, base_urls=[IN_PROCESS_URL + "/v1" if api == "openai" else IN_PROCESS_URL],
            default_model=spec.model, timeout_s=spec.timeout_s, idle_timeout_s=spec.idle_timeout_s,
            free=False if spec.free is None else spec.free,
        )
    return ResolvedUpstream(
        name=name, api="anthropic" if spec.kind == "anthropic" else "openai", base_urls=spec.urls(),
        default_model=spec.model, timeout_s=spec.timeout_s, idle_timeout_s=spec.idle_timeout_s,
        returns_token_ids=token_ids, free=spec.free,
    )


def api_key(name: str, spec: UpstreamSpec, environ: Mapping[str, str], key_env: str | None = None) -> str | None:
    """The upstream's API key: from $`key_env`, else its `api_key_env`, else the API's usual variable. A hosted API
    without one is an error now, not a 401 at the first call."""
    env_name = key_env or spec.api_key_env or DEFAULT_KEY_ENV.get(spec.kind)
    value = environ.get(env_name) if env_name else None
    if spec.kind in DEFAULT_KEY_ENV and not value:
        raise UpstreamSetupError(
            f"upstream {name!r} needs an API key in ${env_name}, which is not set",
            hint=f"export {env_name}=... (agl passes it to the upstream only; agents never see it)",
        )
    return value


@contextlib.contextmanager
def started_upstreams(
    specs: Mapping[str, UpstreamSpec], *, resolve: Callable[[str], Path] = Path, policy: Collection[str] = (),
    token_ids: Collection[str] = (), key_envs: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None, log: Callable[[str], Any] | None = None,
) -> Iterator[Upstreams]:
    """The upstreams of `specs`, ready to call, for as long as the block runs (loaded models stop after it).

    `resolve` turns a path in a spec (a recording, `record_to`) into a file; `policy` names the embedded upstreams a
    trainer serves; `token_ids` the openai-compatible ones that answer vLLM-style; `key_envs` overrides where an
    upstream's key is. Raises UpstreamSetupError for what cannot be set up."""
    environ = os.environ if environ is None else environ
    key_envs = key_envs or {}
    unknown = (set(token_ids) | set(key_envs) | set(policy)) - set(specs)
    if unknown:
        raise UpstreamSetupError(f"no upstream named {', '.join(sorted(unknown))} (upstreams: {', '.join(specs)})")
    # Every key before any model loads: a missing one is said at once.
    keys = {name: api_key(name, spec, environ, key_envs.get(name)) for name, spec in specs.items()
            if spec.kind not in ("embedded", "replay")}
    say = log or (lambda _message: None)
    with contextlib.ExitStack() as exits:
        result = Upstreams(resolved={})
        for name, spec in specs.items():
            resolved = describe(name, spec, policy=name in policy, token_ids=name in token_ids)
            transport: Transport | None = None
            key = keys.get(name)
            if resolved.registered_later:
                say(f"upstream {name!r} ({spec.model}) is the trained policy: its servers register with the gateway")
                key = environ.get(POLICY_KEY_ENV) or None
            elif spec.kind == "embedded":
                say(f"loading the embedded model for {name!r} ({spec.model})")
                model = _load_embedded(str(spec.model))
                exits.callback(model.stop)
                result.models[name] = model
                from rl_backend.serving.server import create_app

                transport = InProcessTransport(create_app(model.engine))
            elif spec.kind == "replay":
                transport = _replay(name, resolve(str(spec.path)))
            if spec.record_to:
                from rl_backend.gateway.h1client import H1Pool
                from rl_backend.gateway.replay_recorder import RecordingFile, RecordingTransport

                path = resolve(spec.record_to)
                say(f"recording the responses of {name!r} to {path}")
                transport = RecordingTransport(transport if transport is not None else H1Pool(), RecordingFile(path))
            result.resolved[name] = resolved.model_copy(update={"api_key": key, "transport": transport})
        yield result


def _load_embedded(model: str) -> EmbeddedModel:
    from rl_backend.serving.engine import Engine

    return EmbeddedModel(Engine.from_model(model).start())


def _replay(name: str, path: Path) -> Transport:
    from rl_backend.gateway.replay import Recording, ReplayUpstream

    try:
        recording = Recording.load(path)
    except (OSError, ValueError) as exc:
        raise UpstreamSetupError(
            f"upstream {name!r}: {exc}", hint="record one by running against the live upstream with `record_to:` set on it"
        ) from None
    return InProcessTransport(ReplayUpstream(recording).app)
