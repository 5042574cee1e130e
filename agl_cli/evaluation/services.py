"""The services a run needs, started in-process: its upstreams (rl_backend/gateway/resolver.py: the embedded models
of `kind: embedded` upstreams load here), then the gateway in front of them. Stopped in reverse order when the run
ends.

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
from agl_cli.spec.schema import ExperimentSpec
from rl_backend.gateway.config import ResolvedUpstream
from rl_backend.store.db import RunStore

if TYPE_CHECKING:
    from rl_backend.gateway import Gateway
    from rl_backend.gateway.budget import SpendLimit
    from rl_backend.gateway.remote import RemoteGateway
    from rl_backend.gateway.resolver import EmbeddedModel


@dataclass
class RunServices:
    gateway: Gateway | RemoteGateway | None
    gateway_url: str | None
    # Empty with a remote gateway: it resolves the upstreams itself.
    upstreams: dict[str, ResolvedUpstream]
    # The models of `kind: embedded` upstreams loaded in this process, by upstream name: training swaps their weights.
    embedded: dict[str, EmbeddedModel] = field(default_factory=dict)

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


GATEWAY_URL_ENV = "AGL_GATEWAY_URL"  # rl_backend/gateway/remote.py reads it (and the admin token) too


@contextlib.contextmanager
def running_services(
    spec: ExperimentSpec, store: RunStore, *, log: Any = None, spend_limit: SpendLimit | None = None,
    policy: str | None = None,
) -> Iterator[RunServices]:
    """The services for `spec`; `policy` names the embedded upstream a trainer serves itself (see the docstring)."""
    if spend_limit is not None:
        from agl_cli.spec.prices import check_budget_prices

        check_budget_prices(spec, spend_limit.limit_usd)
    from agl_cli.spec.secret_env import short_secret_note

    if log and (note := short_secret_note(spec)):
        log(f"note: {note}")
    # A spec whose agent calls no model through agl and reports no reward needs no gateway, remote or not.
    if os.environ.get(GATEWAY_URL_ENV, "").strip() and (spec.upstreams or spec.grader.reported):
        with remote_services(log=log, spend_limit=spend_limit) as services:
            yield services
        return
    from rl_backend.gateway.resolver import UpstreamSetupError, default_model, started_upstreams

    with contextlib.ExitStack() as exits:
        try:
            upstreams = exits.enter_context(started_upstreams(
                spec.upstreams, resolve=spec.resolve, policy=[policy] if policy else [], log=log))
        except UpstreamSetupError as exc:
            raise ConfigError(str(exc), hint=exc.hint) from None
        if not upstreams.resolved and not spec.grader.reported:
            # The agent calls no model through agl (or uses its own keys) and reports no reward: no gateway.
            yield RunServices(gateway=None, gateway_url=None, upstreams={})
            return
        from rl_backend.gateway import Gateway, start_gateway

        # Pods reach the gateway over the network: it listens beyond loopback, which needs an admin token.
        listen = spec.kubernetes.listen_address() if spec.runner == "kubernetes" and spec.kubernetes else None
        gateway = Gateway(upstreams.resolved, store, default_model=default_model(spec.upstreams, spec.model),
                          record_token_ids=True, admin_token=secrets.token_urlsafe(32) if listen else None,
                          spend_limit=spend_limit, prices=spec.prices)
        gateway_server = start_gateway(gateway, *listen) if listen else start_gateway(gateway)
        exits.callback(gateway_server.stop)
        yield RunServices(gateway=gateway, gateway_url=gateway_server.base_url, upstreams=upstreams.resolved,
                          embedded=upstreams.models)


@contextlib.contextmanager
def remote_services(*, log: Any = None, spend_limit: SpendLimit | None = None) -> Iterator[RunServices]:
    """The services of a run whose gateway runs elsewhere ($AGL_GATEWAY_URL): checked before the first rollout."""
    from rl_backend.gateway.remote import TOKEN_ENV, RemoteGatewayError, from_environment

    try:
        gateway = from_environment(dict(os.environ))
    except RemoteGatewayError as exc:
        raise ConfigError(str(exc), hint=exc.hint) from None
    assert gateway is not None
    # In a pod the client above holds the admin token; the processes this one starts next (Ray's, verl's, graders)
    # must not inherit it: they stay dumpable, and a grader of the same uid could read it from their /proc environ.
    held = os.environ.pop(TOKEN_ENV, None) if os.environ.get("KUBERNETES_SERVICE_HOST") else None
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
        if held is not None:
            os.environ[TOKEN_ENV] = held
