"""The `kubernetes:` section of `agl.yaml`: where and how rollouts run as Kubernetes Jobs.

Only pydantic here, no `kubernetes` import: `agl_cli.spec.schema` imports this model at start-up, and the client
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
    # 10001 is the user of agl's images (docker/*.Dockerfile): an agent image built FROM agl-runtime with
    # `COPY --chown=10001:10001` (docker/README.md) owns its files as the process that runs it.
    run_as_user: int | None = Field(default=10001, ge=1, description="uid of the agent's process (never root)")
    run_as_group: int | None = Field(default=10001, ge=1, description="gid of the agent's process")
    fs_group: int | None = Field(default=10001, ge=1, description="group that owns the mounted volumes")
    read_only_root_filesystem: bool = Field(
        default=True, description="only /tmp and the rollout folder are writable; false when the agent must write "
        "elsewhere"
    )


def _check_cidrs(value: list[str]) -> list[str]:
    for cidr in value:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ValueError(f"{cidr!r} is not an IP network (write 10.0.3.7/32)") from None
    return value


class DnsSpec(_Strict):
    """Where rollout pods may resolve names. The default is the cluster's DNS pods (label k8s-app: kube-dns, in
    namespace kube-system) on port 53. NodeLocal DNSCache answers on a link-local address of each node: add it to `cidrs`
    (e.g. 169.254.20.10/32). OpenShift's DNS pods live in namespace openshift-dns, labelled
    dns.operator.openshift.io/daemonset-dns: default, and listen on port 5353."""

    pod_selector: dict[str, str] | None = Field(default_factory=lambda: {"k8s-app": "kube-dns"},
                                                description="labels of the DNS pods (null: none by selector)")
    # In kube-system only by default: a pod anywhere else may label itself k8s-app: kube-dns and would otherwise
    # receive every rollout's lookups (and whatever an agent smuggles out in them).
    namespace_selector: dict[str, str] | None = Field(
        default_factory=lambda: {"kubernetes.io/metadata.name": "kube-system"},
        description="labels of the DNS pods' namespace ({}: any namespace; null: the policy's own)")
    cidrs: list[str] = Field(default_factory=list, description="DNS servers by address, e.g. 169.254.20.10/32")
    ports: list[int] = Field(default_factory=lambda: [53], min_length=1, description="the DNS ports (UDP and TCP)")

    @field_validator("cidrs")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        return _check_cidrs(value)

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: list[int]) -> list[int]:
        if not all(0 < port < 65536 for port in value):
            raise ValueError("DNS ports must be between 1 and 65535")
        return value

    @model_validator(mode="after")
    def _somewhere(self) -> DnsSpec:
        if self.pod_selector is None and not self.cidrs:
            raise ValueError("dns needs a pod_selector or cidrs (or `dns: false` for no DNS at all)")
        return self


class NetworkPolicySpec(_Strict):
    """Egress only to the gateway (and DNS), plus the rules in `allow_egress`; no ingress. Needs a CNI that enforces
    NetworkPolicy. `{}` means exactly that, with the defaults; for `agl train --on kubernetes` (which applies it to
    every rollout pod even without this section) the gateway is the train's own."""

    enabled: bool = Field(default=True, description="create the NetworkPolicy")
    gateway_cidrs: list[str] = Field(default_factory=list, description="the gateway's pod or host addresses, e.g. "
                                                                       "10.0.3.7/32 (a Service's ClusterIP never "
                                                                       "matches: policies see pod addresses)")
    gateway_pod_selector: dict[str, str] | None = Field(default=None, description="when the gateway runs in-cluster")
    gateway_namespace_selector: dict[str, str] | None = Field(
        default=None, description="the gateway pod's namespace labels, with gateway_pod_selector"
    )
    gateway_port: int | None = Field(default=None, ge=1, le=65535, description="default: the port of gateway_url")
    dns: bool | DnsSpec = Field(default=True, description="true: the cluster's kube-dns pods; false: none; or a "
                                                          "DnsSpec (NodeLocal DNSCache, OpenShift)")
    allow_egress: list[dict[str, Any]] = Field(
        default_factory=list, description="more egress rules, as NetworkPolicy egress rules ({to, ports}), e.g. a "
        "package mirror: [{to: [{ipBlock: {cidr: 10.8.0.0/16}}], ports: [{port: 443}]}]")
    template: str | None = Field(default=None, description="your own NetworkPolicy jinja2 template")

    @field_validator("gateway_cidrs")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        return _check_cidrs(value)

    def dns_rule(self) -> DnsSpec | None:
        """The DNS egress rule to render, or None for none."""
        if self.dns is True:
            return DnsSpec()
        return self.dns or None


class ProjectSpec(_Strict):
    """The project's files from a ConfigMap, mounted read-only in every rollout pod at `mount_path`. Set by
    `agl train --on kubernetes` on the cluster's copy of agl.yaml, so that rollout pods see the files the trainer
    sees (knob files, and the agent's code when no agent image is given)."""

    config_map: str = Field(description="the ConfigMap holding the project's files")
    items: list[dict[str, Any]] = Field(min_length=1, description="{key, path[, mode]}: ConfigMap key to relative "
                                        "path (mode: the file's permission bits, e.g. 365 = 0o555 for a script)")
    mount_path: str = Field(default="/etc/agl/project", description="where rollout pods see the files (absolute)")

    @field_validator("items")
    @classmethod
    def _items(cls, value: list[dict[str, str]]) -> list[dict[str, str]]:
        for item in value:
            path = item.get("path", "")
            if (not {"key", "path"} <= set(item) <= {"key", "path", "mode"} or not isinstance(path, str) or not path
                    or path.startswith("/") or ".." in path.split("/")):
                raise ValueError(f"{item!r}: each item is {{key, path[, mode]}} with a relative path inside the folder")
            mode = item.get("mode", 0)
            if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
                raise ValueError(f"{item!r}: mode is permission bits between 0 and 0o777 (511)")
        return value

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"mount_path {value!r} must be absolute")
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
    project: ProjectSpec | None = Field(
        default=None, description="set by `agl train --on kubernetes`: the project's files from a ConfigMap, mounted "
        "in every rollout pod"
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
    request_timeout_s: float = Field(
        default=30.0, gt=0, description="each Kubernetes API request (connect, then read) gives up after this"
    )
    api_retry_s: float = Field(
        default=300.0, ge=0, description="how long agl keeps retrying while the Kubernetes API is unreachable or "
        "failing (refused connections, timeouts, 5xx, 429) before it ends the run"
    )
    api_backoff_max_s: float = Field(default=10.0, gt=0, description="the longest pause between two retries")
    pod_check_s: float = Field(
        default=3.0, gt=0, description="how often the run's pods are checked for one that cannot start"
    )
    unstartable_after_s: float = Field(
        default=10.0, ge=0, description="how long a pod may stay in ErrImagePull (which the registry may still "
        "resolve) before its rollout fails; ImagePullBackOff and container config errors fail at once"
    )
    unschedulable_after_s: float = Field(
        default=300.0, ge=0, description="how long a pod may wait Unschedulable for a node (a cluster autoscaler "
        "adding one takes minutes) before its rollout fails; the Job's deadline includes this wait"
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
        """Where the gateway must listen so pods reach it, and no wider (None: no gateway_url, nothing to decide):
        gateway_url's own address when it is an IP of this machine (IPv6 included); otherwise every address of
        its family, since a NATed address or a host name may arrive on any interface."""
        if self.gateway_listen is not None:
            host, _, port = self.gateway_listen.rpartition(":")
            return host.strip("[]"), int(port)
        if self.gateway_url is None:
            return None
        from rl_backend.netaddr import is_own_address

        parts = urlsplit(self.gateway_url)
        number = parts.port or (443 if parts.scheme == "https" else 80)
        address = parts.hostname or ""
        if is_own_address(address):
            return address, number
        return ("::" if ":" in address else "0.0.0.0"), number

    @model_validator(mode="after")
    def _policy_needs_gateway(self) -> KubernetesSpec:
        policy = self.network_policy
        # Without a gateway_url there is nothing to point at yet: a train supplies its own gateway's pods.
        if (policy is not None and policy.enabled and self.gateway_url is not None
                and not (policy.gateway_cidrs or policy.gateway_pod_selector)):
            host = urlsplit(self.gateway_url).hostname if self.gateway_url else None
            try:
                ipaddress.ip_address(host or "")
            except ValueError:
                raise ValueError(
                    "network_policy needs the gateway's address: give network_policy.gateway_cidrs, "
                    "network_policy.gateway_pod_selector, or a gateway_url with an IP address"
                ) from None
        return self
