"""The `kubernetes:` section of `agl.yaml`: where and how rollouts run as Kubernetes Jobs.

Only pydantic here, no `kubernetes` import: `agl_cli.spec` imports this model at start-up, and the client
library (an optional extra) is loaded only when a controller is built.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResourcesSpec(_Strict):
    # Defaults fit a typical API-calling agent (a Python process waiting on HTTP); raise them for coding agents.
    requests: dict[str, str] = Field(default_factory=lambda: {"cpu": "250m", "memory": "256Mi"},
                                     description="the pod's resource requests")
    limits: dict[str, str] = Field(default_factory=lambda: {"cpu": "1", "memory": "1Gi"},
                                   description="the pod's resource limits")

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, value: dict[str, str]) -> dict[str, str]:
        for name, quantity in value.items():
            if not _QUANTITY.match(str(quantity)):
                raise ValueError(f"{name}: {quantity!r} is not a Kubernetes quantity (e.g. 500m, 1, 512Mi, 2Gi)")
        return {k: str(v) for k, v in value.items()}


class SecuritySpec(_Strict):
    # 65532 is the conventional "nonroot" user of distroless images; any non-zero uid satisfies runAsNonRoot.
    run_as_user: int | None = Field(default=65532, ge=1, description="uid of the agent's process (never root)")
    run_as_group: int | None = Field(default=65532, ge=1, description="gid of the agent's process")
    fs_group: int | None = Field(default=65532, ge=1, description="group that owns the mounted volumes")
    read_only_root_filesystem: bool = Field(
        default=True, description="only /tmp and the rollout folder are writable; false when the agent must write "
        "elsewhere"
    )


class NetworkPolicySpec(_Strict):
    """Egress only to the gateway (and cluster DNS); no ingress. Needs a CNI that enforces NetworkPolicy."""

    enabled: bool = Field(default=True, description="create the NetworkPolicy")
    gateway_cidrs: list[str] = Field(default_factory=list, description="the gateway's addresses, e.g. 10.0.3.7/32")
    gateway_pod_selector: dict[str, str] | None = Field(default=None, description="when the gateway runs in-cluster")
    gateway_namespace_selector: dict[str, str] | None = Field(
        default=None, description="the gateway pod's namespace labels, with gateway_pod_selector"
    )
    gateway_port: int | None = Field(default=None, ge=1, le=65535, description="default: the port of gateway_url")
    dns: bool = Field(default=True, description="also allow cluster DNS")
    template: str | None = Field(default=None, description="your own NetworkPolicy jinja2 template")

    @field_validator("gateway_cidrs")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"{cidr!r} is not an IP network (write 10.0.3.7/32)") from None
        return value


class KubernetesSpec(_Strict):
    """`runner: kubernetes`: one Job per rollout, in `namespace`, running `image`."""

    image: str = Field(description="the agent's container image: your agent at its WORKDIR, plus sh and base64")
    namespace: str = Field(default="default", description="where the Jobs run")
    kubeconfig: str | None = Field(default=None, description="default: $KUBECONFIG, ~/.kube/config, or in-cluster")
    context: str | None = Field(default=None, description="the kubeconfig context (default: its current one)")
    gateway_url: str | None = Field(
        default=None, description="how pods reach the gateway, e.g. http://10.0.3.7:8400 (required with a gateway)"
    )
    gateway_listen: str | None = Field(
        default=None, description="host:port the gateway listens on for pods; default 0.0.0.0 and gateway_url's port"
    )
    workdir: str | None = Field(default=None, description="the container's working directory; default: the image's")
    python: str = Field(default="python", description="replaces the local interpreter path in the agent command")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="default: Kubernetes' own (IfNotPresent, or Always for :latest)"
    )
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets to pull a private image")
    service_account: str | None = Field(default=None, description="the pods' service account (its token is not mounted)")
    env: dict[str, str] = Field(default_factory=dict, description="fixed variables for every pod, e.g. HOME: /tmp")
    pass_env: list[str] = Field(
        default_factory=list, description="names (or globs) from the agent's environment to forward into the pod"
    )
    env_from_secrets: list[str] = Field(default_factory=list, description="Secrets loaded whole as env (envFrom)")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="the pod's requests and limits")
    security: SecuritySpec = Field(default_factory=SecuritySpec, description="the pod's security context")
    tmp_size: str = Field(default="1Gi", description="size of the /tmp emptyDir")
    work_size: str = Field(default="1Gi", description="size of the rollout folder's emptyDir")
    node_selector: dict[str, str] = Field(default_factory=dict, description="the pods' nodeSelector")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="the pods' tolerations")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels on Jobs and pods")
    annotations: dict[str, str] = Field(default_factory=dict, description="extra annotations on Jobs and pods")
    job_template: str | None = Field(default=None, description="your own Job jinja2 template (path)")
    network_policy: NetworkPolicySpec | None = Field(
        default=None, description="restrict the pods' egress to the gateway ({} for the defaults)"
    )
    ttl_seconds_after_finished: int = Field(
        default=3600, ge=0, description="Kubernetes deletes a finished Job after this (a cleanup after a crash)"
    )
    startup_allowance_s: float = Field(
        default=30.0, ge=0, description="added to the rollout timeout for scheduling and image pull"
    )
    deadline_grace_s: float = Field(
        default=60.0, ge=0, description="how long past the Job's deadline agl waits before giving up on the cluster"
    )
    create_qps: float = Field(default=5.0, gt=0, description="Job creations per second (token bucket)")
    create_burst: int = Field(default=10, ge=1, description="Job creations allowed at once (token bucket size)")
    watch_timeout_s: int = Field(default=300, ge=1, description="each watch request ends after this, then resumes")
    resync_s: float = Field(default=300.0, gt=0, description="relist every so often, even when the watch is healthy")
    max_output_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="the output file comes back up to this size, then is cut"
    )
    kubernetes_version: str = Field(default="1.30", description="the schema the manifests are validated against")

    @field_validator("tmp_size", "work_size")
    @classmethod
    def _size(cls, value: str) -> str:
        if not _QUANTITY.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 512Mi, 1Gi)")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value) or len(value) > 63:
            raise ValueError(f"{value!r} is not a valid namespace name (lowercase letters, digits, '-')")
        return value

    @field_validator("gateway_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value.rstrip("/")

    @field_validator("gateway_listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            host, _, port = value.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{value!r} is not host:port (e.g. 0.0.0.0:8400)")
        return value

    def listen_address(self) -> tuple[str, int] | None:
        """Where the gateway must listen so pods reach it (None: no gateway_url, nothing to decide)."""
        if self.gateway_listen is not None:
            host, _, port = self.gateway_listen.rpartition(":")
            return host.strip("[]"), int(port)
        if self.gateway_url is None:
            return None
        parts = urlsplit(self.gateway_url)
        return "0.0.0.0", parts.port or (443 if parts.scheme == "https" else 80)

    @model_validator(mode="after")
    def _policy_needs_gateway(self) -> KubernetesSpec:
        policy = self.network_policy
        if policy is not None and policy.enabled and not (policy.gateway_cidrs or policy.gateway_pod_selector):
            host = urlsplit(self.gateway_url).hostname if self.gateway_url else None
            try:
                ipaddress.ip_address(host or "")
            except ValueError:
                raise ValueError(
                    "network_policy needs the gateway's address: give network_policy.gateway_cidrs, "
                    "network_policy.gateway_pod_selector, or a gateway_url with an IP address"
                ) from None
        return self
