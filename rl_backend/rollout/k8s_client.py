"""The Kubernetes API as the controller uses it: credentials, blocking calls moved off the event loop, raw JSON,
a timeout on every request, and retries through an outage.

Objects stay the API's JSON (dicts, camelCase) rather than the client's model classes: that is what templates,
watch events and the checks in k8s_status speak, and it needs no deserialization per event.

Every request carries `request_timeout_s` (connect, then read): an API server that accepts connections and never
answers costs one timeout, not the run. `retrying` rides out an outage — refused connections, timeouts, 429 and
5xx answers — with growing pauses, for up to `api_retry_s`; only an API that stays unreachable that long ends the
run, with KubernetesUnavailableError saying so.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from rl_backend.rollout.k8s_spec import KubernetesSpec
from rl_backend.rollout.k8s_watch import labels_match

T = TypeVar("T")
RETRYABLE = {429, 500, 502, 503, 504}


class KubernetesConfigError(RuntimeError):
    """A problem every rollout would hit (no cluster access, an invalid template, an unreachable gateway):
    raised from `run`, not reported as one failed rollout."""


class KubernetesUnavailableError(KubernetesConfigError):
    """The Kubernetes API stayed unreachable (or kept failing) for longer than `api_retry_s`: the run ends."""


def transient(exc: BaseException) -> bool:
    """A failure that waiting may cure: no connection, no answer in time, an overloaded or failing server."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        return exc.status in RETRYABLE or exc.status == 0  # 0: the client's own wrapper of a transport error
    return isinstance(exc, (HTTPError, OSError))


def describe(exc: BaseException) -> str:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}: {api_message(exc)}".strip(": ")
    return str(exc) or type(exc).__name__


def load_client(spec: KubernetesSpec, base_dir: Path) -> Any:
    """An ApiClient from, in order: `kubernetes.kubeconfig`, in-cluster credentials when agl runs in a pod
    (and no kubeconfig is around), else $KUBECONFIG or ~/.kube/config; `kubernetes.context` picks the context."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if spec.kubeconfig:
            path = (base_dir / spec.kubeconfig).expanduser()
            config.load_kube_config(str(path), context=spec.context, client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and not (
            os.environ.get("KUBECONFIG") or Path("~/.kube/config").expanduser().is_file()
        ):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(context=spec.context, client_configuration=configuration)
    except Exception as exc:  # noqa: BLE001 - the loaders raise many kinds; all mean "no cluster access"
        raise KubernetesConfigError(f"cannot load Kubernetes credentials: {exc}") from None
    return client.ApiClient(configuration)


def api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message", exc.body))
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "body", "") or "")


class KubeApi:
    """Blocking client calls run on a private pool, so neither the event loop nor its default executor (shared
    with the rest of agl) waits on the cluster."""

    def __init__(self, api_client: Any, namespace: str, max_workers: int = 8, *, request_timeout_s: float = 30.0,
                 api_retry_s: float = 300.0, backoff_max_s: float = 10.0) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.namespace = namespace
        self.request_timeout_s, self.api_retry_s, self.backoff_max_s = request_timeout_s, api_retry_s, backoff_max_s
        self.retries = 0  # transient failures ridden out, for diagnostics and tests
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.pool = ThreadPoolExecutor(max_workers, thread_name_prefix="agl-k8s")

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def timeout(self) -> tuple[float, float]:
        return (self.request_timeout_s, self.request_timeout_s)

    async def json(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Call an API method and return the response body as JSON (skipping the client's model classes)."""
        kwargs.setdefault("_request_timeout", self.timeout())
        response = await self.call(fn, *args, _preload_content=False, **kwargs)
        data = response.data
        return dict(json.loads(data)) if data else {}

    async def retrying(self, doing: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()` until it succeeds or fails for good; transient failures are retried, with pauses growing to
        `backoff_max_s`, until `api_retry_s` has passed since the first one."""
        first: float | None = None
        pause = min(0.2, self.backoff_max_s)
        while True:
            try:
                return await attempt()
            except Exception as exc:  # noqa: BLE001 - sorted below: transient ones wait, others propagate
                if not transient(exc):
                    raise
                now = time.monotonic()
                first = now if first is None else first
                if now - first >= self.api_retry_s:
                    host = getattr(getattr(self.api_client, "configuration", None), "host", "the cluster")
                    raise KubernetesUnavailableError(
                        f"{doing}: the Kubernetes API at {host} has not answered for {now - first:.0f} s "
                        f"(last: {describe(exc)}); agl gave up (kubernetes.api_retry_s is {self.api_retry_s:g} s)"
                    ) from None
                self.retries += 1
                await asyncio.sleep(min(pause, max(0.0, first + self.api_retry_s - now)))
                pause = min(pause * 2, self.backoff_max_s)

    async def delete_job(self, name: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            # Background propagation: the pods go with the Job (the API's default for Jobs orphans them).
            await self.json(self.batch.delete_namespaced_job, name, self.namespace, propagation_policy="Background")
            return True
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False

    async def delete_jobs(self, selector: Mapping[str, str]) -> int:
        """Delete every Job carrying `selector`, with their pods. Returns how many were deleted by name."""
        from kubernetes.client.exceptions import ApiException

        text = ",".join(f"{k}={v}" for k, v in selector.items())
        try:
            await self.json(
                self.batch.delete_collection_namespaced_job, self.namespace, label_selector=text,
                propagation_policy="Background",
            )
        except ApiException as exc:
            if exc.status not in {404, 405}:  # a server without collection deletes: one by one below
                raise
        # Whatever is left (a server without collection deletes, a Job created meanwhile) goes by name.
        listed = await self.json(self.batch.list_namespaced_job, self.namespace, label_selector=text)
        names = [
            job["metadata"]["name"] for job in listed.get("items") or []
            if labels_match(job, selector) and not job["metadata"].get("deletionTimestamp")
        ]
        deleted = 0
        for name in names:
            deleted += await self.delete_job(name)
        return deleted

    async def apply_policy(self, manifest: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            await self.json(self.networking.create_namespaced_network_policy, self.namespace, manifest)
        except ApiException as exc:
            if exc.status != 409:  # 409: this run's policy exists already (a resumed run), which is what we want
                raise KubernetesConfigError(
                    f"cannot create the NetworkPolicy: {exc.status} {exc.reason}: {api_message(exc)}"
                ) from None

    async def delete_policy(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            await self.json(self.networking.delete_namespaced_network_policy, name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def stream_log(self, pod_name: str, container: str, feed: Callable[[bytes], None]) -> None:
        """Blocking: stream a container's log into `feed` (run it through `call`)."""
        # Read timeout: the longest silence tolerated while the log streams (the pod has ended: it is all there).
        response: Any = self.core.read_namespaced_pod_log(
            pod_name, self.namespace, container=container, _preload_content=False,
            _request_timeout=self.timeout(),
        )
        try:
            for chunk in response.stream(65536, decode_content=True):
                feed(chunk)
        finally:
            response.release_conn()

    def close(self, own_client: bool) -> None:
        self.pool.shutdown(wait=False)
        if own_client:
            self.api_client.close()


async def check_not_service_ips(api: KubeApi, policy: Mapping[str, Any]) -> None:
    """Refuse an ipBlock of one address that is a Service's ClusterIP: NetworkPolicy matches the pods' own
    addresses (after the Service is resolved to them), so a rule for a ClusterIP never matches and the rollout
    pods could not reach the gateway. Looks in every namespace when allowed, else in the run's own."""
    import ipaddress

    from kubernetes.client.exceptions import ApiException

    singles = set()
    for rule in (policy.get("spec") or {}).get("egress") or []:
        for peer in rule.get("to") or []:
            cidr = (peer.get("ipBlock") or {}).get("cidr")
            if cidr:
                network = ipaddress.ip_network(cidr, strict=False)
                if network.num_addresses == 1:
                    singles.add(str(network.network_address))
    if not singles:
        return
    body: dict[str, Any] | None = None
    for fn, args in ((api.core.list_service_for_all_namespaces, ()),
                     (api.core.list_namespaced_service, (api.namespace,))):
        try:
            body = await api.json(fn, *args)
            break
        except ApiException as exc:
            if exc.status not in (401, 403):
                raise
    for service in (body or {}).get("items") or []:
        spec = service.get("spec") or {}
        ips = set(spec.get("clusterIPs") or []) | ({spec["clusterIP"]} if spec.get("clusterIP") else set())
        for ip in sorted(ips & singles):
            meta = service.get("metadata") or {}
            raise KubernetesConfigError(
                f"network_policy: {ip} is the ClusterIP of Service {meta.get('namespace')}/{meta.get('name')}; a "
                "NetworkPolicy matches pod addresses, never a Service's, so rollout pods could not reach it. Use "
                "network_policy.gateway_pod_selector (and gateway_namespace_selector) for an in-cluster gateway, or "
                "gateway_cidrs with the address of the host or pods that serve it"
            )
