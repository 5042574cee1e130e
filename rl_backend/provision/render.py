"""Manifests from the templates in templates/k8s/provision/, in the order they are applied, each validated before
anything reaches a cluster (and before `--dry-run` prints it).

Validation: built-in kinds against the Kubernetes OpenAPI schema that kubernetes-validate ships (offline, strict).
A RayJob is a custom resource that schema does not know: its metadata and every pod template inside it (head,
workers, submitter) are validated as ObjectMeta and PodTemplateSpec, the RayJob's own fields by agl's checks.
Then, whatever rendered them: every object carries the train's labels, and no upstream key value appears anywhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_backend.provision.options import ANNOTATION_PROVISION, ANNOTATION_SPEC_HASH, Names, ProvisionError
from rl_backend.provision.plan import Topology
from rl_backend.rollout.k8s_manifest import ManifestError, check_no_leak, load_manifest, render_template, validate_schema

TEMPLATES = "k8s/provision"
RAYJOB_NOTE = ("kubernetes-validate has no schema for the RayJob CRD (ray.io/v1): its metadata and pod templates "
               "were validated as ObjectMeta and PodTemplateSpec, its own fields by agl's checks")


@dataclass
class Rendered:
    manifests: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def kind_name(manifest: Mapping[str, Any]) -> str:
    return f"{manifest.get('kind')}/{(manifest.get('metadata') or {}).get('name')}"


def _render(template: str, context: dict[str, Any], **extra: Any) -> dict[str, Any]:
    source = f"{TEMPLATES}/{template}"
    try:
        return load_manifest(render_template(source, **{**context, **extra}), source)
    except ManifestError as exc:
        raise ProvisionError(str(exc)) from None


def render_all(context: dict[str, Any], *, withheld: list[str], kubernetes_version: str) -> Rendered:
    names: Names = context["names"]
    topology: Topology = context["topology"]
    options = context["options"]
    labels = names.labels
    docs = [
        _render("serviceaccount.yaml.j2", context, labels=labels("controller")),
        _render("role.yaml.j2", context, labels=labels("controller")),
        _render("rolebinding.yaml.j2", context, labels=labels("controller")),
        _render("admin-secret.yaml.j2", context, labels=labels("gateway")),
        _render("configmap.yaml.j2", context, labels=labels("config")),
        _render("pvc.yaml.j2", context, name=names.store_pvc, labels=labels("gateway-store"),
                access_mode="ReadWriteOnce", size=options.store_size, storage_class=options.storage_class),
        _render("pvc.yaml.j2", context, name=names.checkpoints, labels=labels("checkpoints"),
                # Several nodes write their shards into one checkpoint: they need a volume they can all mount.
                access_mode="ReadWriteMany" if topology.nodes > 1 else "ReadWriteOnce",
                size=options.checkpoint_size, storage_class=options.storage_class),
        _render("service.yaml.j2", context, name=names.gateway, labels=labels("gateway"),
                selector=labels("gateway"), port=context["gateway_port"]),
        _render("gateway-deployment.yaml.j2", context, labels=labels("gateway"), pod_selector=labels("gateway")),
        _render("service.yaml.j2", context, name=names.policy, labels=labels("policy"),
                selector=labels("trainer"), port=context["policy_port"]),
    ]
    trainer_template = "trainer-job.yaml.j2" if topology.kind == "job" else "trainer-rayjob.yaml.j2"
    trainer = _render(trainer_template, context, labels=labels("trainer"))
    trainer["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = spec_hash(trainer)
    docs.append(trainer)
    notes: list[str] = []
    for manifest in docs:
        validate(manifest, kubernetes_version, names)
    if topology.kind == "rayjob":
        notes.append(RAYJOB_NOTE)
    try:
        check_no_leak({"items": docs}, withheld)
    except ManifestError:
        raise ProvisionError("a rendered manifest contains the value of an upstream key from agl's environment; "
                             "nothing was applied") from None
    return Rendered(docs, notes)


def spec_hash(manifest: Mapping[str, Any]) -> str:
    """What identifies the trainer's desired state: its spec and labels (not the per-run provision id)."""
    meta = manifest.get("metadata") or {}
    basis = {"spec": manifest.get("spec"), "labels": meta.get("labels"), "kind": manifest.get("kind")}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def validate(manifest: dict[str, Any], kubernetes_version: str, names: Names) -> None:
    where = kind_name(manifest)
    try:
        if manifest.get("apiVersion") == "ray.io/v1":
            validate_rayjob(manifest, kubernetes_version)
        else:
            validate_schema(manifest, kubernetes_version)
    except ManifestError as exc:
        raise ProvisionError(f"{where}: {exc}") from None
    meta = manifest.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key, value in names.selector().items():
        if labels.get(key) != value:
            raise ProvisionError(f"{where} must carry the label {key}={value}: `agl train stop` finds it by that")
    if not (meta.get("annotations") or {}).get(ANNOTATION_PROVISION):
        raise ProvisionError(f"{where} must carry the annotation {ANNOTATION_PROVISION}")


def _pod_template(template: Any, where: str, kubernetes_version: str) -> None:
    if not isinstance(template, dict):
        raise ManifestError(f"{where} must be a pod template")
    wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
    try:
        validate_schema(wrapper, kubernetes_version)
    except ManifestError as exc:
        raise ManifestError(f"{where}: {exc}".replace("the PodTemplate manifest", "the pod template")) from None


def validate_rayjob(manifest: dict[str, Any], kubernetes_version: str) -> None:
    """The core fields a RayJob's controller (KubeRay) relies on, and every Kubernetes type embedded in it."""
    if manifest.get("kind") != "RayJob":
        raise ManifestError(f"ray.io/v1 {manifest.get('kind')} is not a kind agl renders")
    validate_schema({"apiVersion": "v1", "kind": "ConfigMap", "metadata": manifest.get("metadata")}, kubernetes_version)
    spec = manifest.get("spec")
    if not isinstance(spec, dict):
        raise ManifestError("the RayJob needs a spec")
    if not isinstance(spec.get("entrypoint"), str) or not spec["entrypoint"].strip():
        raise ManifestError("spec.entrypoint must be the command line the Ray job runs")
    cluster = spec.get("rayClusterSpec")
    if not isinstance(cluster, dict) or not isinstance(cluster.get("headGroupSpec"), dict):
        raise ManifestError("spec.rayClusterSpec.headGroupSpec is required")
    _ray_group(cluster["headGroupSpec"], "spec.rayClusterSpec.headGroupSpec", kubernetes_version)
    groups = cluster.get("workerGroupSpecs") or []
    if not isinstance(groups, list):
        raise ManifestError("spec.rayClusterSpec.workerGroupSpecs must be a list")
    for index, group in enumerate(groups):
        where = f"spec.rayClusterSpec.workerGroupSpecs[{index}]"
        if not isinstance(group, dict) or not isinstance(group.get("groupName"), str):
            raise ManifestError(f"{where}.groupName is required")
        _ray_group(group, where, kubernetes_version)
        counts = [group.get(k) for k in ("replicas", "minReplicas", "maxReplicas")]
        ints = [c for c in counts if isinstance(c, int) and not isinstance(c, bool) and c >= 0]
        if len(ints) != 3 or not ints[1] <= ints[0] <= ints[2]:
            raise ManifestError(f"{where}: replicas must be integers with minReplicas <= replicas <= maxReplicas")
    if "submitterPodTemplate" in spec:
        _pod_template(spec["submitterPodTemplate"], "spec.submitterPodTemplate", kubernetes_version)
    for key in ("shutdownAfterJobFinishes",):
        if key in spec and not isinstance(spec[key], bool):
            raise ManifestError(f"spec.{key} must be true or false")
    if "ttlSecondsAfterFinished" in spec and not (isinstance(spec["ttlSecondsAfterFinished"], int)
                                                 and spec["ttlSecondsAfterFinished"] >= 0):
        raise ManifestError("spec.ttlSecondsAfterFinished must be a non-negative integer")


def _ray_group(group: dict[str, Any], where: str, kubernetes_version: str) -> None:
    params = group.get("rayStartParams", {})
    if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
        raise ManifestError(f"{where}.rayStartParams must map names to strings (KubeRay rejects other values)")
    _pod_template(group.get("template"), f"{where}.template", kubernetes_version)
    containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
    if not containers:
        raise ManifestError(f"{where}.template needs a container (KubeRay runs Ray in the first one)")
