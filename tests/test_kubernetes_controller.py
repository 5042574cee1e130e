"""The Kubernetes controller against kmock, an in-memory Kubernetes API served over HTTP, with the official client
pointed at it. The test plays the kubelet and the Job controller by hand: it creates the pod, serves its log and
patches the pod's and the Job's status. Covered: create, watch, status transitions, deadline, a Job that
disappears (deleted, or gone without an event), cancel, adoption on 409, the rate limit, watch resume and
410-relist, and cleanup by the run label."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import kmock
import pytest

from rl_backend.rollout.base import ProcessResult
from rl_backend.rollout.k8s_manifest import ANNOTATION_MARKER, LABEL_RUN, job_name, policy_name, validate_schema
from rl_backend.rollout.k8s_spec import KubernetesSpec
from rl_backend.rollout.kubernetes import KubernetesConfigError, KubernetesController
from tests.helpers.k8s_rollouts import UPSTREAM_KEY, make_job
from tests.helpers.kubelet import (
    PodLogs,
    create_pod,
    finish_pod,
    job_conditions,
    kube_api,
    list_jobs,
    patch_status,
    wait_for_jobs,
)

RUN = "20261130-090000-cd34"
pytestmark = pytest.mark.timeout(60)


def _controller(api: Any, **overrides: Any) -> KubernetesController:
    spec = KubernetesSpec.model_validate(
        {"image": "agent:1", "gateway_url": "http://10.1.2.3:8400", "watch_timeout_s": 1, **overrides}
    )
    return KubernetesController(spec, run_id=RUN, api_client=api, deny_env={"UPSTREAM_KEY_ENV"},
                                watch_read_slack_s=1.0)


def _block(marker: str, *, output: bytes | None, code: int, stderr: bytes = b"") -> bytes:
    """What the wrapper prints after the agent exits (the real wrapper runs in the e2e tests)."""
    lines = [f"AGL-{marker} begin", f"AGL-{marker} stderr {len(stderr)}", base64.b64encode(stderr).decode()]
    if output is None:
        lines.append(f"AGL-{marker} no-output")
    else:
        lines += [f"AGL-{marker} output {len(output)}", base64.b64encode(output).decode()]
    lines += [f"AGL-{marker} exit {code}", f"AGL-{marker} end"]
    return ("\n".join(lines) + "\n").encode()


async def _play_kubelet(server: kmock.KubernetesEmulator, logs: PodLogs, job: dict[str, Any], *, outcome: str,
                        exit_code: int | None, output: bytes | None = None, stderr: bytes = b"") -> None:
    """Create the Job's pod, give it a log, end the pod and then the Job, as the kubelet and Job controller do."""
    marker = job["metadata"]["annotations"][ANNOTATION_MARKER]
    pod = await create_pod(server, job)
    await patch_status(server, "job", job["metadata"]["name"], {"active": 1})
    logs.logs[pod] = bytearray(b"agent says hi\n")
    if exit_code is not None:
        logs.logs[pod] += _block(marker, output=output, code=exit_code, stderr=stderr)
        await finish_pod(server, pod, exit_code)
    await patch_status(server, "job", job["metadata"]["name"], job_conditions(outcome))


async def _watching(controller: KubernetesController) -> None:
    """Wait until the controller's watch is up. kmock keeps no event history, so (unlike a real API server,
    which replays events from the listed resourceVersion) a change made before the watch starts is never sent."""
    for _ in range(200):
        if controller.watcher is not None and controller.watcher.watches >= 1:
            await asyncio.sleep(0.1)
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the controller never started watching")


async def _with_one(tmp_path: Path, play: Callable[[kmock.KubernetesEmulator, PodLogs, dict[str, Any]], Awaitable[
        None]], **overrides: Any) -> tuple[ProcessResult, Any, list[dict[str, Any]]]:
    timeout_s = overrides.pop("timeout_s", 30)
    async with kube_api() as (server, api):
        logs = PodLogs(server)
        async with _controller(api, **overrides) as controller:
            job = make_job(tmp_path, "r1-1", {"id": "t1"}, timeout_s=timeout_s)
            running = asyncio.create_task(controller.run(job))
            (created,) = await wait_for_jobs(server, 1)
            await _watching(controller)
            await play(server, logs, created)
            result = await asyncio.wait_for(running, 20)
        return result, job, await list_jobs(server)


def test_a_successful_job_is_exit_0_and_its_output_comes_back_from_the_log(tmp_path: Path) -> None:
    async def play(server: kmock.KubernetesEmulator, logs: PodLogs, job: dict[str, Any]) -> None:
        validate_schema(job, "1.30")  # the manifest as the server received it
        assert job["metadata"]["name"] == job_name(RUN, "r1-1")
        assert job["metadata"]["labels"][LABEL_RUN] == RUN
        assert UPSTREAM_KEY not in json.dumps(job)
        await _play_kubelet(server, logs, job, outcome="succeeded", exit_code=0, output=b'{"answer": 4}',
                            stderr=b"warning: thinking\n")

    result, job, remaining = asyncio.run(_with_one(tmp_path, play))
    assert result.exit_code == 0 and not result.timed_out
    assert Path(job.env["AGL_OUTPUT_FILE"]).read_bytes() == b'{"answer": 4}'
    assert "agent says hi" in result.stdout_tail and "AGL-" not in result.stdout_tail
    assert result.stderr_tail == "warning: thinking\n"
    assert remaining == []  # close() deleted the run's Job


def test_a_failed_job_carries_the_containers_exit_code(tmp_path: Path) -> None:
    async def play(server: kmock.KubernetesEmulator, logs: PodLogs, job: dict[str, Any]) -> None:
        await _play_kubelet(server, logs, job, outcome="failed", exit_code=3, output=None,
                            stderr=b"Traceback: boom\n")

    result, job, _ = asyncio.run(_with_one(tmp_path, play))
    assert result.exit_code == 3 and not result.timed_out
    assert result.stderr_tail.rstrip().endswith("Traceback: boom")
    assert not Path(job.env["AGL_OUTPUT_FILE"]).exists()


def test_a_failed_job_without_a_pod_says_why(tmp_path: Path) -> None:
    async def play(server: kmock.KubernetesEmulator, logs: PodLogs, job: dict[str, Any]) -> None:
        await patch_status(server, "job", job["metadata"]["name"], job_conditions("failed", "pod evicted"))

    result, _, _ = asyncio.run(_with_one(tmp_path, play))
    assert result.exit_code is None and not result.timed_out
    assert "BackoffLimitExceeded: pod evicted" in result.stderr_tail.strip().splitlines()[-1]


def test_deadline_exceeded_is_a_timeout(tmp_path: Path) -> None:
    async def play(server: kmock.KubernetesEmulator, logs: PodLogs, job: dict[str, Any]) -> None:
        # the timeout, the startup allowance, the wait for a node
        assert job["spec"]["activeDeadlineSeconds"] == 2 + 30 + 300
        await _play_kubelet(server, logs, job, outcome="deadline", exit_code=None)

    result, _, _ = asyncio.run(_with_one(tmp_path, play, timeout_s=2))
    assert result.timed_out and result.exit_code is None
    assert "agent says hi" in result.stdout_tail


def test_agl_ends_a_job_the_cluster_never_ends(tmp_path: Path) -> None:
    async def play(server: kmock.KubernetesEmulator, logs: PodLogs, job: dict[str, Any]) -> None:
        pass  # nobody runs it

    started = time.monotonic()
    result, _, remaining = asyncio.run(_with_one(
        tmp_path, play, timeout_s=0.5, startup_allowance_s=0, unschedulable_after_s=0, deadline_grace_s=0.5))
    assert result.timed_out and "did not end" in result.stderr_tail
    assert remaining == [] and time.monotonic() - started < 10


def test_a_deleted_job_fails_with_that_reason(tmp_path: Path) -> None:
    async def play(server: kmock.KubernetesEmulator, logs: PodLogs, job: dict[str, Any]) -> None:
        async with server.delete(f"/apis/batch/v1/namespaces/default/jobs/{job['metadata']['name']}") as response:
            assert response.status == 200

    result, _, _ = asyncio.run(_with_one(tmp_path, play))
    assert result.exit_code is None and "deleted before it finished" in result.stderr_tail


def test_a_job_gone_without_an_event_is_noticed_by_the_resync(tmp_path: Path) -> None:
    async def play(server: kmock.KubernetesEmulator, logs: PodLogs, job: dict[str, Any]) -> None:
        del server.objects["batch/v1/jobs", "default", job["metadata"]["name"]]  # no watch event at all

    result, _, _ = asyncio.run(_with_one(tmp_path, play, resync_s=0.3))
    assert result.exit_code is None and "disappeared" in result.stderr_tail


def test_cancel_deletes_the_job(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with kube_api() as (server, api), _controller(api) as controller:
            running = asyncio.create_task(controller.run(make_job(tmp_path, "r1-1", {"id": "t"})))
            await wait_for_jobs(server, 1)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            # The rollout returns at once; its Job is deleted right after, in the background (not by close()).
            for _ in range(100):
                if await list_jobs(server) == []:
                    break
                await asyncio.sleep(0.05)
            assert await list_jobs(server) == []

    asyncio.run(scenario())


def test_a_repeated_create_adopts_the_job_and_a_foreign_one_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with kube_api() as (server, api):
            logs = PodLogs(server)
            async with _controller(api) as controller:
                job = make_job(tmp_path, "r1-1", {"id": "t"})
                running = asyncio.create_task(controller.run(job))
                (created,) = await wait_for_jobs(server, 1)
                await _play_kubelet(server, logs, created, outcome="succeeded", exit_code=0, output=b"first")
                assert (await running).exit_code == 0
                # The same rollout again (a retried create after a lost response): 409, adopt, same result.
                again = await controller.run(job)
                assert again.exit_code == 0 and controller.counters.adopted == 1
                assert controller.counters.created == 1 and len(await list_jobs(server)) == 1
                # A Job by that name from another run is not ours to adopt.
                foreign = {**created, "metadata": {**created["metadata"], "name": job_name(RUN, "r2-1"),
                                                    "labels": {LABEL_RUN: "someone-else"}}}
                async with server.post("/apis/batch/v1/namespaces/default/jobs", json=foreign) as response:
                    assert response.status == 200
                with pytest.raises(KubernetesConfigError, match="another run"):
                    await controller.run(make_job(tmp_path, "r2-1", {"id": "t"}))
            # close() deleted this run's Job and left the other run's alone.
            assert [j["metadata"]["labels"][LABEL_RUN] for j in await list_jobs(server)] == ["someone-else"]

    asyncio.run(scenario())


def test_creation_is_rate_limited(tmp_path: Path) -> None:
    async def scenario() -> list[float]:
        async with kube_api() as (server, api):
            logs = PodLogs(server)
            async with _controller(api, create_qps=10, create_burst=1) as controller:
                jobs = [make_job(tmp_path, f"r{i}-1", {"id": i}) for i in range(5)]
                running = [asyncio.create_task(controller.run(job)) for job in jobs]
                for created in await wait_for_jobs(server, 5):
                    await _play_kubelet(server, logs, created, outcome="succeeded", exit_code=0, output=b"x")
                assert [r.exit_code for r in await asyncio.gather(*running)] == [0] * 5
                return controller.counters.create_times

    times = asyncio.run(scenario())
    assert times[-1] - times[0] >= 4 / 10 - 0.02  # 5 creations at 10/s with a burst of 1


@pytest.mark.parametrize("how", ["error_event", "http_410"])
def test_the_watch_resumes_after_drops_and_relists_on_410(tmp_path: Path, how: str) -> None:
    async def scenario() -> Any:
        async with kube_api() as (server, api):
            logs = PodLogs(server)
            calls = {"n": 0}

            def expire_once(request: kmock.Request) -> Any:
                calls["n"] += 1
                if calls["n"] > 1:
                    return NotImplemented  # from now on the server's own watch answers
                if how == "http_410":
                    raise kmock.KubernetesError(status=410, reason="Expired", message="too old resource version")
                return {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}

            server["get", re.compile(r"/apis/batch/v1/namespaces/default/jobs")][{"watch": "true"}] << expire_once
            async with _controller(api) as controller:
                running = asyncio.create_task(controller.run(make_job(tmp_path, "r1-1", {"id": "t"})))
                (created,) = await wait_for_jobs(server, 1)
                for _ in range(200):  # the silent watch times out on the client side (~2 s): it must resume
                    if controller.watcher is not None and controller.watcher.errors >= 1:
                        break
                    await asyncio.sleep(0.05)
                await _play_kubelet(server, logs, created, outcome="succeeded", exit_code=0, output=b"ok")
                result = await asyncio.wait_for(running, 10)
                return result, controller.watcher

    result, watcher = asyncio.run(scenario())
    assert result.exit_code == 0
    assert watcher.gone == 1 and watcher.lists >= 2  # 410: relisted
    assert watcher.errors >= 1 and watcher.watches >= 2  # the silent stream dropped: resumed


def test_the_network_policy_lives_as_long_as_the_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with kube_api() as (server, api):
            logs = PodLogs(server)
            path = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies"
            async with _controller(api, network_policy={}) as controller:
                running = asyncio.create_task(controller.run(make_job(tmp_path, "r1-1", {"id": "t"})))
                (created,) = await wait_for_jobs(server, 1)
                async with server.get(path) as response:
                    (policy,) = (await response.json())["items"]
                assert policy["metadata"]["name"] == policy_name(RUN)
                validate_schema(policy, "1.30")
                await _play_kubelet(server, logs, created, outcome="succeeded", exit_code=0, output=b"ok")
                await running
            async with server.get(path) as response:
                assert (await response.json())["items"] == []

    asyncio.run(scenario())
