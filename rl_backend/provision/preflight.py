"""What the cluster itself says about a train before anything is applied: facts read through the official client
(StorageClasses, nodes, DaemonSets; the KubeRay operator in session.py), judged by cluster_fit.py, each a finding a
platform engineer can act on. Reads that agl may not make (403) leave a fact unknown and say so; they never stop a
provision on their own.

The CNI: NetworkPolicies are what keep other namespaces out of the train and the rollout pods (agent code) away from
the metadata server and the API server, and only a CNI that enforces them makes them more than stored objects.
"""

from __future__ import annotations

from typing import Any

from rl_backend.provision.cluster_fit import Finding, node_findings, storage_findings
from rl_backend.provision.resources import Resources

# DaemonSet name -> the CNI (or policy agent) it runs, for those that enforce NetworkPolicy.
ENFORCING = {"calico-node": "Calico", "cilium": "Cilium", "anetd": "GKE Dataplane V2", "antrea-agent": "Antrea",
             "kube-router": "kube-router", "weave-net": "Weave Net", "canal": "Canal", "azure-npm": "Azure NPM",
             "kube-ovn-cni": "Kube-OVN", "ovnkube-node": "OVN-Kubernetes"}
NOT_ENFORCING = {"kube-flannel-ds": "Flannel", "kube-flannel": "Flannel", "flannel": "Flannel"}
KINDNET_POLICY_SINCE = "v20240813"  # kindnetd enforces NetworkPolicy from the image kind v0.24 ships


def _containers(daemonset: dict[str, Any]) -> list[dict[str, Any]]:
    return ((daemonset.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []


def _judge(daemonset: dict[str, Any]) -> tuple[str, bool] | None:
    name = daemonset["metadata"]["name"]
    if name in ENFORCING:
        return ENFORCING[name], True
    if name in NOT_ENFORCING:
        return NOT_ENFORCING[name], False
    if name == "aws-node":  # the Amazon VPC CNI enforces only with its network policy agent switched on
        agent = [c for c in _containers(daemonset) if c.get("name") == "aws-network-policy-agent"]
        on = any("--enable-network-policy=true" in (c.get("args") or []) for c in agent)
        return ("Amazon VPC CNI" + (" with its network policy agent" if on else " (enableNetworkPolicy off)"), on)
    if name.startswith("kindnet"):
        tags = [c.get("image", "").rpartition(":")[2] for c in _containers(daemonset)]
        return "kindnet", any(t.startswith("v2") and t >= KINDNET_POLICY_SINCE for t in tags)
    return None


def cni_enforces(res: Resources) -> tuple[str | None, bool | None]:
    """(what runs, whether it enforces NetworkPolicy); (None, None) when agl cannot tell."""
    body = res.look("AppsV1Api", "list_daemon_set_for_all_namespaces")
    if body is None:
        body = res.look("AppsV1Api", "list_namespaced_daemon_set", "kube-system")
    if body is None:
        return None, None
    found = [j for j in (_judge(d) for d in body.get("items") or []) if j is not None]
    if any(enforces for _, enforces in found):
        return next(what for what, enforces in found if enforces), True
    if found:
        return ", ".join(what for what, _ in found), False
    return None, None


def cni_notes(res: Resources) -> list[str]:
    what, enforces = cni_enforces(res)
    if enforces:
        return []
    stakes = ("the train's NetworkPolicies would be stored but not enforced: any pod could reach the gateway, the "
              "policy servers and the Ray dashboard, and rollout pods (agent code) the cloud metadata server and the "
              "API server")
    if enforces is False:
        return [f"warning: the cluster's CNI ({what}) does not enforce NetworkPolicy; {stakes}. Use a CNI that "
                "does (Calico, Cilium, GKE Dataplane V2, the VPC CNI's network policy agent on EKS)"]
    return [f"warning: cannot tell whether the cluster's CNI enforces NetworkPolicy (no DaemonSet agl knows, or no "
            f"permission to list DaemonSets); if it does not, {stakes}"]


def _trainer_pods(manifests: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    pods: dict[str, dict[str, Any]] = {}
    count: dict[str, int] = {}
    for manifest in manifests:
        if manifest["kind"] == "Job":
            pods["trainer"] = manifest["spec"]["template"]["spec"]
        if manifest["kind"] == "RayJob":
            cluster = manifest["spec"]["rayClusterSpec"]
            pods["head"] = cluster["headGroupSpec"]["template"]["spec"]
            group = cluster["workerGroupSpecs"][0]
            pods["GPU worker"], count["GPU worker"] = group["template"]["spec"], int(group["replicas"])
    return pods, count


def sidecar_findings(version: dict[str, Any] | None) -> list[Finding]:
    """The trainer's pod runs graders in a native sidecar (an init container with restartPolicy Always): served from
    Kubernetes 1.29, on 1.28 only behind the SidecarContainers gate. Before that the API server drops the field and
    the grader container, which never exits, holds the pod in Init for ever. `version`: what /version says."""
    if not version:
        return []
    try:
        major, minor = int(str(version.get("major", "")).rstrip("+")), int(str(version.get("minor", "")).rstrip("+"))
    except ValueError:
        return []
    shown = version.get("gitVersion") or f"{major}.{minor}"
    if (major, minor) >= (1, 29):
        return []
    what = (f"the cluster runs Kubernetes {shown}: the trainer pod's grader container is a native sidecar (an init "
            "container with restartPolicy: Always)")
    if (major, minor) == (1, 28):
        return [Finding("warning", f"{what}, which 1.28 runs only with the SidecarContainers feature gate on (off by "
                                   "default): without it the trainer pod never leaves Init",
                        "enable SidecarContainers on the API server and kubelets, or upgrade the cluster to 1.29+")]
    return [Finding("error", f"{what}, which Kubernetes runs from 1.29: the trainer pod would never leave Init",
                    "upgrade the cluster to Kubernetes 1.29 or later")]


def cluster_findings(res: Resources, manifests: list[dict[str, Any]], *, store_claim: str,
                     uid: int) -> list[Finding]:
    """Everything agl can tell from the cluster about whether this plan would start, before applying it."""
    found: list[Finding] = []
    classes = res.look("StorageV1Api", "list_storage_class")
    claims = [m for m in manifests if m["kind"] == "PersistentVolumeClaim"]
    if classes is None:
        found.append(Finding("warning", "cannot list StorageClasses (no permission): the volumes' classes are "
                                        "unchecked; a RayJob needs a ReadWriteMany one for the checkpoints"))
    else:
        found += storage_findings(claims, classes.get("items") or [], store_claim=store_claim, uid=uid)
    nodes = res.look("CoreV1Api", "list_node")
    if nodes is None:
        found.append(Finding("warning", "cannot list nodes (no permission): whether the trainer's pods fit any "
                                        "node is unchecked"))
    else:
        pods, count = _trainer_pods(manifests)
        found += node_findings(pods, nodes.get("items") or [], count)
    found += [Finding("warning", note.removeprefix("warning: ")) for note in cni_notes(res)]
    found += sidecar_findings(res.look("VersionApi", "get_code"))
    return found
