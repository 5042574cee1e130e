"""What the provision reads from the cluster before it applies anything (rl_backend/provision/preflight.py), on kmock
holding the objects a real cluster of that kind holds: the CNI's DaemonSets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rl_backend.provision.preflight import cni_enforces
from rl_backend.provision.resources import Resources
from tests.test_provision_support import (  # noqa: F401 - fast_schemas is an autouse fixture
    cluster,
    fast_schemas,
)

pytestmark = pytest.mark.timeout(60)


def _daemonset(name: str, namespace: str = "kube-system", containers: list[dict[str, Any]] | None = None,
               ) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"spec": {"containers": containers or [{"name": name, "image": f"{name}:1"}]}}}}


VPC_CNI = [{"name": "aws-node", "image": "amazon-k8s-cni:v1.18.1"},
           {"name": "aws-network-policy-agent", "image": "aws-network-policy-agent:v1.1.1",
            "args": ["--enable-network-policy=false"]}]


@pytest.mark.parametrize(("daemonsets", "expected"), [
    ([_daemonset("kube-flannel-ds", "kube-flannel"), _daemonset("kube-proxy")], ("Flannel", False)),
    ([_daemonset("calico-node", "calico-system"), _daemonset("kube-proxy")], ("Calico", True)),
    ([_daemonset("anetd")], ("GKE Dataplane V2", True)),
    ([_daemonset("aws-node", containers=VPC_CNI)], ("Amazon VPC CNI (enableNetworkPolicy off)", False)),
    ([_daemonset("aws-node", containers=[{**c, "args": ["--enable-network-policy=true"]} for c in VPC_CNI])],
     ("Amazon VPC CNI with its network policy agent", True)),
    ([_daemonset("kindnet", containers=[{"name": "kindnet-cni", "image": "kindest/kindnetd:v20230511-dc714da8"}])],
     ("kindnet", False)),
    ([_daemonset("kindnet", containers=[{"name": "kindnet-cni", "image": "kindest/kindnetd:v20240813-c6f155d6"}])],
     ("kindnet", True)),
    ([_daemonset("kube-proxy")], (None, None)),
])
def test_the_cni_is_judged_by_its_daemonsets(daemonsets: list[dict[str, Any]], expected: Any) -> None:
    async def scenario() -> Any:
        async with cluster() as (server, api, _):
            for daemonset in daemonsets:
                meta = daemonset["metadata"]
                server.objects["apps/v1/daemonsets", meta["namespace"], meta["name"]] = daemonset
            return await asyncio.to_thread(cni_enforces, Resources(api, "default"))

    assert asyncio.run(scenario()) == expected


def test_a_provision_on_a_cni_that_does_not_enforce_policies_says_so_before_applying(tmp_path: Path) -> None:
    from tests.test_provision_apply import _bring_up
    from tests.test_provision_support import NAMES, consoles, load_target, options, run_provision, wait_for, write_project

    target = load_target(write_project(tmp_path))
    err, out, err_text, _ = consoles()

    async def scenario() -> Any:
        async with cluster() as (server, api, _):
            server.objects["apps/v1/daemonsets", "kube-flannel", "kube-flannel-ds"] = _daemonset("kube-flannel-ds",
                                                                                                 "kube-flannel")
            task = run_provision(api, target, options(), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await _bring_up(server, task)
            return await asyncio.wait_for(task, 30)

    assert asyncio.run(scenario()).outcome == "ready"
    text = err_text.getvalue()
    assert "CNI (Flannel) does not enforce NetworkPolicy" in text and "metadata server" in text
    assert text.index("does not enforce") < text.index("created")


GKE_PD = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "pd.csi.storage.gke.io",
          "metadata": {"name": "standard-rwo", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}
FILESTORE = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "filestore.csi.storage.gke.io",
             "metadata": {"name": "standard-rwx"}}
EFS = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "efs.csi.aws.com",
       "metadata": {"name": "efs-sc"}}


def _node(name: str, cpu: str = "3920m", memory: str = "15Gi", gpus: str = "1", labels: dict[str, str] | None = None,
          taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A node as the API server lists it: allocatable is what is left after the system's reservations (a 4 vCPU /
    16 GiB machine allocates about 3.9 CPU and 15 GiB)."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints if taints is not None else [{"key": "nvidia.com/gpu", "value": "present",
                                                                  "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus}}}


def _plan(tmp_path: Path, **extra: Any) -> list[dict[str, Any]]:
    from rl_backend.provision.session import dry_run
    from tests.test_provision_support import load_target, options, write_project

    return dry_run(load_target(write_project(tmp_path)), options(**extra)).manifests


def test_storage_is_checked_against_the_classes_the_cluster_has(tmp_path: Path) -> None:
    from rl_backend.provision.cluster_fit import storage_findings
    from tests.test_provision_support import NAMES

    def findings(classes: list[dict[str, Any]], **extra: Any) -> list[Any]:
        claims = [m for m in _plan(tmp_path, **extra) if m["kind"] == "PersistentVolumeClaim"]
        return storage_findings(claims, classes, store_claim=NAMES.store_pvc, uid=10001)

    # A RayJob's checkpoints need ReadWriteMany: GKE's default PD class cannot, and agl says what to set.
    (error,) = findings([GKE_PD], gpus=16)
    assert error.level == "error" and "ReadWriteMany" in error.text and "standard-rwo" in error.text
    assert "--storage-class" in error.hint and "Filestore" in error.hint
    assert findings([GKE_PD], gpus=1) == []  # one pod mounts them: ReadWriteOnce on PD is right
    # Filestore for the checkpoints: the store stays on the default block class; fsGroup is said up front.
    (warning,) = findings([GKE_PD, FILESTORE], gpus=16, storage_class="standard-rwx")
    assert warning.level == "warning" and "fsGroup" in warning.text and "10001" in warning.text
    # The gateway's SQLite on a network filesystem is refused, naming the flag that moves it.
    errors = [f for f in findings([GKE_PD, EFS], store_storage_class="efs-sc") if f.level == "error"]
    assert len(errors) == 1 and "SQLite" in errors[0].text and "--store-storage-class" in errors[0].hint
    (missing,) = findings([], gpus=1)[:1]
    assert "no default StorageClass" in missing.text


def test_the_trainer_pods_are_checked_against_the_nodes_the_api_lists(tmp_path: Path) -> None:
    from rl_backend.provision.cluster_fit import node_findings
    from rl_backend.provision.preflight import _trainer_pods

    def findings(nodes: list[dict[str, Any]], **extra: Any) -> list[Any]:
        pods, count = _trainer_pods(_plan(tmp_path, **extra))
        return node_findings(pods, nodes, count)

    small = [_node("gpu-1")]  # one L4 on a 4 vCPU / 16 GiB machine
    (finding,) = findings(small)
    # The trainer's 4 CPUs and its grader container's 0.1 (a sidecar: it runs beside the trainer).
    assert "fits 0 of the 1 nodes" in finding.text and "cpu 4.1 wanted, 3.92 allocatable" in finding.text
    assert "--trainer-cpu" in finding.hint
    assert findings(small, trainer_cpu="3", trainer_memory="12Gi") == []
    # GKE Autopilot-like: the GPU nodes carry an accelerator label and their own taint.
    labelled = [_node("gpu-1", labels={"cloud.google.com/gke-accelerator": "nvidia-l4"},
                      taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])]
    (tainted,) = findings(labelled, trainer_cpu="3", trainer_memory="12Gi")
    assert "taint dedicated=gpu:NoSchedule not tolerated" in tainted.text
    fitted = dict(trainer_cpu="3", trainer_memory="12Gi", node_selector={"cloud.google.com/gke-accelerator": "nvidia-l4"},
                  tolerations=[{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}])
    assert findings(labelled, **fitted) == []
    (selector,) = findings([_node("gpu-1")], **fitted)
    assert "no label cloud.google.com/gke-accelerator=nvidia-l4" in selector.text
    # Two GPU workers need two nodes that fit.
    big, cpu_only = _node("a", cpu="40", memory="200Gi", gpus="8"), _node("cpu", cpu="8", memory="32Gi", gpus="0",
                                                                           taints=[])
    (workers,) = findings([big, cpu_only], gpus=16)
    assert "GPU worker pod fits 1 of the 2 nodes" in workers.text and "needs 2" in workers.text
    # The head asks for no GPU and tolerates no GPU taint: with GPU nodes only, it has nowhere to go.
    head = [f.text for f in findings([big, {**big, "metadata": {"name": "b", "labels": {}}}], gpus=16)]
    assert len(head) == 1 and "head pod fits 0 of the 2 nodes" in head[0] and "nvidia.com/gpu" in head[0]


def test_preflight_reads_the_cluster_and_applies_nothing(tmp_path: Path) -> None:
    import kmock

    from agl_cli.commands.train_k8s import provision as cli_provision  # noqa: F401 - the CLI's path is below
    from rl_backend.provision.options import ProvisionError
    from tests.test_provision_support import consoles, get, load_target, options, run_provision, write_project

    target = load_target(write_project(tmp_path))
    err, out, err_text, _ = consoles()

    async def scenario(classes: list[dict[str, Any]], version: str = "30", **extra: Any) -> Any:
        async with cluster(kuberay=True) as (server, api, _):
            server["get /version/"] << {"major": "1", "minor": f"{version}+", "gitVersion": f"v1.{version}.2-eks-1"}
            server.resources["v1/nodes"] = kmock.ResourceInfo(namespaced=False)
            server.resources["storage.k8s.io/v1/storageclasses"] = kmock.ResourceInfo(namespaced=False)
            for item in classes:
                server.objects["storage.k8s.io/v1/storageclasses", None, item["metadata"]["name"]] = item
            for node in (_node("gpu-1", cpu="40", memory="200Gi", gpus="8"),
                         _node("gpu-2", cpu="40", memory="200Gi", gpus="8")):
                server.objects["v1/nodes", None, node["metadata"]["name"]] = node
            try:
                result: Any = await asyncio.wait_for(run_provision(api, target, options(preflight=True, **extra),
                                                                   err, out), 30)
            except ProvisionError as exc:
                result = exc
            return result, await get(server, "ConfigMap")

    result, config_maps = asyncio.run(scenario([GKE_PD, FILESTORE], gpus=16, storage_class="standard-rwx"))
    assert result.outcome == "preflight" and config_maps == []
    assert "fsGroup" in err_text.getvalue()
    error, config_maps = asyncio.run(scenario([GKE_PD], gpus=16))
    assert isinstance(error, ProvisionError) and error.exit_code == 2 and config_maps == []
    assert "would not start; nothing was applied" in error.message and "ReadWriteMany" in error.message
    # The grader container is a native sidecar: a cluster older than 1.29 would hold the trainer pod in Init.
    old, config_maps = asyncio.run(scenario([GKE_PD, FILESTORE], version="27", gpus=16, storage_class="standard-rwx"))
    assert isinstance(old, ProvisionError) and old.exit_code == 2 and config_maps == []
    assert "Kubernetes v1.27.2-eks-1" in old.message and "upgrade the cluster to Kubernetes 1.29" in old.message
    gated, _ = asyncio.run(scenario([GKE_PD, FILESTORE], version="28", gpus=16, storage_class="standard-rwx"))
    assert gated.outcome == "preflight" and "SidecarContainers feature gate" in err_text.getvalue()


def test_gpu_pod_placement_and_size_are_settable_and_checked(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tests.test_provision_render import _app
    from tests.test_provision_support import write_project

    config = write_project(tmp_path)
    runner = CliRunner()
    ok = runner.invoke(_app(), [str(config), "--on", "kubernetes", "--dry-run", "--json", "--trainer-cpu", "3",
                                "--trainer-memory", "12Gi", "--node-selector",
                                "cloud.google.com/gke-accelerator=nvidia-l4", "--toleration", "dedicated=gpu:NoSchedule"])
    assert ok.exit_code == 0, ok.output
    import json

    job = next(m for m in json.loads(ok.stdout)["manifests"] if m["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "3", "memory": "12Gi"}
    for flags, message in ((["--trainer-memory", "lots"], "not a Kubernetes quantity"),
                           (["--node-selector", "gpu"], "KEY=VALUE"),
                           (["--toleration", "dedicated=gpu:Sometimes"], "KEY[=VALUE][:EFFECT]")):
        bad = runner.invoke(_app(), [str(config), "--on", "kubernetes", "--dry-run", *flags])
        assert bad.exit_code == 2 and message in bad.output, (flags, bad.output)
