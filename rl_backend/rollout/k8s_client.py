"""The Kubernetes API as the controller uses it: credentials, blocking calls moved off the event loop, raw JSON.

Objects stay the API's JSON (dicts, camelCase) rather than the client's model classes: that is what templates,
watch events and the checks in k8s_status speak, and it needs no deserialization per event.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rl_backend.rollout.k8s_spec import KubernetesSpec
from rl_backend.rollout.k8s_watch import labels_match


class KubernetesConfigError(RuntimeError):
    """A problem every rollout would hit (no cluster access, an invalid template, an unreachable gateway):
    raised from `run`, not reported as one failed rollout."""


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

    def __init__(self, api_client: Any, namespace: str, max_workers: int = 8) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.namespace = namespace
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.pool = ThreadPoolExecutor(max_workers, thread_name_prefix="agl-k8s")

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    async def json(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Call an API method and return the response body as JSON (skipping the client's model classes)."""
        response = await self.call(fn, *args, _preload_content=False, **kwargs)
        data = response.data
        return dict(json.loads(data)) if data else {}

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
        response: Any = self.core.read_namespaced_pod_log(
            pod_name, self.namespace, container=container, _preload_content=False, _request_timeout=(10, 300)
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
