"""Would the train start on this cluster? Pure checks of the rendered plan against what the API server lists: the
StorageClasses its volumes get (access modes a provisioner can offer, SQLite on a network filesystem, fsGroup that
a network filesystem ignores) and the nodes its GPU pods need (GPUs, CPU, memory, nodeSelector, taints).

Each finding is an error (it would stay Pending or break: nothing is applied) or a warning (it may still start: a
cluster autoscaler may add a node agl cannot see). preflight.py reads the cluster; this module only judges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

# Provisioners of block volumes: one node at a time (ReadWriteOnce). A ReadWriteMany claim on them stays Pending.
BLOCK = ("pd.csi.storage.gke.io", "kubernetes.io/gce-pd", "ebs.csi.aws.com", "kubernetes.io/aws-ebs",
         "disk.csi.azure.com", "kubernetes.io/azure-disk", "rancher.io/local-path", "kubernetes.io/cinder",
         "cinder.csi.openstack.org", "rbd.csi.ceph.com", "driver.longhorn.io", "csi.vsphere.vmware.com",
         "kubernetes.io/host-path", "hostpath.csi.k8s.io", "topolvm.io")
# Network filesystems: ReadWriteMany; SQLite's WAL needs shared memory and locks they do not give; most of them
# ignore fsGroup (the volume's root keeps its own owner).
NETWORK_FS = ("filestore.csi.storage.gke.io", "efs.csi.aws.com", "file.csi.azure.com", "kubernetes.io/azure-file",
              "nfs.csi.k8s.io", "cephfs.csi.ceph.com", "k8s-sigs.io/nfs-subdir-external-provisioner")
RWX_EXAMPLES = ("GKE: a Filestore class (filestore.csi.storage.gke.io, e.g. standard-rwx); EKS: an EFS class "
                "(efs.csi.aws.com); AKS: azurefile-csi; elsewhere an NFS or CephFS class")
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    text: str
    hint: str = ""


def _is_network_fs(provisioner: str) -> bool:
    return provisioner in NETWORK_FS or "nfs" in provisioner.lower()


def storage_class_for(claim: dict[str, Any], classes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The class a claim gets: the one it names, else the cluster's default (None: none such)."""
    wanted = (claim.get("spec") or {}).get("storageClassName")
    for item in classes:
        meta = item.get("metadata") or {}
        if wanted is not None and meta.get("name") == wanted:
            return item
        if wanted is None and (meta.get("annotations") or {}).get(DEFAULT_CLASS) == "true":
            return item
    return None


def storage_findings(claims: list[dict[str, Any]], classes: list[dict[str, Any]], *, store_claim: str,
                     uid: int) -> list[Finding]:
    found: list[Finding] = []
    for claim in claims:
        name = claim["metadata"]["name"]
        wanted = (claim.get("spec") or {}).get("storageClassName")
        modes = (claim.get("spec") or {}).get("accessModes") or []
        item = storage_class_for(claim, classes)
        if item is None:
            what = f"StorageClass {wanted} does not exist" if wanted else "the cluster has no default StorageClass"
            found.append(Finding("error", f"PersistentVolumeClaim {name}: {what}; it would stay Pending",
                                 "name one with --storage-class (`kubectl get storageclass` lists them)"))
            continue
        cls, provisioner = item["metadata"]["name"], str(item.get("provisioner") or "")
        if "ReadWriteMany" in modes and provisioner in BLOCK:
            found.append(Finding(
                "error", f"PersistentVolumeClaim {name} needs ReadWriteMany (a RayJob's head and workers all mount "
                f"the checkpoints), and StorageClass {cls} ({provisioner}) offers block volumes, one node at a "
                "time: it would stay Pending", f"--storage-class a ReadWriteMany class: {RWX_EXAMPLES}"))
        if name == store_claim and _is_network_fs(provisioner):
            found.append(Finding(
                "error", f"PersistentVolumeClaim {name} holds the gateway's SQLite store (WAL mode), and StorageClass "
                f"{cls} ({provisioner}) is a network filesystem, whose locks SQLite cannot rely on",
                "--store-storage-class a block class (GKE: standard-rwo, EKS: gp3, AKS: managed-csi)"))
        elif name != store_claim and _is_network_fs(provisioner):
            found.append(Finding(
                "warning", f"StorageClass {cls} ({provisioner}) of {name}: network filesystems often ignore fsGroup, "
                f"so /checkpoints may not be writable by the trainer (uid {uid}); make its root owned by or writable "
                f"for uid/gid {uid} (an EFS access point with uid and gid {uid}; a Filestore share's root chown)"))
    return found


_UNITS: dict[str, Decimal] = {"": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6),
                              "G": Decimal(10**9), "T": Decimal(10**12), "Ki": Decimal(2**10), "Mi": Decimal(2**20),
                              "Gi": Decimal(2**30), "Ti": Decimal(2**40)}


def quantity(text: Any) -> Decimal:
    """A Kubernetes quantity as a number (cpu in cores, memory in bytes)."""
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text).strip())
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    return Decimal(match.group(1)) * _UNITS[match.group(2)]


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint.get("effect")):
            continue
        if toleration.get("operator") == "Exists" and toleration.get("key") in (None, "", taint.get("key")):
            return True
        if toleration.get("key") == taint.get("key") and toleration.get("value") == taint.get("value"):
            return True
    return False


def why_not(pod: dict[str, Any], node: dict[str, Any]) -> str | None:
    """Why this pod (spec) cannot run on this node, as the scheduler would say it; None when it can."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if spec.get("unschedulable"):
        return "cordoned"
    for key, value in (pod.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"no label {key}={value}"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(pod.get("tolerations") or [], taint):
            return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"
    allocatable = status.get("allocatable") or {}
    wanted: dict[str, Decimal] = {}
    # Sidecars (init containers that keep running: the grader's) run beside the main containers: their requests add.
    sidecars = [c for c in pod.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    for container in [*(pod.get("containers") or []), *sidecars]:
        resources = container.get("resources") or {}
        asked = {k: v for k, v in (resources.get("requests") or {}).items() if k in ("cpu", "memory")}
        gpus = (resources.get("limits") or {}).get("nvidia.com/gpu")  # an extended resource: its limit is asked
        for name, value in {**asked, **({"nvidia.com/gpu": gpus} if gpus else {})}.items():
            wanted[name] = wanted.get(name, Decimal(0)) + quantity(value)
    for name, amount in wanted.items():
        have = quantity(allocatable.get(name, "0"))
        if have < amount:
            return f"{name} {_show(name, amount)} wanted, {_show(name, have)} allocatable"
    return None


def _show(name: str, amount: Decimal) -> str:
    if name == "memory":
        return f"{(amount / 2**30).quantize(Decimal('0.1'))}Gi"
    return f"{amount.normalize():f}"


def node_findings(pods: dict[str, dict[str, Any]], nodes: list[dict[str, Any]], count: dict[str, int]) -> list[Finding]:
    """`pods`: role -> pod spec (the trainer's GPU pods, the head); `count`: how many of each must run at once."""
    found: list[Finding] = []
    for role, pod in pods.items():
        reasons = {n["metadata"]["name"]: why_not(pod, n) for n in nodes}
        fitting = [name for name, reason in reasons.items() if reason is None]
        if len(fitting) >= count.get(role, 1):
            continue
        listed = "; ".join(f"{name}: {reason}" for name, reason in sorted(reasons.items())[:6] if reason)
        found.append(Finding(
            "warning", f"the trainer's {role} pod fits {len(fitting)} of the {len(nodes)} nodes the API server lists "
            f"(needs {count.get(role, 1)}): {listed or 'no nodes'}. It stays Pending unless a cluster autoscaler adds "
            "a node that fits",
            "set --trainer-cpu/--trainer-memory (per pod), --node-selector and --toleration to match your GPU nodes"))
    return found
