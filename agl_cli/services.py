"""The services a run needs, started in-process: embedded model servers for `kind: embedded` upstreams, then
the gateway in front of every upstream. Stopped in reverse order when the run ends.

With $AGL_GATEWAY_URL set (the trainer pod of `agl train --on kubernetes`), nothing starts here: the run uses the
gateway running there (rl_backend/gateway/remote.py, with $AGL_GATEWAY_ADMIN_TOKEN), which serves every upstream,
and `RunServices.collect_rollout` copies each finished rollout's calls from its store into this run's.

The verl backend serves the model it trains from verl's own rollout servers: that upstream (`policy=`) is not loaded
here; the gateway waits for the servers' addresses (`RunServices.set_endpoints`, once the trainer has started them)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agl_cli.errors import AglError, ConfigError
from agl_cli.spec import ExperimentSpec
from rl_backend.gateway.config import POLICY_KEY_ENV, ResolvedUpstream
from rl_backend.store.db import RunStore

if TYPE_CHECKING:
    from rl_backend.gateway import Gateway
    from rl_backend.gateway.budget import SpendLimit
    from rl_backend.gateway.remote import RemoteGateway


@dataclass
class RunServices:
    gateway: Gateway | RemoteGateway | None
    gateway_url: str | None
    # Empty with a remote gateway: it resolves the upstreams itself.
    upstreams: dict[str, ResolvedUpstream]
    # The in-process model servers of `kind: embedded` upstreams, by upstream name: training swaps their weights.
    embedded: dict[str, Any] = field(default_factory=dict)

    def set_endpoints(self, upstream: str, base_urls: list[str], model: str | None = None) -> None:
        """Send the calls of `upstream` (the policy being trained) to these servers from now on."""
        if self.gateway is None:
            raise AglError(f"no gateway runs for this spec, so upstream {upstream!r} cannot be served")
        self.gateway.set_endpoints(upstream, base_urls, model)

    def set_model_version(self, version: str) -> None:
        """The weights the policy's servers serve from now on (recorded with every later call)."""
        if self.gateway is not None:
            self.gateway.set_model_version(version)

    def collect_rollout(self, rollout_id: str, store: RunStore) -> None:
        """After a rollout ends: bring what a remote gateway recorded for it (calls, posted reward) into `store`, so
        grading, reports, trajectories and the ledger read it as if the gateway ran here. In-process: already there."""
        from rl_backend.gateway.remote import RemoteGateway

        if isinstance(self.gateway, RemoteGateway):
            self.gateway.copy_rollout(rollout_id, store)


def _api_key(name: str, kind: str, env_name: str | None) -> str | None:
    env_name = env_name or ("OPENAI_API_KEY" if kind == "openai" else "ANTHROPIC_API_KEY" if kind == "anthropic" else None)
    if env_name is None:
        return None
    value = os.environ.get(env_name)
    if kind in ("openai", "anthropic") and not value:
        raise ConfigError(
            f"upstream {name!r} needs an API key in ${env_name}, which is not set",
            hint=f"export {env_name}=... (agl passes it to the upstream only; agents never see it)",
        )
    return value


GATEWAY_URL_ENV = "AGL_GATEWAY_URL"  # rl_backend/gateway/remote.py reads it (and the admin token) too


def policy_upstream(name: str, upstream: Any) -> ResolvedUpstream:
    """A `kind: embedded` upstream whose servers a trainer runs (verl's rollout replicas): no model is loaded here;
    the gateway waits until the trainer registers their addresses, and sends them $AGL_POLICY_API_KEY if set."""
    return ResolvedUpstream(name=name, api="openai", base_urls=[], default_model=upstream.model,
                            api_key=os.environ.get(POLICY_KEY_ENV) or None, timeout_s=upstream.timeout_s,
                            returns_token_ids=True, free=True, registered_later=True)


@contextlib.contextmanager
def running_services(
    spec: ExperimentSpec, store: RunStore, *, log: Any = None, spend_limit: SpendLimit | None = None,
    policy: str | None = None,
) -> Iterator[RunServices]:
    """The services for `spec`; `policy` names the embedded upstream a trainer serves itself (see the docstring)."""
    if spend_limit is not None:
        from agl_cli.prices import check_budget_prices

        check_budget_prices(spec, spend_limit.limit_usd)
    # A spec whose agent calls no model through agl and reports no reward needs no gateway, remote or not.
    if os.environ.get(GATEWAY_URL_ENV, "").strip() and (spec.upstreams or spec.grader.reported):
        with remote_services(log=log, spend_limit=spend_limit) as services:
            yield services
        return
    with contextlib.ExitStack() as exits:
        resolved: dict[str, ResolvedUpstream] = {}
        embedded: dict[str, Any] = {}
        for name, upstream in spec.upstreams.items():
            if name == policy:
                if log:
                    log(f"upstream {name!r} ({upstream.model}) is served by the trainer's rollout servers")
                resolved[name] = policy_upstream(name, upstream)
            elif upstream.kind == "embedded":
                from rl_backend.serving.server import start_embedded_server

                if log:
                    log(f"starting the embedded model server for {name!r} ({upstream.model})")
                model_server = start_embedded_server(model=str(upstream.model))
                exits.callback(model_server.stop)
                embedded[name] = model_server
                resolved[name] = ResolvedUpstream(
                    name=name, api="openai", base_urls=[model_server.base_url + "/v1"],
                    default_model=upstream.model, timeout_s=upstream.timeout_s, returns_token_ids=True,
                )
            elif upstream.kind == "replay":
                from rl_backend.gateway.replay import start_replay_upstream

                resolved[name], replay_server = start_replay_upstream(
                    name, spec.resolve(str(upstream.path)), api=upstream.api or "openai",
                    default_model=upstream.model, timeout_s=upstream.timeout_s,
                )
                exits.callback(replay_server.stop)
            else:
                resolved[name] = ResolvedUpstream(
                    name=name,
                    api="anthropic" if upstream.kind == "anthropic" else "openai",
                    base_urls=upstream.urls(),
                    api_key=_api_key(name, upstream.kind, upstream.api_key_env),
                    default_model=upstream.model,
                    timeout_s=upstream.timeout_s,
                    returns_token_ids=False,
                    free=upstream.free,
                )
            if upstream.record_to:
                from rl_backend.gateway.replay_recorder import start_recording

                if log:
                    log(f"recording the responses of {name!r} to {spec.resolve(upstream.record_to)}")
                resolved[name], recorder = start_recording(resolved[name], spec.resolve(upstream.record_to))
                exits.callback(recorder.stop)
        if not resolved and not spec.grader.reported:
            # The agent calls no model through agl (or uses its own keys) and reports no reward: no gateway.
            yield RunServices(gateway=None, gateway_url=None, upstreams={}, embedded=embedded)
            return
        from rl_backend.gateway import Gateway, start_gateway

        default_model = spec.model
        if default_model is None and len(resolved) == 1:
            only = next(iter(resolved.values()))
            default_model = f"{only.name}/{only.default_model}" if only.default_model else None
        # Pods reach the gateway over the network: it listens beyond loopback, which needs an admin token.
        listen = spec.kubernetes.listen_address() if spec.runner == "kubernetes" and spec.kubernetes else None
        from agl_cli.prices import declared_prices

        gateway = Gateway(resolved, store, default_model=default_model, record_token_ids=True,
                          admin_token=secrets.token_urlsafe(32) if listen else None, spend_limit=spend_limit,
                          prices=declared_prices(spec))
        gateway_server = start_gateway(gateway, *listen) if listen else start_gateway(gateway)
        exits.callback(gateway_server.stop)
        yield RunServices(gateway=gateway, gateway_url=gateway_server.base_url, upstreams=resolved, embedded=embedded)


@contextlib.contextmanager
def remote_services(*, log: Any = None, spend_limit: SpendLimit | None = None) -> Iterator[RunServices]:
    """The services of a run whose gateway runs elsewhere ($AGL_GATEWAY_URL): checked before the first rollout."""
    from rl_backend.gateway.remote import RemoteGatewayError, from_environment

    try:
        gateway = from_environment(dict(os.environ))
    except RemoteGatewayError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from None
    assert gateway is not None
    if log:
        log(f"using the gateway at ${GATEWAY_URL_ENV} = {gateway.base_url} (no gateway or model server starts in "
            "this process; that gateway serves the upstreams, and each rollout's calls are copied from it)")
        if spend_limit is not None:
            log(f"budget.usd (${spend_limit.limit_usd:g}) is checked between rollouts: that gateway does not stop "
                "calls of rollouts already running")
    try:
        yield RunServices(gateway=gateway, gateway_url=gateway.base_url, upstreams={})
    except RemoteGatewayError as exc:  # the gateway went away (or its token changed) during the run
        raise AglError(exc.message, hint=exc.hint) from None
    finally:
        gateway.close()
