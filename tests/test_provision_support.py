"""Shared by the tests/test_provision_*.py files (no tests here): an in-memory cluster (kmock) that serves every kind
a provision touches, an agl.yaml to provision, and stand-ins for the controllers kmock lacks.

kmock stores objects and serves them; nothing acts on them. The tests play the Deployment controller, the
EndpointSlice controller, the Job controller and the kubelet by hand, through the same HTTP API: they create the
pods, patch statuses, add endpoints and events, and serve pod logs (tests/helpers/kubelet.py's PodLogs).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import kubernetes.client  # noqa: F401 - loaded once here, not on a provision's thread during a timed wait
import kubernetes.config  # noqa: F401
import kubernetes_validate.utils
import pytest
import yaml
from rich.console import Console

from agl_cli.commands.train_k8s import target_from_spec  # noqa: E402
from agl_cli.spec.schema import load_spec  # noqa: E402
from rl_backend.provision.options import Names, ProvisionOptions  # noqa: E402
from rl_backend.provision.session import ProvisionResult, provision  # noqa: E402
from rl_backend.provision.target import TrainTarget  # noqa: E402
from tests.helpers.kubelet import PodLogs, now

_ORIGINAL_SCHEMA = kubernetes_validate.utils.schema_contents
NS = "default"
KUBERAY_NS = "ray-system"
UPSTREAM_KEY = "sk-upstream-REAL-KEY-never-in-a-manifest-7c6b5a"
ADMIN_TOKEN = "admin-token-for-tests-0f1e2d3c4b5a69788796"
POLICY_KEY = "policy-key-for-tests-a1b2c3d4e5f60718293a"
NAMES = Names("calc")
RESOURCES = {
    "v1/serviceaccounts": True, "rbac.authorization.k8s.io/v1/roles": True,
    "rbac.authorization.k8s.io/v1/rolebindings": True, "v1/secrets": True, "v1/configmaps": True,
    "v1/persistentvolumeclaims": True, "v1/services": True, "apps/v1/deployments": True, "batch/v1/jobs": True,
    "v1/pods": True, "v1/events": True, "discovery.k8s.io/v1/endpointslices": True,
    "networking.k8s.io/v1/networkpolicies": True, "policy/v1/poddisruptionbudgets": True, "apps/v1/daemonsets": True,
}
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts", "Secret": "/api/v1/namespaces/{ns}/secrets",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps", "Service": "/api/v1/namespaces/{ns}/services",
    "PersistentVolumeClaim": "/api/v1/namespaces/{ns}/persistentvolumeclaims",
    "Pod": "/api/v1/namespaces/{ns}/pods", "Event": "/api/v1/namespaces/{ns}/events",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments", "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "EndpointSlice": "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
    "RayJob": "/apis/ray.io/v1/namespaces/{ns}/rayjobs",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
}

AGL_YAML: dict[str, Any] = {
    "name": "calc",
    "agent": {"command": "python agent.py --task {task_file} --out {output_file}", "timeout_s": 60},
    "tasks": {"path": "tasks.jsonl"},
    "grader": {"command": "python grade.py {task_file} {output_file}"},
    "upstreams": {"openai": {"kind": "openai"}, "claude": {"kind": "anthropic", "api_key_env": "CLAUDE_KEY"}},
    "model": "openai/gpt-4.1-mini",
    "knobs": {"system_prompt": {"files": ["prompts/a.md"], "via": "gateway"}},
    "runner": "kubernetes",
    "kubernetes": {"image": "registry.example/calc-agent:1", "kubeconfig": "~/.kube/laptop"},
}


def write_project(folder: Path, **overrides: Any) -> Path:
    (folder / "prompts").mkdir(parents=True, exist_ok=True)
    (folder / "prompts" / "a.md").write_text("You are careful.\nShow your work.\n")
    (folder / "tasks.jsonl").write_text("".join(json.dumps({"id": i, "q": f"{i}+1"}) + "\n" for i in range(3)))
    (folder / "grade.py").write_text("print(1.0)\n")
    spec = {**AGL_YAML, **overrides}
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class Emulator(kmock.KubernetesEmulator):
    """kmock, plus what a real API server adds to every object it creates: a uid (ownerReferences point at it)."""

    async def _handle(self, request: Any) -> Any:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            metadata = request.data.setdefault("metadata", {})
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", now())
        return await super()._handle(request)


def load_target(path: Path) -> TrainTarget:
    return target_from_spec(load_spec(path), path)


@pytest.fixture(autouse=True)
def fast_schemas(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubernetes-validate re-reads its (large) schema files on every call; the tests validate hundreds of
    manifests, so they read each file once. Behaviour is unchanged: the schemas are only read, never modified."""
    import kubernetes_validate.utils

    monkeypatch.setattr(kubernetes_validate.utils, "schema_contents", _cached_schema)


@functools.cache
def _cached_schema(filename: str, desired_version: str) -> Any:
    return _ORIGINAL_SCHEMA(filename, desired_version)


def options(**overrides: Any) -> ProvisionOptions:
    base: dict[str, Any] = {"poll_s": 0.2, "timeout_s": 15.0, "retry_backoff_s": 0.01, "follow": False}
    return ProvisionOptions(**{**base, **overrides})


def consoles() -> tuple[Console, Console, io.StringIO, io.StringIO]:
    err, out = io.StringIO(), io.StringIO()
    return Console(file=err, width=200, no_color=True), Console(file=out, width=200, no_color=True), err, out


@contextlib.asynccontextmanager
async def cluster(*, kuberay: bool = False, user_keys: bool = True,
                  ) -> AsyncIterator[tuple[kmock.KubernetesEmulator, Any, PodLogs]]:
    """kmock with every kind a provision uses (and KubeRay's RayJob CRD when asked), the official client on it, and
    the user's Secret with the upstream keys (unless `user_keys` is off)."""
    from kubernetes import client

    async with Emulator() as server, kmock.Server(server) as http:
        for resource, namespaced in RESOURCES.items():
            server.resources[resource] = kmock.ResourceInfo(namespaced=namespaced)
        if kuberay:
            server.resources[CRDS] = kmock.ResourceInfo(namespaced=False)
            server.resources["ray.io/v1/rayjobs"] = kmock.ResourceInfo(namespaced=True)
            server.objects[CRDS, None, "rayjobs.ray.io"] = {
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "rayjobs.ray.io"}}
            # The operator's Deployment, as KubeRay's Helm chart labels it: the provision looks up its namespace.
            server.objects["apps/v1/deployments", KUBERAY_NS, "kuberay-operator"] = {
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "kuberay-operator", "namespace": KUBERAY_NS,
                             "labels": {"app.kubernetes.io/name": "kuberay-operator"}}}
        if user_keys:
            server.objects["v1/secrets", NS, "agl-upstream-keys"] = {
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "agl-upstream-keys", "namespace": NS},
                "data": {"OPENAI_API_KEY": "c2stb3BlbmFp", "CLAUDE_KEY": "c2stY2xhdWRl"}}
        logs = PodLogs(server)
        configuration = client.Configuration()
        configuration.host = str(http.url).rstrip("/")
        api = client.ApiClient(configuration)
        try:
            yield server, api, logs
        finally:
            api.close()


def run_provision(api: Any, target: TrainTarget, opts: ProvisionOptions,
                  err: Console, out: Console) -> asyncio.Future[ProvisionResult]:
    """The provision on a worker thread (the client is blocking), so the test's loop keeps serving kmock."""
    tokens = iter([ADMIN_TOKEN, POLICY_KEY])  # in the order the Secrets are created (admin token first)
    return asyncio.ensure_future(asyncio.to_thread(
        provision, target, opts, console=err, out=out, api_client=api, token=lambda: next(tokens)))


async def get(server: kmock.KubernetesEmulator, kind: str, name: str | None = None,
              ns: str = NS) -> Any:
    path = PATHS[kind].format(ns=ns) + (f"/{name}" if name else "")
    async with server.get(path) as response:
        if response.status == 404:
            return None
        body = await response.json()
        return body["items"] if name is None else body


async def create(server: kmock.KubernetesEmulator, kind: str, obj: dict[str, Any], ns: str = NS) -> None:
    async with server.post(PATHS[kind].format(ns=ns), json=obj) as response:
        assert response.status in (200, 201), await response.text()


async def patch_status(server: kmock.KubernetesEmulator, kind: str, name: str, status: dict[str, Any],
                       ns: str = NS) -> None:
    async with server.patch(PATHS[kind].format(ns=ns) + f"/{name}/status", json={"status": status}) as response:
        assert response.status == 200, await response.text()


async def wait_for(server: kmock.KubernetesEmulator, kind: str, name: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (found := await get(server, kind, name)) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{kind}/{name} was never created")
        await asyncio.sleep(0.02)
    return dict(found)


def stored(server: kmock.KubernetesEmulator) -> list[dict[str, Any]]:
    """Every live object kmock holds (whatever kind), as the API would return it."""
    return [obj.raw for _, obj in server.objects.items() if not obj.deleted]


def stored_names(server: kmock.KubernetesEmulator) -> set[str]:
    return {f"{o.get('kind')}/{o['metadata']['name']}" for o in stored(server)}


async def pod_for(server: kmock.KubernetesEmulator, template: dict[str, Any], name: str, *, phase: str = "Running",
                  extra_labels: dict[str, str] | None = None, status: dict[str, Any] | None = None) -> str:
    """A pod from a pod template, as its controller would make it, with a status."""
    labels = {**(template.get("metadata") or {}).get("labels", {}), **(extra_labels or {})}
    await create(server, "Pod", {"apiVersion": "v1", "kind": "Pod",
                                 "metadata": {"name": name, "namespace": NS, "labels": labels,
                                              "creationTimestamp": now()},
                                 "spec": template["spec"], "status": {"phase": "Pending"}})
    await patch_status(server, "Pod", name, {"phase": phase, **(status or {})})
    return name


async def gateway_up(server: kmock.KubernetesEmulator, names: Names = NAMES) -> None:
    """The Deployment controller and the kubelet: a running gateway pod, the Deployment available, an endpoint."""
    deployment = await wait_for(server, "Deployment", names.gateway)
    pod = await pod_for(server, deployment["spec"]["template"], f"{names.gateway}-7d9f-abcde")
    await patch_status(server, "Deployment", names.gateway, {
        "replicas": 1, "availableReplicas": 1, "readyReplicas": 1,
        "conditions": [{"type": "Available", "status": "True"}, {"type": "Progressing", "status": "True"}]})
    await create(server, "EndpointSlice", {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": f"{names.gateway}-x1", "namespace": NS,
                     "labels": {"kubernetes.io/service-name": names.gateway}},
        "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": True}, "targetRef": {"name": pod}}]})


async def trainer_pod(server: kmock.KubernetesEmulator, names: Names = NAMES, *, phase: str = "Running",
                      status: dict[str, Any] | None = None) -> str:
    job = await wait_for(server, "Job", names.trainer)
    return await pod_for(server, job["spec"]["template"], f"{names.trainer}-q2w3e", phase=phase,
                         extra_labels={"job-name": names.trainer}, status=status)


async def event(server: kmock.KubernetesEmulator, about: str, reason: str, message: str, kind: str = "Pod") -> None:
    await create(server, "Event", {
        "apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": reason, "message": message,
        "metadata": {"name": f"{about}.{reason.lower()}", "namespace": NS},
        "involvedObject": {"kind": kind, "name": about, "namespace": NS}, "lastTimestamp": now()})
