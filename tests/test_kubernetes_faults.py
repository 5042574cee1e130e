"""The rollout controller when the API server misbehaves, and when a pod cannot start.

The official client talks to kmock through a fault-injecting TCP proxy (tests/helpers/fault_proxy.py) that a test
switches between passing bytes, accepting connections and never answering, and refusing connections. Covered: a
request timeout on every call (an API that never answers ends the run with a clear message instead of hanging it;
a rollout still ends at its deadline; a cancelled rollout returns at once), an outage ridden out for minutes
rather than seconds, pods that cannot start (ImagePullBackOff, CreateContainerConfigError, ErrImagePull,
Unschedulable) failing within seconds with their reason, Jobs a crashed process left behind adopted on resume,
a ClusterIP refused in a NetworkPolicy ipBlock, and the DNS rule's forms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kmock
import pytest

from rl_backend.rollout.k8s_client import KubernetesUnavailableError
from rl_backend.rollout.k8s_manifest import LABEL_RUN, job_name, render_policy, validate_schema
from rl_backend.rollout.k8s_spec import KubernetesSpec
from rl_backend.rollout.kubernetes import KubernetesConfigError, KubernetesController
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.k8s_rollouts import make_job
from tests.helpers.kubelet import PodLogs, create_pod, kube_api, list_jobs, now, patch_status, wait_for_jobs
from tests.test_kubernetes_controller import _play_kubelet, _watching  # noqa: E402

RUN = "20261201-080000-ab12"
pytestmark = pytest.mark.timeout(60)
# Short enough to keep the tests fast, long enough for kmock on a loaded 2-core machine.
FAST = {"request_timeout_s": 0.5, "api_backoff_max_s": 0.2, "pod_check_s": 0.1, "unstartable_after_s": 0.6,
        "unschedulable_after_s": 0.6, "watch_timeout_s": 1}


def _spec(**overrides: Any) -> KubernetesSpec:
    return KubernetesSpec.model_validate({"image": "agent:1", "gateway_url": "http://10.1.2.3:8400", **FAST,
                                          **overrides})


def _controller(api: Any, **overrides: Any) -> KubernetesController:
    return KubernetesController(_spec(**overrides), run_id=RUN, api_client=api, deny_env={"UPSTREAM_KEY_ENV"},
                                watch_read_slack_s=0.5)


@asynccontextmanager
async def proxied_api() -> AsyncIterator[tuple[kmock.KubernetesEmulator, Any, FaultProxy]]:
    """kmock behind a FaultProxy, and an official-client ApiClient pointed at the proxy."""
    from kubernetes import client

    async with kube_api() as (server, direct):
        host, port = direct.configuration.host.rsplit("//", 1)[1].split(":")
        async with FaultProxy(host, int(port)) as proxy:
            configuration = client.Configuration()
            configuration.host = proxy.url
            api = client.ApiClient(configuration)
            try:
                yield server, api, proxy
            finally:
                api.close()


def test_an_api_that_never_answers_ends_the_run_with_a_clear_message(tmp_path: Path) -> None:
    async def scenario() -> tuple[BaseException, float]:
        async with proxied_api() as (_, api, proxy):
            await proxy.set_mode("hang")
            started = time.monotonic()
            async with _controller(api, api_retry_s=1.5) as controller:
                with pytest.raises(KubernetesUnavailableError) as caught:
                    await asyncio.wait_for(controller.run(make_job(tmp_path, "r1-1", {"id": "t"}, timeout_s=5)), 15)
            return caught.value, time.monotonic() - started

    error, took = asyncio.run(scenario())
    assert "has not answered for" in str(error) and "creating Job" in str(error) and "api_retry_s" in str(error)
    assert took < 10  # each request timed out after 0.5 s; agl gave up after 1.5 s of them, and close() is bounded


def test_a_rollout_ends_at_its_deadline_when_the_api_stops_answering(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, float]:
        async with proxied_api() as (server, api, proxy), \
                _controller(api, startup_allowance_s=0, unschedulable_after_s=0, deadline_grace_s=0.5) as controller:
            started = time.monotonic()
            running = asyncio.create_task(controller.run(make_job(tmp_path, "r1-1", {"id": "t"}, timeout_s=1)))
            await wait_for_jobs(server, 1)
            await proxy.set_mode("hang")  # the Job exists; the API goes silent (its delete will never answer)
            result = await asyncio.wait_for(running, 15)
            return result, time.monotonic() - started

    result, took = asyncio.run(scenario())
    assert result.timed_out and "did not end" in result.stderr_tail and "could not delete it" in result.stderr_tail
    assert took < 6  # 1 s deadline + 0.5 s grace + one 0.5 s delete timeout, with slack for a loaded machine


def test_a_cancelled_rollout_returns_at_once_when_the_api_stops_answering(tmp_path: Path) -> None:
    async def scenario() -> tuple[float, float]:
        async with proxied_api() as (server, api, proxy):
            controller = _controller(api)
            running = asyncio.create_task(controller.run(make_job(tmp_path, "r1-1", {"id": "t"})))
            await wait_for_jobs(server, 1)
            await _watching(controller)
            await proxy.set_mode("hang")
            started = time.monotonic()
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(running, 15)
            cancelled_in = time.monotonic() - started
            started = time.monotonic()
            await asyncio.wait_for(controller.close(), 15)  # its deletes are bounded by the request timeout
            return cancelled_in, time.monotonic() - started

    cancelled_in, closed_in = asyncio.run(scenario())
    assert cancelled_in < 0.5
    assert closed_in < 6


def test_a_short_outage_is_ridden_out(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, int]:
        async with proxied_api() as (server, api, proxy):
            logs = PodLogs(server)
            await proxy.set_mode("refuse")  # the API server restarts: connections are refused for 8 s
            async with _controller(api, api_retry_s=60) as controller:
                running = asyncio.create_task(controller.run(make_job(tmp_path, "r1-1", {"id": "t"})))
                await asyncio.sleep(8)
                assert not running.done(), "the controller gave up during a short outage"
                await proxy.set_mode("pass")
                (created,) = await wait_for_jobs(server, 1)
                await _watching(controller)
                await _play_kubelet(server, logs, created, outcome="succeeded", exit_code=0, output=b"42")
                result = await asyncio.wait_for(running, 15)
                return result, controller.api.retries

    result, retries = asyncio.run(scenario())
    assert result.exit_code == 0 and not result.timed_out
    assert retries >= 5  # it kept trying, with pauses of at most 0.2 s here (10 s by default)


def test_an_outage_that_lasts_ends_the_run_with_a_clear_message(tmp_path: Path) -> None:
    async def scenario() -> BaseException:
        async with proxied_api() as (_, api, proxy):
            await proxy.set_mode("refuse")
            async with _controller(api, api_retry_s=1.0) as controller:
                with pytest.raises(KubernetesUnavailableError) as caught:
                    await asyncio.wait_for(controller.run(make_job(tmp_path, "r1-1", {"id": "t"})), 15)
            return caught.value

    error = asyncio.run(scenario())
    assert "Kubernetes API at http://127.0.0.1:" in str(error) and "has not answered for" in str(error)


@pytest.mark.parametrize(("status", "reason", "message"), [
    ({"containerStatuses": [{"name": "agent", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "agent:1"'}}}]},
     "ImagePullBackOff", 'Back-off pulling image "agent:1"'),
    ({"containerStatuses": [{"name": "agent", "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "agent-keys" not found'}}}]},
     "CreateContainerConfigError", 'secret "agent-keys" not found'),
    ({"containerStatuses": [{"name": "agent", "state": {"waiting": {
        "reason": "ErrImagePull", "message": "pull access denied for agent"}}}]},
     "ErrImagePull", "pull access denied for agent"),
    ({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                      "message": "0/3 nodes are available: 3 Insufficient memory."}]},
     "Unschedulable", "0/3 nodes are available: 3 Insufficient memory."),
])
def test_a_pod_that_cannot_start_fails_its_rollout_within_seconds(tmp_path: Path, status: dict[str, Any],
                                                                   reason: str, message: str) -> None:
    async def scenario() -> tuple[Any, float, list[dict[str, Any]]]:
        async with kube_api() as (server, api), _controller(api) as controller:
            started = time.monotonic()
            running = asyncio.create_task(controller.run(make_job(tmp_path, "r1-1", {"id": "t"}, timeout_s=120)))
            (created,) = await wait_for_jobs(server, 1)
            await _watching(controller)
            pod = await create_pod(server, created)
            await patch_status(server, "job", created["metadata"]["name"], {"active": 1})
            await patch_status(server, "pod", pod, {"phase": "Pending", **status})
            result = await asyncio.wait_for(running, 20)
            took = time.monotonic() - started
            await asyncio.sleep(0.3)  # the Job is deleted in the background, right away
            return result, took, await list_jobs(server)

    result, took, jobs = asyncio.run(scenario())
    assert result.exit_code is None and not result.timed_out
    assert f"could not start: {reason}: {message}" in result.stderr_tail
    assert "404" not in result.stderr_tail  # no log read of a pod that never ran
    assert took < 10  # not at the 150 s deadline
    assert jobs == []


def test_an_unschedulable_pod_waits_for_the_autoscaler_as_long_as_agl_yaml_says(tmp_path: Path) -> None:
    # A cluster autoscaler takes minutes to add a node: Unschedulable is given `unschedulable_after_s`, not the
    # seconds an image pull error gets, and the Job's deadline leaves the agent its whole timeout after that wait.
    async def scenario() -> tuple[bool, Any, float, int]:
        async with kube_api() as (server, api), _controller(api, unschedulable_after_s=2.5) as controller:
            started = time.monotonic()
            running = asyncio.create_task(controller.run(make_job(tmp_path, "r1-1", {"id": "t"}, timeout_s=120)))
            (created,) = await wait_for_jobs(server, 1)
            await _watching(controller)
            pod = await create_pod(server, created)
            await patch_status(server, "job", created["metadata"]["name"], {"active": 1})
            await patch_status(server, "pod", pod, {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes are available: 3 Insufficient cpu."}]})
            await asyncio.sleep(1.5)  # past unstartable_after_s (0.6): still waiting for a node
            waiting = not running.done()
            result = await asyncio.wait_for(running, 20)
            return waiting, result, time.monotonic() - started, created["spec"]["activeDeadlineSeconds"]

    waiting, result, took, deadline = asyncio.run(scenario())
    assert waiting and 2.5 <= took < 10
    assert "could not start: Unschedulable: 0/3 nodes are available" in result.stderr_tail
    assert deadline == 120 + 30 + 3  # timeout + startup allowance + the wait for a node (rounded up)
    assert KubernetesSpec.model_fields["unschedulable_after_s"].default >= 300  # minutes, as autoscalers take


def test_jobs_a_crashed_process_left_are_adopted_on_resume(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[str], int]:
        async with kube_api() as (server, api):
            logs = PodLogs(server)
            path = "/apis/batch/v1/namespaces/default/jobs"
            # What a crashed process of this run left (a rollout it had started), and another run's Job.
            for name, run in ((job_name(RUN, "r7-1"), RUN), ("agl-other-run-job", "other-run")):
                job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
                    "name": name, "namespace": "default", "labels": {LABEL_RUN: run}, "creationTimestamp": now()},
                    "spec": {"template": {"spec": {"containers": []}}}, "status": {"active": 1}}
                async with server.post(path, json=job) as response:
                    assert response.status == 200
            async with _controller(api) as controller:
                running = asyncio.create_task(controller.run(make_job(tmp_path, "r8-1", {"id": "t"})))
                for _ in range(200):
                    names = [j["metadata"]["name"] for j in await list_jobs(server)]
                    if job_name(RUN, "r7-1") not in names and job_name(RUN, "r8-1") in names:
                        break
                    await asyncio.sleep(0.05)
                await _watching(controller)
                created = next(j for j in await list_jobs(server) if j["metadata"]["name"] == job_name(RUN, "r8-1"))
                await _play_kubelet(server, logs, created, outcome="succeeded", exit_code=0, output=b"ok")
                assert (await running).exit_code == 0
                return names, controller.counters.orphans_deleted

    names, orphans = asyncio.run(scenario())
    assert sorted(names) == sorted([job_name(RUN, "r8-1"), "agl-other-run-job"])  # the orphan is gone, nothing else
    assert orphans == 1


def test_a_clusterip_in_an_ipblock_is_refused(tmp_path: Path) -> None:
    async def scenario() -> BaseException:
        async with kube_api() as (server, api):
            service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "agl-gateway", "namespace": "agl"},
                       "spec": {"clusterIP": "10.96.0.50", "clusterIPs": ["10.96.0.50"], "ports": [{"port": 8400}]}}
            async with server.post("/api/v1/namespaces/agl/services", json=service) as response:
                assert response.status == 200
            async with _controller(api, gateway_url="http://10.96.0.50:8400", network_policy={}) as controller:
                with pytest.raises(KubernetesConfigError) as caught:
                    await asyncio.wait_for(controller.run(make_job(tmp_path, "r1-1", {"id": "t"})), 15)
            async with server.get("/apis/networking.k8s.io/v1/namespaces/default/networkpolicies") as response:
                assert (await response.json())["items"] == []  # nothing was created
            return caught.value

    error = asyncio.run(scenario())
    assert "10.96.0.50 is the ClusterIP of Service agl/agl-gateway" in str(error)
    assert "gateway_pod_selector" in str(error)


KUBE_SYSTEM = {"kubernetes.io/metadata.name": "kube-system"}


@pytest.mark.parametrize(("dns", "peers", "ports"), [
    # kube-system's DNS pods only: a pod elsewhere labelled k8s-app: kube-dns gets no lookups.
    (True, [{"namespaceSelector": {"matchLabels": KUBE_SYSTEM}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
     [53]),
    ({"cidrs": ["169.254.20.10/32"]},  # NodeLocal DNSCache, next to the cluster's DNS pods
     [{"namespaceSelector": {"matchLabels": KUBE_SYSTEM}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}},
      {"ipBlock": {"cidr": "169.254.20.10/32"}}], [53]),
    ({"namespace_selector": {"kubernetes.io/metadata.name": "openshift-dns"},  # OpenShift's DNS listens on 5353
      "pod_selector": {"dns.operator.openshift.io/daemonset-dns": "default"}, "ports": [5353]},
     [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshift-dns"}},
       "podSelector": {"matchLabels": {"dns.operator.openshift.io/daemonset-dns": "default"}}}], [5353]),
    (False, None, None),
])
def test_the_dns_rule_is_configurable(tmp_path: Path, dns: Any, peers: Any, ports: Any) -> None:
    spec = _spec(gateway_url="http://10.0.3.7:8400", network_policy={"dns": dns})
    policy = render_policy(spec, RUN, tmp_path)
    validate_schema(policy, "1.30")
    rules = policy["spec"]["egress"]
    assert rules[0]["to"] == [{"ipBlock": {"cidr": "10.0.3.7/32"}}]
    if peers is None:
        assert len(rules) == 1
        return
    (rule,) = rules[1:]
    assert sorted(rule["to"], key=str) == sorted(peers, key=str)
    assert rule["ports"] == [{"protocol": p, "port": n} for n in ports for p in ("UDP", "TCP")]
    with pytest.raises(ValueError, match="pod_selector or cidrs"):
        _spec(network_policy={"gateway_cidrs": ["10.0.3.7/32"], "dns": {"pod_selector": None}})
