"""What `agl train --on kubernetes` was asked to do, the train's object names and labels, and its one error type.

Names derive from the train's name only (not from a random id): re-running a provision finds and patches the same
objects, and `stop` or `status` find them again from nothing but the name and the namespace.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Literal

from rl_backend.provision.trainer_args import TrainerArgs, TrainerArgsError

LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_TRAIN = "agl.dev/train"
# On the pods that host the policy servers (the trainer Job's pod, the RayJob's GPU workers): the gateway reaches them.
LABEL_POLICY_HOST = "agl.dev/policy-host"
LABEL_RAY_NODE = "agl.dev/ray-node"
# Set on every object a provision writes: a create retried after an ambiguous failure (a 500 whose object was
# stored after all) finds its own object by this annotation and adopts it instead of treating it as someone else's.
ANNOTATION_PROVISION = "agl.dev/provision-id"
# On the trainer (whose pod template is immutable): a re-run with the same spec leaves it alone.
ANNOTATION_SPEC_HASH = "agl.dev/spec-hash"
DEFAULT_KEY_SECRET = "agl-upstream-keys"
GATEWAY_PORT = 8090
RAY_DASHBOARD_PORT = 8265  # job submission and status: the RayJob's submitter and the KubeRay operator call it
MAX_TRAIN_NAME = 30  # KubeRay derives cluster, pod and Service names from the RayJob's; those must stay <= 63
GPUS_PER_NODE = 8
# The policy servers (vLLM, under verl) listen on a port the OS picks: the pods that host them narrow the kernel's
# ephemeral range to this (a namespaced sysctl), and the gateway may reach these ports only. Ray's own listeners on
# those pods are pinned outside it (RAY_PORTS in plan.py).
POLICY_PORTS = (40000, 40999)
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
# The distribution reference grammar, simplified: [registry[:port]/]path[:tag][@algorithm:hex].
_IMAGE = re.compile(
    r"^(?P<name>(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,}))?$")


class ProvisionError(RuntimeError):
    """A failure the user can act on: which object, and why. The CLI prints it (and the hint) without a traceback."""

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message, self.hint, self.exit_code = message, hint, exit_code

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


@dataclass(frozen=True)
class SecretRef:
    """An upstream key for the gateway: env variable `env` from key `key` of the user's Secret `secret`."""

    env: str
    secret: str
    key: str


def parse_secret_ref(text: str) -> SecretRef:
    """`ENV=secret[:key]` (key defaults to ENV), as `--key-secret` takes it."""
    env, sep, rest = text.partition("=")
    secret, _, key = rest.partition(":")
    key = key or env
    if not sep or not _ENV_NAME.match(env) or not secret or not _SECRET_KEY.match(key):
        raise ProvisionError(f"--key-secret {text!r}: write ENV=SECRET[:KEY], e.g. OPENAI_API_KEY=openai-creds:api-key",
                             exit_code=2)
    check_dns_name(secret, "--key-secret: the Secret name")
    return SecretRef(env, secret, key)


_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def parse_node_selector(items: list[str]) -> dict[str, str]:
    """`KEY=VALUE` pairs, as `--node-selector` takes them."""
    selector = {}
    for text in items:
        key, sep, value = text.partition("=")
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value) or len(value) > 63:
            raise ProvisionError(f"--node-selector {text!r}: write KEY=VALUE, e.g. "
                                 "cloud.google.com/gke-accelerator=nvidia-l4", exit_code=2)
        selector[key] = value
    return selector


def parse_toleration(text: str) -> dict[str, str]:
    """`KEY[=VALUE][:EFFECT]`, as `--toleration` takes it: Equal with a value, Exists without."""
    rest, _, effect = text.partition(":")
    key, sep, value = rest.partition("=")
    if not _LABEL_KEY.match(key) or (sep and not _LABEL_VALUE.match(value)) or (effect and effect not in _EFFECTS):
        raise ProvisionError(f"--toleration {text!r}: write KEY[=VALUE][:EFFECT], EFFECT one of "
                             + ", ".join(_EFFECTS) + ", e.g. dedicated=gpu:NoSchedule", exit_code=2)
    toleration = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        toleration["value"] = value
    if effect:
        toleration["effect"] = effect
    return toleration


def check_dns_name(value: str, what: str) -> str:
    if not (re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", value) and len(value) <= 253):
        raise ProvisionError(f"{what} {value!r} is not a valid Kubernetes name (lowercase letters, digits, '-', '.')",
                             exit_code=2)
    return value


def check_image(value: str, what: str) -> str:
    """An image reference Kubernetes can pull: `name[:tag][@sha256:…]`, refused (exit 2) when malformed."""
    if not _IMAGE.match(value) or len(value) > 512:
        raise ProvisionError(f"{what} {value!r} is not an image reference",
                             hint="write REGISTRY/NAME:TAG, or pin it by digest: REGISTRY/NAME@sha256:<64 hex digits>",
                             exit_code=2)
    return value


def pinned(image: str) -> bool:
    """Whether the reference names one immutable image (a digest), not a tag that can be pushed again."""
    match = _IMAGE.match(image)
    return bool(match and match.group("digest"))


def train_name(raw: str) -> str:
    """A DNS label of at most MAX_TRAIN_NAME characters, kept as is when it already is one."""
    if len(raw) <= MAX_TRAIN_NAME and _DNS_LABEL.match(raw):
        return raw
    cleaned = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    digest = hashlib.sha1(raw.encode()).hexdigest()[:6]
    cleaned = cleaned[: MAX_TRAIN_NAME - 7].strip("-")
    if not cleaned or not cleaned[0].isalpha():
        cleaned = ("t-" + cleaned)[: MAX_TRAIN_NAME - 7].strip("-")
    return f"{cleaned}-{digest}"


@dataclass(frozen=True)
class Names:
    """Every object name of one train."""

    train: str

    @property
    def base(self) -> str:
        return f"agl-{self.train}"

    gateway = property(lambda self: f"{self.base}-gateway")
    admin_secret = property(lambda self: f"{self.base}-gateway-admin")
    policy_key = property(lambda self: f"{self.base}-policy-key")
    store_pvc = property(lambda self: f"{self.base}-gateway-store")
    config = property(lambda self: f"{self.base}-config")
    metrics = property(lambda self: f"{self.base}-metrics")  # the trainer's step rows (metric_rows.py)
    controller = property(lambda self: f"{self.base}-controller")
    checkpoints = property(lambda self: f"{self.base}-checkpoints")
    trainer = property(lambda self: f"{self.base}-trainer")
    # NetworkPolicies: who may reach the gateway, the policy servers, the Ray pods; where rollout pods may go.
    gateway_ingress = property(lambda self: f"{self.base}-gateway-ingress")
    policy_ingress = property(lambda self: f"{self.base}-policy-ingress")
    ray_ingress = property(lambda self: f"{self.base}-ray-ingress")
    rollout_egress = property(lambda self: f"{self.base}-rollout-egress")

    def selector(self) -> dict[str, str]:
        """What every object of this train carries; `stop` and `status` find them by it."""
        return {LABEL_MANAGED: "agl", LABEL_TRAIN: self.train}

    def component(self, component: str) -> dict[str, str]:
        """The train's pods of one component (a pod selector, stable across agl versions)."""
        return {**self.selector(), LABEL_COMPONENT: component}

    def labels(self, component: str) -> dict[str, str]:
        return {**self.component(component), LABEL_NAME: "agl", LABEL_INSTANCE: self.base, LABEL_PART_OF: "agl"}

    def gateway_url(self, namespace: str) -> str:
        return f"http://{self.gateway}.{namespace}.svc:{GATEWAY_PORT}"


TrainerKind = Literal["auto", "job", "rayjob"]


@dataclass
class ClusterOptions:
    """Where the train lives and how to reach the API (shared by provision, status and stop)."""

    namespace: str | None = None
    kubeconfig: str | None = None
    context: str | None = None


@dataclass
class ProvisionOptions(ClusterOptions):
    """`agl train CONFIG --on kubernetes` flags. `image` is the trainer's (verl + vLLM + the project);
    `gateway_image` the runtime image the gateway runs."""

    name: str | None = None
    gpus: int = 1
    nodes: int | None = None
    image: str | None = None
    gateway_image: str | None = None
    agent_image: str | None = None
    trainer: TrainerKind = "auto"
    trainer_args: TrainerArgs = field(default_factory=TrainerArgs)
    key_secrets: list[SecretRef] = field(default_factory=list)
    checkpoint_size: str = "200Gi"
    store_size: str = "10Gi"
    storage_class: str | None = None  # the checkpoints' (ReadWriteMany for a RayJob)
    store_storage_class: str | None = None  # the gateway's SQLite store: a block class, never a network filesystem
    trainer_cpu: str | None = None  # per pod holding GPUs (default 4 per GPU)
    trainer_memory: str | None = None  # per pod holding GPUs (default 24Gi per GPU)
    node_selector: dict[str, str] = field(default_factory=dict)  # for the pods holding GPUs
    tolerations: list[dict[str, str]] = field(default_factory=list)  # for the pods holding GPUs
    preflight: bool = False  # read the cluster, say what would not start, apply nothing
    kuberay_namespace: str | None = None  # where the KubeRay operator runs; found in the cluster when not given
    include: list[str] = field(default_factory=list)
    dry_run: bool = False
    follow: bool = True
    keep_on_failure: bool = False
    json_output: bool = False
    timeout_s: float = 1800.0
    poll_s: float = 2.0
    kubernetes_version: str | None = None
    create_attempts: int = 3
    retry_backoff_s: float = 0.5

    def check(self) -> None:
        if self.gpus < 1:
            raise ProvisionError(f"--gpus must be at least 1, got {self.gpus}", exit_code=2)
        if self.nodes is not None and not 1 <= self.nodes <= self.gpus:
            raise ProvisionError(f"--nodes must be between 1 and --gpus ({self.gpus}), got {self.nodes}", exit_code=2)
        if self.namespace is not None and not (_NAMESPACE.match(self.namespace) and len(self.namespace) <= 63):
            raise ProvisionError(f"--namespace {self.namespace!r} is not a valid namespace name", exit_code=2)
        if self.timeout_s <= 0:
            raise ProvisionError("--timeout must be positive", exit_code=2)
        for flag, amount in (("--trainer-cpu", self.trainer_cpu), ("--trainer-memory", self.trainer_memory)):
            if amount is not None and not _QUANTITY.match(amount):
                raise ProvisionError(f"{flag} {amount!r} is not a Kubernetes quantity (e.g. 3, 3500m, 12Gi)",
                                     exit_code=2)
        for flag, cls in (("--storage-class", self.storage_class), ("--store-storage-class", self.store_storage_class)):
            if cls is not None:
                check_dns_name(cls, flag)
        if self.kuberay_namespace is not None and not (_NAMESPACE.match(self.kuberay_namespace)
                                                       and len(self.kuberay_namespace) <= 63):
            raise ProvisionError(f"--kuberay-namespace {self.kuberay_namespace!r} is not a valid namespace name",
                                 exit_code=2)
        envs = [ref.env for ref in self.key_secrets]
        if len(envs) != len(set(envs)):
            raise ProvisionError("--key-secret names the same variable twice", exit_code=2)
        for flag, image in (("--image", self.image), ("--gateway-image", self.gateway_image),
                            ("--agent-image", self.agent_image)):
            if image is not None:
                check_image(image, flag)
        try:
            self.trainer_args.check()
        except TrainerArgsError as exc:
            raise ProvisionError(str(exc), exit_code=2) from None
