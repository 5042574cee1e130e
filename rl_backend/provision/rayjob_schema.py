"""Validating a RayJob offline: against KubeRay's own CRD schema (ray.io/v1, shipped in schemas/rayjob-v1.json),
with the Kubernetes types inside it (metadata, the head, worker and submitter pod templates) checked against the
Kubernetes schema that kubernetes-validate ships.

Strict like `kubectl apply`'s field validation: a field the CRD does not define is an error (an API server would
drop it silently, and the RayJob would run without it). CEL rules (x-kubernetes-validations) are the API server's
to check; agl's own checks below cover the ones its manifests could break.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from rl_backend.rollout.k8s_manifest import ManifestError, validate_schema

SCHEMA_FILE = Path(__file__).parent / "schemas" / "rayjob-v1.json"
POD_TEMPLATE = "io.k8s.api.core.v1.PodTemplateSpec"


def _strict(node: Any) -> Any:
    """Closed objects: where a schema lists properties and says nothing of others, others are errors."""
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@functools.cache
def _validator() -> Any:
    import jsonschema

    document = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return jsonschema.Draft7Validator(_strict(copy.deepcopy(document["schema"])))


def kuberay_version() -> str:
    return str(json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))["kuberay_version"])


def _pod_template(template: Any, where: str, kubernetes_version: str) -> None:
    if not isinstance(template, dict):
        raise ManifestError(f"{where} must be a pod template")
    wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
    try:
        validate_schema(wrapper, kubernetes_version)
    except ManifestError as exc:
        raise ManifestError(f"{where}: {exc}".replace("the PodTemplate manifest", "the pod template")) from None


def validate_rayjob(manifest: dict[str, Any], kubernetes_version: str) -> None:
    """Raise ManifestError naming the first field that KubeRay's schema or Kubernetes' would refuse."""
    if manifest.get("apiVersion") != "ray.io/v1" or manifest.get("kind") != "RayJob":
        raise ManifestError(f"{manifest.get('apiVersion')} {manifest.get('kind')} is not a ray.io/v1 RayJob")
    errors = sorted(_validator().iter_errors(manifest), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.absolute_path) or "(top)"
        raise ManifestError(f"the RayJob is not valid for KubeRay's CRD ({kuberay_version()}): at {where}: "
                            f"{first.message}")
    validate_schema({"apiVersion": "v1", "kind": "ConfigMap", "metadata": manifest.get("metadata")}, kubernetes_version)
    spec = manifest.get("spec") or {}
    if not str(spec.get("entrypoint") or "").strip():
        raise ManifestError("spec.entrypoint must be the command line the Ray job runs")
    cluster = spec.get("rayClusterSpec") or {}
    if "headGroupSpec" not in cluster:
        raise ManifestError("spec.rayClusterSpec.headGroupSpec is required")
    _pod_template(cluster["headGroupSpec"].get("template"), "spec.rayClusterSpec.headGroupSpec.template",
                  kubernetes_version)
    for index, group in enumerate(cluster.get("workerGroupSpecs") or []):
        where = f"spec.rayClusterSpec.workerGroupSpecs[{index}]"
        _pod_template(group.get("template"), f"{where}.template", kubernetes_version)
        low, count, high = group.get("minReplicas"), group.get("replicas", group.get("minReplicas")), \
            group.get("maxReplicas")
        if not low <= count <= high:
            raise ManifestError(f"{where}: replicas must lie between minReplicas and maxReplicas")
    if "submitterPodTemplate" in spec:
        _pod_template(spec["submitterPodTemplate"], "spec.submitterPodTemplate", kubernetes_version)
