"""The official Kubernetes client, per kind, as a provision uses it: create, read, merge-patch, delete, list.

Objects stay the API's JSON (dicts, camelCase), as in the rollout controller (rl_backend/rollout/k8s_client.py).
Lists are filtered by label here too: a server may ignore the label selector (the in-memory test server does), and
`stop` must never delete what is not the train's. Calls are blocking; a provision is a short sequence of them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rl_backend.provision.options import ClusterOptions, ProvisionError
from rl_backend.rollout.k8s_watch import labels_match

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = (10, 60)  # connect, read (s): a provision waits on the cluster by polling, never on one request


@dataclass(frozen=True)
class Kind:
    """How the client names one kind: typed methods `<verb>_namespaced_<snake>` on `api`, or custom objects."""

    kind: str
    api: str  # CoreV1Api, AppsV1Api, ... or CustomObjectsApi
    snake: str = ""
    group: str = ""
    version: str = "v1"
    plural: str = ""


KINDS: dict[str, Kind] = {k.kind: k for k in (
    Kind("ServiceAccount", "CoreV1Api", "service_account"),
    Kind("Role", "RbacAuthorizationV1Api", "role"),
    Kind("RoleBinding", "RbacAuthorizationV1Api", "role_binding"),
    Kind("Secret", "CoreV1Api", "secret"),
    Kind("ConfigMap", "CoreV1Api", "config_map"),
    Kind("PersistentVolumeClaim", "CoreV1Api", "persistent_volume_claim"),
    Kind("Service", "CoreV1Api", "service"),
    Kind("NetworkPolicy", "NetworkingV1Api", "network_policy"),
    Kind("PodDisruptionBudget", "PolicyV1Api", "pod_disruption_budget"),
    Kind("Deployment", "AppsV1Api", "deployment"),
    Kind("Job", "BatchV1Api", "job"),
    Kind("RayJob", "CustomObjectsApi", group="ray.io", version="v1", plural="rayjobs"),
    Kind("Pod", "CoreV1Api", "pod"),
    Kind("Event", "CoreV1Api", "event"),
    Kind("EndpointSlice", "DiscoveryV1Api", "endpoint_slice"),
)}
# The order a provision applies in; `stop` deletes in reverse (the trainer first, the owner last).
APPLY_ORDER = ["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Secret", "NetworkPolicy",
               "PersistentVolumeClaim", "Service", "PodDisruptionBudget", "Deployment", "Job", "RayJob"]


def load_api_client(cluster: ClusterOptions) -> Any:
    """An ApiClient from --kubeconfig/--context, $KUBECONFIG or ~/.kube/config, or in-cluster credentials."""
    import os
    from pathlib import Path

    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if cluster.kubeconfig:
            config.load_kube_config(str(Path(cluster.kubeconfig).expanduser()), context=cluster.context,
                                    client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and not (
                os.environ.get("KUBECONFIG") or Path("~/.kube/config").expanduser().is_file()):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(context=cluster.context, client_configuration=configuration)
    except Exception as exc:  # noqa: BLE001 - the loaders raise many kinds; all mean "no cluster access"
        raise ProvisionError(f"cannot load Kubernetes credentials: {exc}",
                             hint="point $KUBECONFIG (or --kubeconfig/--context) at the cluster") from None
    return client.ApiClient(configuration)


def api_error(exc: Any) -> str:
    """`422 Unprocessable Entity: <the server's message>` from an ApiException."""
    try:
        message = str(json.loads(exc.body).get("message", exc.body))
    except (TypeError, ValueError, AttributeError):
        message = str(getattr(exc, "body", "") or "")
    return f"{getattr(exc, 'status', '?')} {getattr(exc, 'reason', '')}: {message}".strip()


@contextlib.contextmanager
def api_errors(doing: str) -> Iterator[None]:
    """An API error nobody handled closer to it becomes a ProvisionError saying what agl was doing (a traceback
    tells the user nothing; `403 Forbidden: ... cannot list pods` does)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        hint = "ask for these permissions in the namespace, or use another one (--namespace)" \
            if exc.status in (401, 403) else None
        raise ProvisionError(f"{doing}: the Kubernetes API answered {api_error(exc)}", hint=hint) from None
    except (HTTPError, OSError) as exc:
        raise ProvisionError(f"{doing}: cannot reach the Kubernetes API ({exc})") from None


def fatal(exc: Exception) -> bool:
    """An API error that polling again will not cure: no credentials or no permission."""
    return getattr(exc, "status", None) in (401, 403)


def selector_text(selector: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector.items())


class Resources:
    """One namespace of one cluster. `call` returns the response body as JSON (skipping the model classes)."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        import kubernetes.client as kclient

        self.api_client, self.namespace = api_client, namespace
        self._apis = {name: getattr(kclient, name)(api_client) for name in {k.api for k in KINDS.values()}}
        self.extensions = kclient.ApiextensionsV1Api(api_client)

    def _json(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        response = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        data = response.data
        return dict(json.loads(data)) if data else {}

    def _method(self, verb: str, kind: str) -> tuple[Any, tuple[Any, ...]]:
        info = KINDS[kind]
        api = self._apis[info.api]
        if info.api == "CustomObjectsApi":
            return getattr(api, f"{verb}_namespaced_custom_object"), (info.group, info.version, self.namespace,
                                                                      info.plural)
        return getattr(api, f"{verb}_namespaced_{info.snake}"), ()

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        fn, prefix = self._method("create", manifest["kind"])
        if prefix:
            return self._json(fn, *prefix, dict(manifest))
        return self._json(fn, self.namespace, dict(manifest))

    def read(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object, or None when there is none (404)."""
        from kubernetes.client.exceptions import ApiException

        fn, prefix = self._method("get" if KINDS[kind].api == "CustomObjectsApi" else "read", kind)
        try:
            return self._json(fn, *prefix, name) if prefix else self._json(fn, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch(self, kind: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch: the fields agl renders replace the object's (lists whole); others stay."""
        fn, prefix = self._method("patch", kind)
        args = (*prefix, name, dict(body)) if prefix else (name, self.namespace, dict(body))
        return self._json(fn, *args, _content_type=MERGE_PATCH)

    def delete(self, kind: str, name: str) -> bool:
        """Delete (pods of Jobs and ReplicaSets of Deployments go too); False when it was already gone."""
        from kubernetes.client.exceptions import ApiException

        fn, prefix = self._method("delete", kind)
        try:
            if prefix:
                self._json(fn, *prefix, name, propagation_policy="Background")
            else:
                self._json(fn, name, self.namespace, propagation_policy="Background")
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def objects(self, kind: str, selector: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Objects carrying `selector` (checked here again), oldest first. A kind the server does not serve
        (a RayJob without KubeRay) lists as empty."""
        from kubernetes.client.exceptions import ApiException

        fn, prefix = self._method("list", kind)
        kwargs = {"label_selector": selector_text(selector)} if selector else {}
        try:
            body = self._json(fn, *prefix, **kwargs) if prefix else self._json(fn, self.namespace, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and KINDS[kind].api == "CustomObjectsApi":
                return []
            raise
        items = [i for i in body.get("items") or [] if not selector or labels_match(i, selector)]
        items.sort(key=lambda i: ((i.get("metadata") or {}).get("creationTimestamp") or "", i["metadata"]["name"]))
        return items

    def events_for(self, names: set[str]) -> list[dict[str, Any]]:
        """Events about any of these objects, oldest first (filtered here: a field selector takes one name)."""
        from kubernetes.client.exceptions import ApiException

        try:
            items = self.objects("Event")
        except ApiException:
            return []  # events only explain a failure; their absence must not hide it
        mine = [e for e in items if (e.get("involvedObject") or {}).get("name") in names]
        mine.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return mine

    def secret_keys(self, name: str) -> set[str] | None:
        """The keys a Secret holds (None: no such Secret). Its values pass through the client, never kept."""
        from kubernetes.client.exceptions import ApiException

        try:
            found = self._json(self._apis["CoreV1Api"].read_namespaced_secret, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return set(found.get("data") or {}) | set(found.get("stringData") or {})

    def crd_installed(self, name: str) -> bool | None:
        """Whether the cluster serves this CRD; None when agl may not look (403: cluster-scoped read denied)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._json(self.extensions.read_custom_resource_definition, name)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status in (401, 403):
                return None
            raise

    def look(self, api: str, method: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """A read beyond the train's namespace (nodes, StorageClasses, DaemonSets): its body, or None when agl may
        not look (401/403) or the cluster does not serve it (404): what it would tell is then unknown."""
        import kubernetes.client as kclient
        from kubernetes.client.exceptions import ApiException

        client = self._apis.get(api) or getattr(kclient, api)(self.api_client)
        try:
            return self._json(getattr(client, method), *args, **kwargs)
        except ApiException as exc:
            if exc.status in (401, 403, 404):
                return None
            raise

    def operator_namespaces(self, labels: Mapping[str, str]) -> list[str] | None:
        """The namespaces of the Deployments carrying `labels` anywhere in the cluster (an operator's); None when
        agl may not look (listing Deployments cluster-wide denied)."""
        from kubernetes.client.exceptions import ApiException

        try:
            body = self._json(self._apis["AppsV1Api"].list_deployment_for_all_namespaces,
                              label_selector=selector_text(labels))
        except ApiException as exc:
            if exc.status in (401, 403):
                return None
            raise
        return sorted({i["metadata"]["namespace"] for i in body.get("items") or [] if labels_match(i, labels)})

    def pod_log(self, pod: str, container: str | None, *, tail_lines: int | None = None,
                previous: bool = False) -> str:
        from kubernetes.client.exceptions import ApiException

        kwargs: dict[str, Any] = {"container": container, "previous": previous}
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        try:
            response = self._apis["CoreV1Api"].read_namespaced_pod_log(
                pod, self.namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as exc:
            if exc.status in (400, 404):  # no such container run (yet), or no previous one
                return ""
            raise
        return bytes(response.data or b"").decode("utf-8", "replace")

    def follow_log(self, pod: str, container: str | None, since_seconds: int | None = None,
                   timestamps: bool = False) -> Iterator[str]:
        """The container's log line by line as it grows, until the container ends or the connection drops. With
        `timestamps`, each line starts with the time the runtime logged it (RFC 3339, nanoseconds) and a space."""
        kwargs: dict[str, Any] = {"container": container, "follow": True}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        if timestamps:
            kwargs["timestamps"] = True
        response = self._apis["CoreV1Api"].read_namespaced_pod_log(
            pod, self.namespace, _preload_content=False, _request_timeout=(10, 600), **kwargs)
        pending = b""
        try:
            for chunk in response.stream(65536, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
            if pending:
                yield pending.decode("utf-8", "replace")
        finally:
            response.release_conn()

    def close(self) -> None:
        self.api_client.close()
