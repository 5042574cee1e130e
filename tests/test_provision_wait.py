"""Waiting for a provisioned train and explaining why it is not up (ImagePullBackOff, CrashLoopBackOff with the last
log lines, Unschedulable, a missing Secret), following the trainer's step metrics, and `agl train status`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import kmock
import pytest

from rl_backend.provision.metric_rows import RowWriter
from rl_backend.provision.options import ProvisionError
from rl_backend.provision.status import train_status
from tests.test_provision_support import (  # noqa: F401 - fast_schemas is an autouse fixture
    NAMES,
    NS,
    cluster,
    consoles,
    event,
    fast_schemas,
    gateway_up,
    load_target,
    options,
    patch_status,
    pod_for,
    run_provision,
    stored_names,
    trainer_pod,
    wait_for,
    write_project,
)

pytestmark = pytest.mark.timeout(60)
USER_SECRET = "Secret/agl-upstream-keys"


def _waiting(reason: str, message: str, container: str = "gateway") -> dict[str, Any]:
    return {"containerStatuses": [{"name": container, "ready": False, "restartCount": 0,
                                   "state": {"waiting": {"reason": reason, "message": message}}}]}


def _fail(tmp_path: Path, play: Any, **overrides: Any) -> tuple[ProvisionError, set[str], str]:
    target = load_target(write_project(tmp_path))
    err, out, err_text, _ = consoles()

    async def scenario() -> tuple[ProvisionError, set[str]]:
        async with cluster() as (server, api, logs):
            task = run_provision(api, target, options(**overrides), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await play(server, logs)
            with pytest.raises(ProvisionError) as caught:
                await asyncio.wait_for(task, 30)
            return caught.value, stored_names(server)

    error, remaining = asyncio.run(scenario())
    return error, remaining, err_text.getvalue()


def _ours(names: set[str]) -> set[str]:
    """What a rollback must have removed: the train's objects (the stand-in pods and events are the test's)."""
    return {n for n in names if not n.startswith(("Pod/", "Event/", "EndpointSlice/")) and n != USER_SECRET}


def test_an_image_that_cannot_be_pulled_is_named_with_its_events_and_rolled_back(tmp_path: Path) -> None:
    async def play(server: kmock.KubernetesEmulator, logs: Any) -> None:
        deployment = await wait_for(server, "Deployment", NAMES.gateway)
        pod = await pod_for(server, deployment["spec"]["template"], "agl-calc-gateway-5f-x1", phase="Pending",
                            status=_waiting("ImagePullBackOff", 'Back-off pulling image "ghcr.io/agl-dev/nope"'))
        await event(server, pod, "Failed", 'Failed to pull image "ghcr.io/agl-dev/nope": not found')

    error, remaining, progress = _fail(tmp_path, play)
    assert "gateway Deployment agl-calc-gateway failed" in error.message
    assert "pod agl-calc-gateway-5f-x1 (container gateway): ImagePullBackOff" in error.message
    assert "Failed to pull image" in error.message  # the event says why
    assert error.hint and "--gateway-image" in error.hint
    assert "rolled back" in error.message and _ours(remaining) == set()
    assert "ImagePullBackOff" in progress  # the progress display showed it as it happened


def test_a_crashing_trainer_shows_its_last_log_lines(tmp_path: Path) -> None:
    async def play(server: kmock.KubernetesEmulator, logs: Any) -> None:
        await gateway_up(server)
        pod = await trainer_pod(server, phase="Running", status={"containerStatuses": [{
            "name": "trainer", "restartCount": 4, "state": {"waiting": {
                "reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]})
        logs.logs[pod] = bytearray(b"loading verl\nTraceback (most recent call last):\nValueError: no GPU found\n")

    error, remaining, _ = _fail(tmp_path, play)
    assert "trainer Job agl-calc-trainer failed" in error.message and "CrashLoopBackOff" in error.message
    assert "  | ValueError: no GPU found" in error.message  # the last log lines
    assert _ours(remaining) == set()


def test_unschedulable_waits_until_the_autoscaler_says_it_will_not_help(tmp_path: Path) -> None:
    unschedulable = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}

    async def play(server: kmock.KubernetesEmulator, logs: Any) -> None:
        await gateway_up(server)
        pod = await trainer_pod(server, phase="Pending", status=unschedulable)
        await asyncio.sleep(0.4)
        await event(server, pod, "NotTriggerScaleUp", "pod didn't trigger scale-up: 2 max node group size reached")

    error, _, progress = _fail(tmp_path, play)
    assert "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in error.message
    assert "max node group size reached" in error.message
    assert "Unschedulable" in progress  # shown while it waited


def test_a_train_that_never_comes_up_times_out_naming_what_it_waits_on(tmp_path: Path) -> None:
    async def play(server: kmock.KubernetesEmulator, logs: Any) -> None:
        await gateway_up(server)

    error, remaining, _ = _fail(tmp_path, play, timeout_s=1.0, keep_on_failure=True)
    assert "not ready after 1 s" in error.message and "trainer Job agl-calc-trainer: no pod yet" in error.message
    assert "left in place" in error.message and "Job/agl-calc-trainer" in remaining  # --keep-on-failure


def test_a_missing_key_secret_is_reported_before_anything_is_created(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, _, _ = consoles()

    async def scenario() -> tuple[ProvisionError, set[str]]:
        async with cluster(user_keys=False) as (server, api, _):
            with pytest.raises(ProvisionError) as caught:
                await asyncio.wait_for(run_provision(api, target, options(), err, out), 30)
            return caught.value, stored_names(server)

    error, remaining = asyncio.run(scenario())
    assert "Secret agl-upstream-keys does not exist" in error.message and "OPENAI_API_KEY" in error.message
    assert error.hint and "kubectl -n default create secret generic agl-upstream-keys" in error.hint
    assert remaining == set()


@pytest.mark.parametrize("json_output", [False, True])
def test_step_metrics_of_an_older_plan_are_followed_from_the_log_until_the_trainer_ends(tmp_path: Path,
                                                                                        json_output: bool) -> None:
    target = load_target(write_project(tmp_path))
    err, out, _, out_text = consoles()

    async def scenario() -> tuple[Any, dict[str, Any]]:
        async with cluster() as (server, api, logs):
            task = run_provision(api, target, options(follow=True, json_output=json_output), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            pod = await trainer_pod(server)
            await _older_plan(api)
            logs.logs[pod] = bytearray(
                b'starting verl\n{"step": 1, "reward": 0.25, "loss": 1.5}\nnot json {"step": \n'
                b'{"event": "no step here"}\n')
            await asyncio.sleep(0.4)  # the follow reconnects meanwhile: lines already read are not printed again
            logs.logs[pod] += b'{"step": 2, "reward": 0.5, "loss": 1.25}\n'
            await asyncio.sleep(0.3)
            assert not task.done()
            await patch_status(server, "Job", NAMES.trainer, {
                "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
            result = await asyncio.wait_for(task, 30)
            status = await asyncio.to_thread(train_status, _resources(api), NAMES)
            return result, status

    result, status = asyncio.run(scenario())
    assert result.outcome == "succeeded" and result.last_metrics == {"step": 2, "reward": 0.5, "loss": 1.25}
    lines = out_text.getvalue().splitlines()
    if json_output:
        assert [json.loads(line) for line in lines] == [{"step": 1, "reward": 0.25, "loss": 1.5},
                                                        {"step": 2, "reward": 0.5, "loss": 1.25}]
    else:
        assert lines[0].split() == ["step", "reward", "loss"]
        assert [line.split() for line in lines[1:]] == [["1", "0.25", "1.5"], ["2", "0.5", "1.25"]]
    assert status["phase"] == "succeeded" and status["last_metrics"]["step"] == 2
    assert {o["kind"] for o in status["objects"]} >= {"Deployment", "Job", "Role", "ConfigMap"}


def test_a_trainer_that_fails_while_followed_says_why(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, _, _ = consoles()

    async def scenario() -> ProvisionError:
        async with cluster() as (server, api, logs):
            task = run_provision(api, target, options(follow=True), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            pod = await trainer_pod(server)
            logs.logs[pod] = bytearray(b'{"step": 1, "reward": 0.1}\nCUDA error: out of memory\n')
            await asyncio.sleep(0.2)
            await patch_status(server, "Pod", pod, {"phase": "Failed", "containerStatuses": [{
                "name": "trainer", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]})
            await patch_status(server, "Job", NAMES.trainer, {"failed": 4, "conditions": [{
                "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit"}]})
            with pytest.raises(ProvisionError) as caught:
                await asyncio.wait_for(task, 30)
            return caught.value

    error = asyncio.run(scenario())
    reason = "BackoffLimitExceeded: Job has reached the specified backoff limit"
    if "the trainer failed: " + reason in error.message:  # caught while following the step metrics
        assert "  | CUDA error: out of memory" in error.message
        assert error.hint and "agl train status" in error.hint
    else:  # on a slow machine the failure can land while agl still waits for readiness: same reason, rolled back
        assert f"trainer Job {NAMES.trainer} failed" in error.message and reason in error.message
        assert "rolled back" in error.message


def test_status_of_a_running_train(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, _, _ = consoles()

    async def scenario() -> dict[str, Any]:
        async with cluster() as (server, api, logs):
            task = run_provision(api, target, options(), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            pod = await trainer_pod(server)
            logs.logs[pod] = bytearray(b'{"step": 6, "reward": 0.5}\n{"step": 7, "reward": 0.75}\n')
            writer = RowWriter(api, NS, NAMES.metrics)  # what the trainer writes besides its log
            for row in ({"step": 6, "reward": 0.5}, {"step": 7, "reward": 0.75}):
                assert await asyncio.to_thread(writer.append, row)
            await asyncio.wait_for(task, 30)
            return await asyncio.to_thread(train_status, _resources(api), NAMES)

    status = asyncio.run(scenario())
    assert status["phase"] == "running" and status["namespace"] == NS
    assert [c["state"] for c in status["checks"]] == ["ready", "ready", "ready"]
    assert status["trainer"] == {"kind": "Job", "name": NAMES.trainer, "nodes": 1, "gpus_per_node": 1}
    assert status["last_metrics"] == {"step": 7, "reward": 0.75}
    assert len(status["objects"]) == 17


async def _older_plan(api: Any) -> None:
    """A train whose plan an older agl rendered: no metrics ConfigMap, so its rows are read from the log."""
    assert await asyncio.to_thread(_resources(api).delete, "ConfigMap", NAMES.metrics)


def _resources(api: Any) -> Any:
    from rl_backend.provision.resources import Resources

    return Resources(api, NS)


def test_no_permission_to_read_pods_fails_at_once_and_rolls_back(tmp_path: Path) -> None:
    def forbid(request: kmock.Request) -> Any:
        raise kmock.KubernetesError(status=403, reason="Forbidden", message='pods is forbidden: User "dev" cannot '
                                    'list resource "pods" in API group "" in the namespace "default"')

    async def play(server: kmock.KubernetesEmulator, logs: Any) -> None:
        server["get", "/api/v1/namespaces/default/pods"] << forbid

    error, remaining, _ = _fail(tmp_path, play)
    assert "waiting for the train to come up: the Kubernetes API answered 403" in error.message
    assert 'cannot list resource "pods"' in error.message and error.hint and "permissions" in error.hint
    assert "rolled back" in error.message and _ours(remaining) == set()


def test_step_rows_written_after_the_kubelet_rotated_the_log_are_printed(tmp_path: Path) -> None:
    """(A train planned by an older agl, without the metrics ConfigMap.) The kubelet rotates a container's log at
    10 MiB and then serves only the new file: far fewer lines than agl had read before. Rows after the rotation are
    printed (once each), none read before is printed again, and rows rotated away before agl read them are said to
    be missing (stderr), with where they are."""
    import datetime

    target = load_target(write_project(tmp_path))
    err, out, err_text, out_text = consoles()
    second = datetime.timedelta(seconds=1)

    async def until_rows(count: int) -> None:
        for _ in range(200):
            if len(out_text.getvalue().splitlines()) >= count:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"expected {count} rows, got {out_text.getvalue()!r}")

    async def scenario() -> Any:
        async with cluster() as (server, api, logs):
            task = run_provision(api, target, options(follow=True, json_output=True), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            pod = await trainer_pod(server)
            await _older_plan(api)
            start = logs.EPOCH
            logs.stamps[pod] = [start, start + second, start + 2 * second, start + 3 * second]
            logs.logs[pod] = bytearray(b'starting verl\n{"step": 1, "reward": 0.25}\nverl says a lot\n'
                                       b'{"step": 2, "reward": 0.5}\n')
            await until_rows(2)
            # Rotated: the old file (and every line agl read) is gone; the new one has fewer lines than agl read.
            logs.stamps[pod] = [start + 10 * second]
            logs.logs[pod] = bytearray(b'{"step": 3, "reward": 0.75}\n')
            await until_rows(3)
            logs.stamps[pod].append(start + 11 * second)
            logs.logs[pod] += b'{"step": 4, "reward": 1.0}\n'
            await until_rows(4)
            await asyncio.sleep(0.5)  # more reconnects: nothing is printed twice
            # Rotated again before agl read step 5 (a dropped connection): the gap is said, not hidden.
            logs.stamps[pod] = [start + 20 * second]
            logs.logs[pod] = bytearray(b'{"step": 6, "reward": 1.0}\n')
            await until_rows(5)
            await patch_status(server, "Job", NAMES.trainer, {
                "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
            return await asyncio.wait_for(task, 30)

    result = asyncio.run(scenario())
    assert result.outcome == "succeeded"
    assert [json.loads(line)["step"] for line in out_text.getvalue().splitlines()] == [1, 2, 3, 4, 6]
    assert err_text.getvalue().count("rotated out of the trainer's log") == 1
    assert "step(s) 5 were rotated out" in err_text.getvalue() and "checkpoint volume" in err_text.getvalue()
