"""Kubernetes manifests for rollouts: deterministic names, labels, the wrapper script, the Job and the
NetworkPolicy rendered from jinja2 templates, and validation before anything is submitted.

Validation is twofold: the offline JSON schemas that `kubernetes-validate` ships (structure and types, strict:
unknown fields are errors), then agl's own checks of what the schema cannot see (name and label syntax, and the
invariants the controller relies on, which a user's own template could break).
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jinja2
import yaml

from rl_backend.rollout.k8s_spec import DnsSpec, KubernetesSpec

LABEL_RUN = "agl.dev/run"
LABEL_ROLLOUT = "agl.dev/rollout"
LABEL_VARIANT = "agl.dev/variant"
LABEL_TASK = "agl.dev/task"
ANNOTATION_MARKER = "agl.dev/output-marker"
CONTAINER = "agent"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Job names stay short: the Job controller puts the name into a label (63 chars max) and appends a pod suffix.
MAX_JOB_NAME = 52
# YAML 1.1 (PyYAML) refuses these raw characters; json.dumps leaves them unescaped with ensure_ascii=False.
_YAML_UNSAFE = re.compile("[\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")


class ManifestError(ValueError):
    """A rendered manifest is not one agl can submit: invalid for Kubernetes, or missing what agl relies on."""


def _digest(text: str, size: int) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:size]


def label_value(value: str) -> str:
    """A valid label value for any string: kept as is when it already is one, else sanitized plus a short hash."""
    if len(value) <= 63 and _LABEL_VALUE.match(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-_.")[:50].strip("-_.")
    return f"{cleaned}-{_digest(value, 10)}" if cleaned else _digest(value, 10)


def job_name(run_id: str, rollout_id: str) -> str:
    """Deterministic from (run, rollout): a repeated create hits 409 and adopts the same Job, and two runs of the
    same experiment (whose rollout ids coincide) never share one."""
    rid = re.sub(r"[^a-z0-9-]+", "-", rollout_id.lower()).strip("-")
    name = f"agl-{_digest(run_id, 8)}-{rid}"
    if len(name) > MAX_JOB_NAME or rid != rollout_id:
        name = f"agl-{_digest(run_id, 8)}-{rid[:24].strip('-')}-{_digest(rollout_id, 10)}"
    return name


def policy_name(run_id: str) -> str:
    return f"agl-{_digest(run_id, 8)}-egress"


def run_selector(run_id: str) -> dict[str, str]:
    return {LABEL_RUN: label_value(run_id)}


def deadline_seconds(timeout_s: float, spec: KubernetesSpec) -> int:
    """The Job's activeDeadlineSeconds, which counts from its creation: the agent's timeout after the longest its pod
    may wait for a node and for its image."""
    return max(1, math.ceil(timeout_s + spec.startup_allowance_s + spec.unschedulable_after_s))


def yaml_quote(value: object) -> str:
    """A double-quoted YAML scalar that reads back as exactly `value` (JSON strings are YAML)."""
    text = json.dumps(str(value), ensure_ascii=False)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def yaml_flow(value: object) -> str:
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))


def templates_dir() -> Path:
    """`templates/` in a checkout, `agl_cli/_templates` inside the wheel (same lookup as agl_cli.templates)."""
    root = Path(__file__).resolve().parents[2]
    packaged = root / "agl_cli" / "_templates"
    return packaged if packaged.is_dir() else root / "templates"


def _environment(search: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(search), str(templates_dir())]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = yaml_quote
    env.filters["json"] = yaml_flow
    env.filters["sh"] = lambda value: shlex.quote(str(value))
    env.filters["dirname"] = lambda value: posixpath.dirname(str(value))
    return env


def render_template(template: str | Path, **context: Any) -> str:
    """Render a template named relative to templates/ (agl's own) or given as a path (the user's)."""
    path = Path(template)
    if path.is_absolute():
        if not path.is_file():
            raise ManifestError(f"template {path} does not exist")
        env = _environment(path.parent)
        return env.get_template(path.name).render(**context)
    return _environment(templates_dir()).get_template(str(template)).render(**context)


def load_manifest(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{source} did not render to valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{source} did not render to one YAML mapping")
    return data


def validate_schema(manifest: dict[str, Any], kubernetes_version: str) -> None:
    """Check against the Kubernetes OpenAPI schema (offline, strict: unknown fields are errors)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(manifest, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path) or "(top)"
        raise ManifestError(
            f"the {manifest.get('kind', '?')} manifest is not valid for Kubernetes {exc.version}: at {where}: "
            f"{exc.message}"
        ) from None
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.VersionNotSupportedError) as exc:
        raise ManifestError(f"cannot validate the manifest: {exc.message}") from None


def _check_labels(labels: Any, where: str) -> None:
    if not isinstance(labels, Mapping):
        raise ManifestError(f"{where} must be a mapping")
    for key, value in labels.items():
        name = str(key).rsplit("/", 1)[-1]
        if not (0 < len(name) <= 63 and _LABEL_VALUE.match(name)):
            raise ManifestError(f"{where}: {key!r} is not a valid label key")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ManifestError(f"{where}: the value of {key!r} ({value!r}) is not a valid label value")


def check_job(manifest: dict[str, Any], *, name: str, labels: Mapping[str, str], script: str) -> None:
    """What the controller relies on, whichever template produced the Job."""
    meta = manifest.get("metadata") or {}
    if meta.get("name") != name:
        raise ManifestError(f"the Job must be named {name!r} (agl adopts and deletes it by that name)")
    if not _DNS_LABEL.match(name) or len(name) > 63:
        raise ManifestError(f"{name!r} is not a valid Job name")
    spec = manifest.get("spec") or {}
    pod_meta = (spec.get("template") or {}).get("metadata") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    for where, have in (("metadata.labels", meta.get("labels")), ("spec.template.metadata.labels", pod_meta.get(
            "labels"))):
        _check_labels(have or {}, where)
        for key in (LABEL_RUN, LABEL_ROLLOUT):
            if (have or {}).get(key) != labels[key]:
                raise ManifestError(f"{where} must carry {key}={labels[key]} (agl watches and cleans up by it)")
    if spec.get("backoffLimit") != 0:
        raise ManifestError("spec.backoffLimit must be 0: agl decides about retries")
    if pod.get("restartPolicy") != "Never":
        raise ManifestError("spec.template.spec.restartPolicy must be Never")
    containers = {c.get("name"): c for c in pod.get("containers") or []}
    agent = containers.get(CONTAINER)
    if agent is None:
        raise ManifestError(f"the pod needs a container named {CONTAINER!r}: agl reads its log and exit code")
    if script not in (agent.get("command") or []) + (agent.get("args") or []):
        raise ManifestError(f"the {CONTAINER!r} container must run agl's wrapper script (the `script` variable)")


def check_no_leak(manifest: dict[str, Any], withheld: list[str]) -> None:
    """Defense in depth: whatever template rendered it, no withheld secret value may appear in a manifest."""
    text = json.dumps(manifest, ensure_ascii=False)
    for value in withheld:
        if value in text:
            raise ManifestError("the rendered manifest contains the value of a secret from agl's environment")


def dns_context(rule: DnsSpec | None) -> dict[str, Any] | None:
    return rule.model_dump() if rule is not None else None


def render_policy(spec: KubernetesSpec, run_id: str, base_dir: Path) -> dict[str, Any]:
    policy = spec.network_policy
    assert policy is not None
    gateway = urlsplit(spec.gateway_url or "")
    cidrs = list(policy.gateway_cidrs)
    if not cidrs and policy.gateway_pod_selector is None and gateway.hostname:
        cidrs = [gateway.hostname + ("/128" if ":" in gateway.hostname else "/32")]
    port = policy.gateway_port or gateway.port or (443 if gateway.scheme == "https" else 80)
    template: str | Path = "k8s/networkpolicy.yaml.j2"
    if policy.template:
        template = (base_dir / policy.template).resolve()
    text = render_template(
        template, name=policy_name(run_id), namespace=spec.namespace,
        labels={**run_selector(run_id), "app.kubernetes.io/managed-by": "agl"}, pod_selector=run_selector(run_id),
        gateway_cidrs=cidrs, gateway_pod_selector=policy.gateway_pod_selector,
        gateway_namespace_selector=policy.gateway_namespace_selector, gateway_port=port, dns=dns_context(policy.dns_rule()),
        allow_egress=policy.allow_egress, spec=spec,
    )
    manifest = load_manifest(text, str(template))
    validate_schema(manifest, spec.kubernetes_version)
    _check_labels((manifest.get("metadata") or {}).get("labels") or {}, "metadata.labels")
    return manifest


def pod_command(command: str, python: str) -> str:
    """The agent command as the pod runs it: agl's own interpreter path (from `{python}`) means nothing in an
    image, so it becomes the image's `python`."""
    for local in {shlex.quote(sys.executable), sys.executable}:
        command = command.replace(local, python)
    return command


def rollout_labels(spec: KubernetesSpec, run_id: str, rollout_id: str, job_labels: Mapping[str, str]) -> dict[str, str]:
    labels = {k: label_value(v) for k, v in spec.labels.items()}
    labels.update({"app.kubernetes.io/managed-by": "agl", "app.kubernetes.io/name": "agl",
                   "app.kubernetes.io/component": "rollout"})
    labels.update({LABEL_RUN: label_value(run_id), LABEL_ROLLOUT: label_value(rollout_id)})
    if "variant" in job_labels:
        labels[LABEL_VARIANT] = label_value(job_labels["variant"])
    if "task" in job_labels:
        labels[LABEL_TASK] = label_value(job_labels["task"])
    return labels


def render_job(
    spec: KubernetesSpec,
    *,
    run_id: str,
    rollout_id: str,
    command: str,
    timeout_s: float,
    rollout_dir: Path,
    output_file: str | None,
    job_labels: Mapping[str, str],
    env: dict[str, str],
    files: list[tuple[str, str]],
    withheld: list[str],
    marker: str,
    base_dir: Path,
    tail_bytes: int,
) -> dict[str, Any]:
    script = render_template(
        "k8s/wrapper.sh.j2", marker=marker, files=files, command=pod_command(command, spec.python),
        output_file=output_file, stderr_tail_bytes=tail_bytes, max_output_bytes=spec.max_output_bytes,
    )
    name = job_name(run_id, rollout_id)
    labels = rollout_labels(spec, run_id, rollout_id, job_labels)
    # Raw (unsanitized) identities live in annotations: labels are for selecting, annotations for reading.
    annotations = dict(spec.annotations)
    annotations.update({ANNOTATION_MARKER: marker, "agl.dev/run-id": run_id, "agl.dev/rollout-id": rollout_id})
    annotations.update({f"agl.dev/{k}": v for k, v in job_labels.items() if k in {"variant", "task"}})
    template: str | Path = "k8s/job.yaml.j2"
    if spec.job_template:
        template = (base_dir / spec.job_template).resolve()
    text = render_template(
        template, name=name, namespace=spec.namespace, labels=labels, annotations=annotations, image=spec.image,
        image_pull_policy=spec.image_pull_policy, image_pull_secrets=spec.image_pull_secrets,
        service_account=spec.service_account, node_selector=spec.node_selector, tolerations=spec.tolerations,
        security=spec.security, script=script, workdir=spec.workdir, env=env,
        env_from_secrets=spec.env_from_secrets, resources=spec.resources.model_dump(),
        rollout_dir=rollout_dir.as_posix(), tmp_size=spec.tmp_size, work_size=spec.work_size,
        deadline_s=deadline_seconds(timeout_s, spec), ttl_s=spec.ttl_seconds_after_finished, spec=spec,
        project=spec.project.model_dump() if spec.project else None,
    )
    manifest = load_manifest(text, str(template))
    validate_schema(manifest, spec.kubernetes_version)
    check_job(manifest, name=name, labels=labels, script=script)
    check_no_leak(manifest, withheld)
    return manifest
