"""`agl gateway`: the model gateway as a process of its own (`serve`), and its recorded calls out (`export`).

`serve` is for controllers and trainers in other processes or pods: they register rollouts over HTTP
(`POST /admin/rollouts`, admin token) and hand each agent its base URLs and token.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors
from rl_backend.version import installed_version

if TYPE_CHECKING:
    from rl_backend.gateway.config import PriceSpec, ResolvedUpstream, UpstreamSpec

app = typer.Typer(
    name="gateway",
    help="The model gateway on its own: serve it, export what it recorded.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ADMIN_TOKEN_ENV = "AGL_GATEWAY_ADMIN_TOKEN"


class ExportFormat(str, Enum):
    jsonl = "jsonl"
    otlp = "otlp"


# -- upstreams -------------------------------------------------------------------------------------------------------


def parse_upstream_flag(text: str) -> tuple[str, UpstreamSpec]:
    """`name=kind[:url[,url…]]`; for `embedded` the part after the colon is the model (`local=embedded:smollm2-…`),
    for `replay` the recording (`openai=replay:rec.jsonl`, an OpenAI-API one; agl.yaml can say `api: anthropic`)."""
    from typing import get_args

    from pydantic import ValidationError

    from agl_cli.errors import UsageError
    from rl_backend.gateway.config import UpstreamKind, UpstreamSpec

    kinds = get_args(UpstreamKind)
    name, sep, rest = text.partition("=")
    kind, _, target = rest.partition(":")
    if not sep or not name or kind not in kinds:
        raise UsageError(
            f"--upstream {text!r}: write name=kind:url with kind one of {', '.join(kinds)}",
            hint="e.g. --upstream vllm=openai-compatible:http://127.0.0.1:8000/v1 --upstream openai=openai",
        )
    fields: dict[str, Any] = {"kind": kind}
    if kind == "embedded":
        fields["model"] = target or None
    elif kind == "replay":
        fields["path"] = target or None
    elif target:
        urls = [u for u in target.split(",") if u]
        fields["base_urls" if len(urls) > 1 else "base_url"] = urls if len(urls) > 1 else urls[0]
    try:
        return name, UpstreamSpec.model_validate(fields)
    except ValidationError as exc:
        raise UsageError(f"--upstream {text!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def upstreams_from_yaml(path: Path) -> tuple[dict[str, UpstreamSpec], str | None, dict[str, PriceSpec]]:
    """`upstreams:`, `model:` and `prices:` of an agl.yaml (with `${VAR}` filled in); the rest of the file is not
    needed (nor checked) here."""
    import os

    from pydantic import ValidationError

    from agl_cli.errors import ConfigError
    from agl_cli.spec.env_values import expand
    from agl_cli.spec.yaml_source import YamlDocument
    from rl_backend.gateway.config import PriceSpec, UpstreamSpec

    spec_path = path / "agl.yaml" if path.is_dir() else path
    doc = YamlDocument.load(spec_path)
    data = expand(doc, os.environ)

    def section(key: str, model: Any, what: str) -> dict[str, Any]:
        raw = data.get(key) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{spec_path}:{doc.line_of((key,))}: `{key}` must be a mapping of {what}")
        parsed: dict[str, Any] = {}
        for name, value in raw.items():
            try:
                parsed[str(name)] = model.model_validate(value)
            except ValidationError as exc:
                err = exc.errors()[0]
                where = doc.line_of((key, name, *err["loc"]))
                field = ".".join(str(part) for part in (key, name, *err["loc"]))
                raise ConfigError(f"{spec_path}:{where}: `{field}`: {err['msg'].removeprefix('Value error, ')}") from None
        return parsed

    specs = section("upstreams", UpstreamSpec, "name to upstream")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"{spec_path}:{doc.line_of(('model',))}: `model` must be a string such as upstream/model")
    return specs, model, section("prices", PriceSpec, "upstream/model to a price")


def _pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    from agl_cli.errors import UsageError

    result = {}
    for value in values or []:
        name, sep, other = value.partition("=")
        if not sep or not name or not other:
            raise UsageError(f"{flag} {value!r}: write NAME=VALUE")
        result[name] = other
    return result


# -- serve -----------------------------------------------------------------------------------------------------------


@app.command("serve")
@handle_errors
def serve_command(
    config: Annotated[Optional[Path], typer.Argument(help="agl.yaml (or its folder): serve its `upstreams` and `model`.")] = None,  # noqa: UP045,E501
    upstream: Annotated[Optional[list[str]], typer.Option("--upstream", "-u", help="name=kind:url[,url…] (kinds: openai, anthropic, openai-compatible; embedded:MODEL, replay:RECORDING); repeat.")] = None,  # noqa: UP045,E501
    model: Annotated[Optional[str], typer.Option(help="Default upstream/model for names that match no upstream.")] = None,  # noqa: UP045
    token_ids: Annotated[Optional[list[str]], typer.Option("--token-ids", help="Upstream NAME is vLLM-like: ask it for token ids and logprobs (embedded ones always are); repeat.")] = None,  # noqa: UP045,E501
    api_key_env: Annotated[Optional[list[str]], typer.Option("--api-key-env", help="NAME=ENV: upstream NAME's key is in $ENV; repeat.")] = None,  # noqa: UP045,E501
    host: Annotated[Optional[str], typer.Option(help="Interface to bind (default 127.0.0.1; beyond loopback needs an admin token).")] = None,  # noqa: UP045,E501
    port: Annotated[int, typer.Option(help="Port to bind (0: any free port; --json prints it).")] = 8090,
    in_cluster: Annotated[bool, typer.Option("--in-cluster", help="Serve pods: listen on this pod's own addresses ($POD_IPS or $POD_IP, else its host name's) and on loopback, IPv6 included where the pod has it, never on 0.0.0.0 (--host picks one address instead; an admin token is required); `kind: embedded` upstreams are the policy a trainer serves, whose servers register over the admin API.")] = False,  # noqa: E501
    request_timeout: Annotated[float, typer.Option(help="Seconds a request's head may take to arrive, and the longest pause in its body; past it the connection is closed.")] = 30.0,  # noqa: E501
    admin_token: Annotated[Optional[str], typer.Option(envvar=ADMIN_TOKEN_ENV, show_envvar=True, help="Bearer token for /admin/* (pause, resume, rollouts). Prefer the environment variable.")] = None,  # noqa: UP045,E501
    store: Annotated[Optional[Path], typer.Option(help="The SQLite store calls are recorded in (default .agl/gateway/store.sqlite).")] = None,  # noqa: UP045,E501
    json_output: Annotated[bool, typer.Option("--json", help="When ready, print one JSON document (URL, store, …) on stdout.")] = False,  # noqa: E501
) -> None:
    """Serve the gateway on its own until stopped (Ctrl-C or SIGTERM finish the calls in flight first)."""
    import secrets

    from agl_cli.console import print_json, stderr_console
    from agl_cli.errors import ConfigError, UsageError
    from agl_cli.runs.rundir import runs_root
    from rl_backend.gateway import resolver
    from rl_backend.netaddr import is_loopback_host

    console = stderr_console()
    if port < 0 or port > 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {port}")
    if not request_timeout > 0:
        raise UsageError(f"--request-timeout must be a positive number of seconds, got {request_timeout:g}")
    generated = False
    if not admin_token:
        if in_cluster or not is_loopback_host(host or "127.0.0.1"):
            raise UsageError(
                f"refusing to serve the gateway on {host or 'the pod network'} without an admin token: anyone who "
                "can reach it could register rollouts and pause it",
                hint=f"export {ADMIN_TOKEN_ENV}=$(openssl rand -hex 24), or pass --admin-token",
            )
        admin_token, generated = secrets.token_urlsafe(24), True  # loopback: a fresh one, shown once below
    if host is not None:
        hosts = [host]
    elif in_cluster:
        from rl_backend.gateway.listen import NoPodAddress, pod_hosts

        try:
            hosts = pod_hosts(os.environ)
        except NoPodAddress as exc:
            raise UsageError(str(exc), hint="set POD_IP from the downward API (fieldRef: status.podIP), or pass "
                             "--host with the address to listen on") from None
    else:
        hosts = ["127.0.0.1"]
    specs: dict[str, UpstreamSpec] = {}
    declared_model = None
    prices: dict[str, PriceSpec] = {}
    spec_file = config or (Path("agl.yaml") if not upstream and Path("agl.yaml").is_file() else None)
    if spec_file is not None:
        specs, declared_model, prices = upstreams_from_yaml(spec_file)
    for flag in upstream or []:
        name, spec = parse_upstream_flag(flag)
        specs[name] = spec
    if not specs:
        raise UsageError("no upstreams: give an agl.yaml with `upstreams:`, or --upstream name=kind:url")
    key_envs = _pairs(api_key_env, "--api-key-env")
    unknown = (set(token_ids or []) | set(key_envs)) - set(specs)
    if unknown:
        raise UsageError(f"--token-ids/--api-key-env name upstreams that do not exist: {', '.join(sorted(unknown))}")
    default_model = resolver.default_model(specs, model or declared_model)
    store_path = store or runs_root(None).parent / "gateway" / "store.sqlite"
    # Paths in agl.yaml (a recording, `record_to`) are relative to its folder; those of flags to this one.
    base = (spec_file if spec_file.is_dir() else spec_file.parent).resolve() if spec_file is not None else Path.cwd()
    # In a cluster, `kind: embedded` upstreams are the policy a trainer trains: their servers register later.
    policy = [name for name, spec in specs.items() if spec.kind == "embedded"] if in_cluster else []
    try:
        with resolver.started_upstreams(specs, resolve=lambda relative: base / Path(relative).expanduser(),
                                        policy=policy, token_ids=token_ids or [], key_envs=key_envs,
                                        log=console.print) as started:
            from rl_backend.store.redact import short_secrets, short_secrets_note

            if note := short_secrets_note(short_secrets({f"the key of upstream {name}": up.api_key
                                                         for name, up in started.resolved.items()})):
                console.print(f"note: {note}", markup=False)
            ready: dict[str, Any] = {"store": str(store_path.resolve()), "upstreams": sorted(started.resolved),
                                     "default_model": default_model, "pid": os.getpid(), "listen": hosts}
            if generated:
                ready["admin_token"] = admin_token

            def announce(url: str) -> None:
                ready["url"] = url
                if json_output:
                    print_json(ready)
                else:
                    console.print(f"gateway listening on {url} (store {ready['store']})")
                    if generated:
                        console.print(f"admin token (generated; set {ADMIN_TOKEN_ENV} to choose one): {admin_token}")

            summary = _serve(started.resolved, store_path, default_model, admin_token, hosts, port, announce, prices,
                             request_timeout, durable=in_cluster)
    except resolver.UpstreamSetupError as exc:
        raise ConfigError(str(exc), hint=exc.hint) from None
    console.print(f"gateway stopped: {summary['calls_recorded']} calls recorded in {store_path}")


def _serve(upstreams: dict[str, ResolvedUpstream], store_path: Path, default_model: str | None, admin_token: str,
           hosts: list[str], port: int, announce: Any, prices: dict[str, PriceSpec],
           request_timeout: float, *, durable: bool = False) -> dict[str, Any]:
    """Run uvicorn in this thread (uvloop when installed, signals handled) until SIGINT/SIGTERM, listening on every
    address of `hosts`, on one port. `durable`: the admin state (rollouts, the policy's servers, the pause) is kept
    next to the store and restored from there, so a restarted cluster gateway carries on (rl_backend.store.gateway_state)."""
    import logging
    import signal

    import uvicorn

    from agl_cli.errors import ConfigError
    from rl_backend.gateway.app import Gateway
    from rl_backend.store.db import RunStore

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from rl_backend.store.gateway_state import AdminState, state_path

    store = RunStore(store_path)
    admin_state = AdminState(state_path(store_path)) if durable else None
    try:
        try:
            gateway = Gateway(upstreams, store, default_model=default_model, admin_token=admin_token, prices=prices,
                              durable=admin_state)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        from rl_backend.gateway.coalescing_http import CoalescingHttpToolsProtocol
        from rl_backend.gateway.http_guard import guarded
        from rl_backend.gateway.listen import bind_sockets

        config = uvicorn.Config(
            gateway.app, port=port, log_level="warning", access_log=False, lifespan="on",
            timeout_graceful_shutdown=10, timeout_keep_alive=30, backlog=4096,
            # A response's head and body leave in one write; a request must arrive in time.
            http=guarded(request_timeout, CoalescingHttpToolsProtocol),
            proxy_headers=False,  # nothing here reads the client address: skip that middleware
        )
        try:
            socks = bind_sockets(hosts, port)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {', '.join(hosts)} port {port}: {exc}") from None
        shown = f"[{hosts[0]}]" if ":" in hosts[0] else hosts[0]
        gateway.base_url = f"http://{shown}:{socks[0].getsockname()[1]}"

        class _Server(uvicorn.Server):
            async def startup(self, sockets: list[Any] | None = None) -> None:
                await super().startup(sockets)
                if self.started:
                    announce(gateway.base_url)

        # uvicorn stops gracefully on SIGINT/SIGTERM, then re-raises the signal to the handlers it found: make those
        # no-ops, so this process closes its store and exits normally instead of dying there.
        previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            _Server(config).run(sockets=socks)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return gateway.state_dict()
    finally:
        if admin_state is not None:
            admin_state.close()
        store.close()


# -- export ----------------------------------------------------------------------------------------------------------


def open_store_of(reference: str, runs_dir: Path | None) -> Path:
    """A store file, a run folder, or a run id (prefix, `latest`) -> the store's path."""
    from agl_cli.errors import UsageError
    from agl_cli.runs.rundir import STORE, find_run

    path = Path(reference)
    if path.is_file():
        return path
    if path.is_dir() and (path / STORE).is_file():
        return path / STORE
    store_path = find_run(reference, runs_dir).store_path
    if not store_path.is_file():
        raise UsageError(f"run {reference!r} has no {STORE}")
    return store_path


@app.command("export")
@handle_errors
def export_command(
    run_or_store: Annotated[str, typer.Argument(help="A run id (or prefix, or `latest`), a run folder, or a store.sqlite file.")],  # noqa: E501
    format_: Annotated[ExportFormat, typer.Option("--format", help="jsonl: one CallRecord per line; otlp: OpenTelemetry GenAI spans (OTLP/JSON lines).")] = ExportFormat.jsonl,  # noqa: E501
    out: Annotated[Optional[Path], typer.Option(help="Write here instead of stdout.")] = None,  # noqa: UP045
    endpoint: Annotated[Optional[str], typer.Option(help="With --format otlp: send the spans to this OTLP/HTTP endpoint instead (needs agl[otel]).")] = None,  # noqa: UP045,E501
    rollout: Annotated[Optional[str], typer.Option(help="Only this rollout's calls.")] = None,  # noqa: UP045
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where runs live.")] = None,  # noqa: UP045
) -> None:
    """Export the recorded model calls of a run (or of a gateway's store)."""
    import contextlib
    import json
    import sys

    from agl_cli.console import stderr_console
    from agl_cli.errors import UsageError
    from rl_backend.gateway import export
    from rl_backend.store.db import RunStore

    if endpoint is not None and (format_ is not ExportFormat.otlp or out is not None):
        raise UsageError("--endpoint sends OTLP spans: use it with --format otlp and without --out")
    if endpoint is not None and not export.otlp_exporter_available():
        raise UsageError("sending to an OTLP endpoint needs the OpenTelemetry exporter",
                         hint="pip install 'agl[otel]' (or opentelemetry-exporter-otlp-proto-http), or write a file with --out")
    if out is not None and not out.parent.is_dir():
        raise UsageError(f"--out {out}: the folder {out.parent} does not exist",
                         hint=f"create it first (mkdir -p {out.parent}), or write elsewhere")
    if out is not None and out.is_dir():
        raise UsageError(f"--out {out} is a folder: give the file to write, e.g. --out {out / 'calls.jsonl'}")
    store = RunStore(open_store_of(run_or_store, runs_dir))
    try:
        records = store.calls(rollout)
    finally:
        store.close()
    console = stderr_console()
    if endpoint is not None:
        try:
            sent = export.send_otlp(records, endpoint, version=installed_version())
        except RuntimeError as exc:
            from agl_cli.errors import AglError

            raise AglError(str(exc)) from None
        console.print(f"sent {sent} spans to {endpoint}")
        return
    if format_ is ExportFormat.jsonl:
        lines: Any = export.jsonl_lines(records)
    else:
        requests = export.otlp_requests(records, version=installed_version())
        lines = (json.dumps(doc, separators=(",", ":")) + "\n" for doc in requests)
    if out is None:
        sys.stdout.writelines(lines)
        sys.stdout.flush()
    else:
        tmp = out.with_name(out.name + ".tmp")
        try:
            with tmp.open("w", encoding="utf-8") as fh:
                fh.writelines(lines)
            tmp.replace(out)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise UsageError(f"--out {out}: cannot write it ({exc.strerror})") from None
    console.print(f"exported {len(records)} calls" + (f" to {out}" if out else ""))
