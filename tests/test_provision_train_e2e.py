"""A cluster train end to end on kmock: `agl train --on kubernetes` applies it; the trainer's side then runs its
rollouts as Jobs the way the trainer's pod would — from the cluster's copy of agl.yaml in the train's ConfigMap, with
the shipped agent — through a fault-injecting proxy (an outage, a pod whose image cannot be pulled); `agl train
status` reports it; `agl train stop` deletes everything, rollout Jobs included.

The stand-in kubelet (tests/helpers/kubelet.py) runs each rollout Job as a local process and writes the project
ConfigMap's files where the pod mounts them. There is no mount namespace here, so the test moves that mount from
/etc/agl/project to a folder of its own; everything else is the cluster's copy as rendered.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_backend.provision.options import ClusterOptions
from rl_backend.provision.resources import Resources
from rl_backend.provision.session import stop
from rl_backend.provision.status import train_status
from rl_backend.rollout.k8s_spec import KubernetesSpec
from rl_backend.rollout.kubernetes import KubernetesController
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.k8s_rollouts import AGENT, make_job
from tests.helpers.kubelet import StandInKubelet
from tests.test_provision_bundle import write_bundled
from tests.test_provision_support import (  # noqa: F401 - fast_schemas is an autouse fixture
    NAMES,
    NS,
    cluster,
    consoles,
    fast_schemas,
    gateway_up,
    get,
    load_target,
    options,
    run_provision,
    stored_names,
    trainer_pod,
    wait_for,
)

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(not all(shutil.which(t) for t in ("sh", "base64", "tee", "tail", "head", "wc")),
                       reason="the wrapper needs a POSIX shell and coreutils"),
]
FAULTS = {"request_timeout_s": 0.5, "api_retry_s": 30, "api_backoff_max_s": 0.2, "pod_check_s": 0.1,
          "watch_timeout_s": 2}


def _trainer_view(config_map: dict[str, Any], mount: Path) -> KubernetesSpec:
    """The cluster's agl.yaml as the trainer's pod reads it, its project mount moved into `mount`."""
    text = next(v for k, v in config_map["data"].items() if k.endswith("agl.yaml"))
    section = yaml.safe_load(text)["kubernetes"]
    assert section["project"]["mount_path"] == section["workdir"] == "/etc/agl/project"
    section["project"]["mount_path"] = section["workdir"] = str(mount)
    return KubernetesSpec.model_validate({**section, **FAULTS})


def test_a_cluster_train_applies_runs_its_rollouts_as_jobs_reports_and_stops(tmp_path: Path) -> None:
    config = write_bundled(tmp_path / "project")
    (tmp_path / "project" / "agent.py").write_text(AGENT)  # reads --task, writes --out, reports what it saw
    target = load_target(config)
    err, out, _, _ = consoles()
    image_env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "LANG": "C.UTF-8"}

    async def scenario() -> dict[str, Any]:
        async with cluster() as (server, api, logs):
            up = run_provision(api, target, options(), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            await trainer_pod(server)
            applied = await asyncio.wait_for(up, 30)
            spec = _trainer_view(await get(server, "ConfigMap", NAMES.config), tmp_path / "mounted-project")
            host, port = api.configuration.host.rsplit("//", 1)[1].split(":")
            kubelet = StandInKubelet(server, image_env=image_env, pod_logs=logs,
                                     unpullable=lambda job: job["metadata"]["labels"].get("agl.dev/task") == "stuck")
            async with FaultProxy(host, int(port)) as proxy, kubelet:
                from kubernetes import client

                configuration = client.Configuration()
                configuration.host = proxy.url
                proxied = client.ApiClient(configuration)
                controller = KubernetesController(spec, run_id="20261201-run", api_client=proxied,
                                                  deny_env={"UPSTREAM_KEY_ENV"}, watch_read_slack_s=0.5)
                host_dir = tmp_path / "trainer"
                ok = await asyncio.wait_for(controller.run(make_job(host_dir, "r1-1", {"id": "ok", "answer": 7})), 30)
                await proxy.set_mode("refuse")  # the API server restarts while the next rollout starts
                later = asyncio.create_task(controller.run(make_job(host_dir, "r2-1", {"id": "later", "answer": 8})))
                await asyncio.sleep(1.5)
                await proxy.set_mode("pass")
                after_outage = await asyncio.wait_for(later, 30)
                stuck = await asyncio.wait_for(controller.run(make_job(host_dir, "r3-1", {"id": "stuck"})), 30)
                status = await asyncio.to_thread(train_status, Resources(api, NS), NAMES)
                deleted = await asyncio.to_thread(stop, "calc", ClusterOptions(namespace=NS), api_client=api)
                await controller.close()
                proxied.close()
            return {"applied": applied, "ok": ok, "after_outage": after_outage, "stuck": stuck, "status": status,
                    "deleted": deleted, "remaining": stored_names(server), "retries": controller.api.retries,
                    "output": json.loads((host_dir / "rollouts" / "r1-1" / "output.txt").read_text())}

    run = asyncio.run(scenario())
    assert run["applied"].outcome == "ready"
    # The shipped agent ran in its rollout Job (the runtime image, the project's folder), not in the trainer's pod.
    assert run["ok"].exit_code == 0 and run["output"]["answer"] == 7
    assert run["output"]["seen"]["OPENAI_BASE_URL"].startswith("http://agl-calc-gateway.default.svc:8090/rollouts/")
    assert run["after_outage"].exit_code == 0 and run["retries"] >= 1
    assert run["stuck"].exit_code is None and not run["stuck"].timed_out
    assert "could not start: ImagePullBackOff: Back-off pulling image: not found" in run["stuck"].stderr_tail
    status = run["status"]
    assert status["phase"] == "running", status["checks"]
    rollout_jobs = {o["name"] for o in status["objects"] if o["kind"] == "Job" and o["component"] == "rollout"}
    assert len(rollout_jobs) == 2  # the finished ones; the stuck one's Job was deleted at once
    assert set(run["deleted"]) >= {f"Job/{name}" for name in rollout_jobs} | {
        f"NetworkPolicy/{NAMES.gateway_ingress}", f"NetworkPolicy/{NAMES.policy_ingress}",
        f"Secret/{NAMES.policy_key}", f"ConfigMap/{NAMES.config}", f"Job/{NAMES.trainer}"}
    assert {n for n in run["remaining"] if not n.startswith(("Pod/", "EndpointSlice/"))} == {"Secret/agl-upstream-keys"}
