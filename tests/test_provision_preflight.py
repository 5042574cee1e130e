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
