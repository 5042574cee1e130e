"""Manifests from the templates in templates/k8s/provision/, in the order they are applied, each validated before
anything reaches a cluster (and before `--dry-run` prints it).

Validation: built-in kinds against the Kubernetes OpenAPI schema that kubernetes-validate ships (offline, strict);
a RayJob against KubeRay's CRD schema, which agl ships, with the pod templates inside it as PodTemplateSpec
(rayjob_schema.py). Then, whatever rendered them: every object carries the train's labels, and no upstream key
value appears anywhere.

The ConfigMap (the project) comes first: it is the owner the other objects point at once applied (apply.py), so
deleting it garbage-collects the train, volumes aside.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_backend.provision.options import ANNOTATION_PROVISION, ANNOTATION_SPEC_HASH, Names, ProvisionError
from rl_backend.provision.plan import Topology
from rl_backend.provision.rayjob_schema import kuberay_version, validate_rayjob
from rl_backend.rollout.k8s_manifest import (
    ManifestError,
    check_no_leak,
    dns_context,
    load_manifest,
    render_template,
    validate_schema,
)
from rl_backend.rollout.k8s_spec import NetworkPolicySpec

TEMPLATES = "k8s/provision"


def rayjob_note() -> str:
    return (f"the RayJob was validated against KubeRay {kuberay_version()}'s RayJob CRD schema (ray.io/v1), its pod "
            "templates against the Kubernetes schema")


@dataclass
class Rendered:
    manifests: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def kind_name(manifest: Mapping[str, Any]) -> str:
    return f"{manifest.get('kind')}/{(manifest.get('metadata') or {}).get('name')}"


def _render(template: str | Path, context: dict[str, Any], **extra: Any) -> dict[str, Any]:
    source = template if isinstance(template, Path) or "/" in template else f"{TEMPLATES}/{template}"
    try:
        return load_manifest(render_template(source, **{**context, **extra}), str(source))
    except ManifestError as exc:  # a template of the user's (or a value agl.yaml put in one): fix and re-run
        raise ProvisionError(str(exc), exit_code=2) from None


def _rollout_egress(context: dict[str, Any], policy: NetworkPolicySpec, base_dir: Path | None) -> dict[str, Any]:
    """The rollout pods' egress: the train's gateway (its pods, in this namespace) and DNS, plus what agl.yaml's
    `kubernetes.network_policy.allow_egress` opens; nothing else (no metadata server, no API server, no other pod).
    The same template the rollout controller renders for a run, or the user's `network_policy.template`."""
    names: Names = context["names"]
    template: str | Path = "k8s/networkpolicy.yaml.j2"
    if policy.template:
        template = ((base_dir or Path(".")) / policy.template).resolve()
    return _render(template, context, name=names.rollout_egress, labels=names.labels("rollout"),
                   pod_selector=names.component("rollout"), gateway_cidrs=[],
                   gateway_pod_selector=names.component("gateway"), gateway_namespace_selector=None,
                   gateway_port=context["gateway_port"], dns=dns_context(policy.dns_rule()),
                   allow_egress=policy.allow_egress, spec=None)


OPEN_ROLLOUTS_NOTE = ("kubernetes.network_policy.enabled is false: the rollout pods (agent code) may reach anything "
                      "the cluster lets a pod reach, the cloud metadata server and the API server included")


def render_all(context: dict[str, Any], *, withheld: list[str], kubernetes_version: str,
               rollout_policy: NetworkPolicySpec | None = None, base_dir: Path | None = None) -> Rendered:
    names: Names = context["names"]
    topology: Topology = context["topology"]
    options = context["options"]
    labels = names.labels
    docs = [
        _render("configmap.yaml.j2", context, labels=labels("config")),
        _render("metrics-configmap.yaml.j2", context, labels=labels("metrics")),
        _render("serviceaccount.yaml.j2", context, labels=labels("controller")),
        _render("role.yaml.j2", context, labels=labels("controller")),
        _render("rolebinding.yaml.j2", context, labels=labels("controller")),
        _render("generated-secret.yaml.j2", context, name=names.admin_secret, labels=labels("gateway")),
        _render("generated-secret.yaml.j2", context, name=names.policy_key, labels=labels("policy")),
        # Before any pod they guard exists: there is never a moment when the gateway or the policy is open.
        _render("netpol-gateway.yaml.j2", context, labels=labels("gateway")),
        _render("netpol-policy.yaml.j2", context, labels=labels("policy")),
    ]
    if topology.kind == "rayjob":
        docs.append(_render("netpol-ray.yaml.j2", context, labels=labels("trainer")))
    # Rollout pods run untrusted agent code: closed by default, opened only as far as agl.yaml says.
    rollout_policy = rollout_policy if rollout_policy is not None else NetworkPolicySpec()
    if rollout_policy.enabled:
        docs.append(_rollout_egress(context, rollout_policy, base_dir))
    docs += [
        # Not --storage-class: that one is the checkpoints' (a network filesystem for a RayJob), where SQLite's
        # WAL cannot live.
        _render("pvc.yaml.j2", context, name=names.store_pvc, labels=labels("gateway-store"),
                access_mode="ReadWriteOnce", size=options.store_size, storage_class=options.store_storage_class),
        _render("pvc.yaml.j2", context, name=names.checkpoints, labels=labels("checkpoints"),
                access_mode=topology.checkpoint_access, size=options.checkpoint_size,
                storage_class=options.storage_class),
        _render("service.yaml.j2", context, labels=labels("gateway"), selector=names.component("gateway")),
        # Before the pods they protect: a drain never finds one of them unguarded.
        _render("pdb.yaml.j2", context, name=names.gateway, labels=labels("gateway"),
                match_labels=names.component("gateway"), components=[]),
        _render("pdb.yaml.j2", context, name=names.trainer, labels=labels("trainer"), match_labels=names.selector(),
                components=["trainer", "trainer-worker", "trainer-driver"]),
        _render("gateway-deployment.yaml.j2", context, labels=labels("gateway"), pod_selector=names.component("gateway")),
    ]
    trainer_template = "trainer-job.yaml.j2" if topology.kind == "job" else "trainer-rayjob.yaml.j2"
    trainer = _render(trainer_template, context, labels=labels("trainer"))
    trainer["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = spec_hash(trainer)
    docs.append(trainer)
    notes: list[str] = [] if rollout_policy.enabled else [OPEN_ROLLOUTS_NOTE]
    for manifest in docs:
        validate(manifest, kubernetes_version, names)
    if topology.kind == "rayjob":
        notes.append(rayjob_note())
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
        # What agl.yaml and the flags put in it (a rule, a size, a name) is what makes it invalid: fix and re-run.
        raise ProvisionError(f"{where}: {exc}", hint="nothing was applied; correct the setting named in the path above",
                             exit_code=2) from None
    meta = manifest.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key, value in names.selector().items():
        if labels.get(key) != value:
            raise ProvisionError(f"{where} must carry the label {key}={value}: `agl train stop` finds it by that")
    if not (meta.get("annotations") or {}).get(ANNOTATION_PROVISION):
        raise ProvisionError(f"{where} must carry the annotation {ANNOTATION_PROVISION}")
