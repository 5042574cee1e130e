"""The trainer's step rows in the train's metrics ConfigMap (rl_backend/provision/metric_rows.py), on kmock with the
official client: the trainer's writer patches them after each step, keeps the newest rows under the ConfigMap cap,
keeps a restarted container's rows, survives an API that does not answer; `agl train --on kubernetes` follows them
through a log rotation and a container restart, each step once; `agl train status` reports the last one; the plan
gives the writer its ConfigMap's name and the Role lets it touch that one ConfigMap only."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from agl_cli.commands.train_verl import step_sink
from rl_backend.provision.metric_rows import (
    DROPPED_KEY,
    METRICS_ENV,
    ROWS_KEY,
    RowWriter,
    pack,
    parse_rows,
    writer_from_env,
)
from rl_backend.provision.options import ProvisionError
from rl_backend.provision.resources import Resources
from rl_backend.provision.session import dry_run
from rl_backend.provision.status import train_status
from rl_backend.trainer.curves import StepRecord
from tests.helpers.fault_proxy import FaultProxy
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
    patch_status,
    run_provision,
    trainer_pod,
    wait_for,
    write_project,
)

pytestmark = pytest.mark.timeout(60)


def _config_map(name: str = NAMES.metrics) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}}


def _stored(api: Any, name: str = NAMES.metrics) -> tuple[list[dict[str, Any]], int]:
    found = Resources(api, NS).read("ConfigMap", name)
    assert found is not None
    return parse_rows(found)


def test_the_writer_patches_each_row_and_a_restarted_trainer_keeps_the_earlier_ones() -> None:
    async def scenario() -> dict[str, Any]:
        async with cluster() as (_, api, _logs):
            res = Resources(api, NS)
            await asyncio.to_thread(res.create, _config_map())
            first = RowWriter(api, NS, NAMES.metrics)
            for step in (1, 2, 3):
                assert await asyncio.to_thread(first.append, {"step": step, "reward": step / 4})
            after_three = await asyncio.to_thread(_stored, api)
            # The container restarts and resumes from the checkpoint of step 2: step 3 is trained again.
            second = RowWriter(api, NS, NAMES.metrics)
            assert await asyncio.to_thread(second.append, {"step": 3, "reward": 0.9})
            assert await asyncio.to_thread(second.append, {"step": 4, "reward": 1.0})
            return {"after_three": after_three, "after_restart": await asyncio.to_thread(_stored, api),
                    "patches": (first.patches, second.patches)}

    run = asyncio.run(scenario())
    assert run["after_three"] == ([{"step": 1, "reward": 0.25}, {"step": 2, "reward": 0.5},
                                   {"step": 3, "reward": 0.75}], 0)
    assert run["after_restart"] == ([{"step": 1, "reward": 0.25}, {"step": 2, "reward": 0.5},
                                     {"step": 3, "reward": 0.9}, {"step": 4, "reward": 1.0}], 0)
    assert run["patches"] == (3, 2)


def test_the_writer_keeps_the_newest_rows_that_fit_and_counts_the_dropped_ones() -> None:
    row_bytes = len(json.dumps({"step": 10, "loss": 0.5}, separators=(",", ":"))) + 1

    async def scenario() -> tuple[dict[str, Any], tuple[list[dict[str, Any]], int]]:
        async with cluster() as (_, api, _logs):
            await asyncio.to_thread(Resources(api, NS).create, _config_map())
            writer = RowWriter(api, NS, NAMES.metrics, max_bytes=3 * row_bytes)
            for step in range(10, 16):
                assert await asyncio.to_thread(writer.append, {"step": step, "loss": 0.5})
            raw = await asyncio.to_thread(Resources(api, NS).read, "ConfigMap", NAMES.metrics)
            return raw or {}, await asyncio.to_thread(_stored, api)

    raw, (rows, dropped) = asyncio.run(scenario())
    assert [r["step"] for r in rows] == [13, 14, 15] and dropped == 3
    assert len(raw["data"][ROWS_KEY].encode()) <= 3 * row_bytes and raw["data"][DROPPED_KEY] == "3"
    # The cap is on bytes (each row and its newline), counted from the newest row; rows are never cut in half.
    assert pack(["a" * 5, "b" * 5, "c" * 5], 2, max_bytes=12) == (["b" * 5, "c" * 5], 3)
    assert pack(["a" * 5, "é" * 5], 0, max_bytes=11) == (["é" * 5], 1)


def test_a_failing_api_never_stops_the_train_and_the_rows_go_out_with_the_next_step() -> None:
    said: list[str] = []

    async def scenario() -> dict[str, Any]:
        async with cluster() as (_, api, _logs):
            from kubernetes import client

            await asyncio.to_thread(Resources(api, NS).create, _config_map())
            host, port = api.configuration.host.rsplit("//", 1)[1].split(":")
            async with FaultProxy(host, int(port)) as proxy:
                configuration = client.Configuration()
                configuration.host = proxy.url
                proxied = client.ApiClient(configuration)
                writer = RowWriter(proxied, NS, NAMES.metrics, log=said.append, request_timeout_s=0.5)
                assert await asyncio.to_thread(writer.append, {"step": 1})
                await proxy.set_mode("refuse")  # the API server restarts
                refused = [await asyncio.to_thread(writer.append, {"step": s}) for s in (2, 3)]
                await proxy.set_mode("hang")  # then answers nothing
                hung = await asyncio.to_thread(writer.append, {"step": 4})
                await proxy.set_mode("pass")
                back = await asyncio.to_thread(writer.append, {"step": 5})
                proxied.close()
            return {"refused": refused, "hung": hung, "back": back, "rows": await asyncio.to_thread(_stored, api)}

    run = asyncio.run(scenario())
    assert run["refused"] == [False, False] and run["hung"] is False and run["back"] is True
    assert [r["step"] for r in run["rows"][0]] == [1, 2, 3, 4, 5]
    assert len(said) == 2 and "retrying at the next step" in said[0] and NAMES.metrics in said[0]
    assert "written to ConfigMap" in said[1] and "again" in said[1]


def test_the_trainers_step_hook_prints_the_row_and_stores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `agl train --backend verl` does at each step: stderr, the stdout row (the log), the ConfigMap."""
    records = [StepRecord(step=s, model_version=f"step-{s}", updated=True, started_at=1.0, ended_at=2.0,
                          rollouts=4, trained_rollouts=4, reward_mean=0.5 * s) for s in (1, 2)]
    printed: list[int] = []

    async def scenario() -> tuple[str, tuple[list[dict[str, Any]], int]]:
        async with cluster() as (_, api, _logs):
            await asyncio.to_thread(Resources(api, NS).create, _config_map())
            data = io.StringIO()
            hook = step_sink(lambda record: printed.append(record.step), data, RowWriter(api, NS, NAMES.metrics))
            for record in records:
                await asyncio.to_thread(hook, record)
            return data.getvalue(), await asyncio.to_thread(_stored, api)

    stdout, (rows, _) = asyncio.run(scenario())
    assert printed == [1, 2]
    assert [json.loads(line) for line in stdout.splitlines()] == rows
    assert [(r["step"], r["reward_mean"]) for r in rows] == [(1, 0.5), (2, 1.0)]
    # Locally (no variable) nothing is written; set but with no cluster credentials, the train goes on without.
    monkeypatch.delenv(METRICS_ENV, raising=False)
    assert writer_from_env(printed.append) is None
    monkeypatch.setenv(METRICS_ENV, NAMES.metrics)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    said: list[str] = []
    assert writer_from_env(said.append) is None
    assert len(said) == 1 and METRICS_ENV in said[0] and "log only" in said[0]


@pytest.mark.parametrize("extra", [{"gpus": 1}, {"gpus": 16, "nodes": 2}])
def test_the_plan_names_the_configmap_to_the_controllers_container_only(tmp_path: Path,
                                                                        extra: dict[str, Any]) -> None:
    manifests = dry_run(load_target(write_project(tmp_path)), options(**extra)).manifests
    found = {}
    for manifest in manifests:
        spec = manifest.get("spec") or {}
        pods = [spec.get("template", {}).get("spec")] if manifest["kind"] == "Job" else []
        if manifest["kind"] == "RayJob":
            cluster_spec = spec["rayClusterSpec"]
            pods = [cluster_spec["headGroupSpec"]["template"]["spec"],
                    *[g["template"]["spec"] for g in cluster_spec["workerGroupSpecs"]]]
        for pod in filter(None, pods):
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                env = {e["name"]: e.get("value") for e in container.get("env") or []}
                found[container["name"]] = env.get(METRICS_ENV)
    writers = {name for name, value in found.items() if value is not None}
    assert writers == ({"trainer"} if extra["gpus"] == 1 else {"ray-head"})
    assert {found[name] for name in writers} == {NAMES.metrics}
    assert found["grader"] is None


async def _until(out: io.StringIO, count: int) -> None:
    for _ in range(300):
        if len(out.getvalue().splitlines()) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {count} rows, got {out.getvalue()!r}")


def test_rows_survive_a_log_rotation_and_a_container_restart_each_printed_once(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, err_text, out_text = consoles()

    async def scenario() -> tuple[Any, dict[str, Any]]:
        async with cluster() as (server, api, logs):
            task = run_provision(api, target, options(follow=True, json_output=True), err, out)
            await wait_for(server, "ConfigMap", NAMES.metrics)
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            pod = await trainer_pod(server)
            writer = RowWriter(api, NS, NAMES.metrics)
            for step in (1, 2):
                logs.logs[pod] = logs.logs.get(pod, bytearray()) + f'{{"step": {step}}}\n'.encode()
                await asyncio.to_thread(writer.append, {"step": step, "reward": step / 10})
            await _until(out_text, 2)
            # The kubelet rotated the log (10 MiB of verl's output): what is served now holds no row at all.
            logs.logs[pod] = bytearray(b"verl says a lot\n" * 5)
            await asyncio.to_thread(writer.append, {"step": 3, "reward": 0.3})
            await asyncio.to_thread(writer.append, {"step": 4, "reward": 0.4})
            await _until(out_text, 4)
            # The container restarts: an empty log, a new process that resumes from step 3's checkpoint.
            logs.logs[pod] = bytearray()
            await patch_status(server, "Pod", pod, {"phase": "Running", "containerStatuses": [{
                "name": "trainer", "ready": True, "restartCount": 1, "state": {"running": {}}}]})
            restarted = RowWriter(api, NS, NAMES.metrics)
            await asyncio.to_thread(restarted.append, {"step": 4, "reward": 0.45})
            await asyncio.to_thread(restarted.append, {"step": 5, "reward": 0.5})
            await _until(out_text, 5)
            await asyncio.sleep(0.5)  # more polls: nothing is printed twice
            await patch_status(server, "Job", NAMES.trainer, {
                "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
            result = await asyncio.wait_for(task, 30)
            return result, await asyncio.to_thread(train_status, Resources(api, NS), NAMES)

    result, status = asyncio.run(scenario())
    assert result.outcome == "succeeded"
    rows = [json.loads(line) for line in out_text.getvalue().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert result.last_metrics == rows[-1] == status["last_metrics"] == {"step": 5, "reward": 0.5}
    assert "rotated out" not in err_text.getvalue()


def test_rows_that_no_longer_fit_are_said_once_with_where_they_are(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, err_text, out_text = consoles()

    async def scenario() -> Any:
        async with cluster() as (server, api, _logs):
            task = run_provision(api, target, options(follow=True, json_output=True), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            await trainer_pod(server)
            await asyncio.wait_for(wait_for(server, "ConfigMap", NAMES.metrics), 10)
            writer = RowWriter(api, NS, NAMES.metrics, max_bytes=2 * len('{"step":1}\n'))
            for step in (1, 2, 3, 4):
                await asyncio.to_thread(writer.append, {"step": step})
            await _until(out_text, 2)
            await patch_status(server, "Job", NAMES.trainer, {
                "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
            return await asyncio.wait_for(task, 30)

    result = asyncio.run(scenario())
    assert result.outcome == "succeeded"
    assert [json.loads(line)["step"] for line in out_text.getvalue().splitlines()] == [3, 4]
    assert err_text.getvalue().count("2 oldest step rows no longer fit") == 1
    assert "checkpoint volume" in err_text.getvalue()


def test_a_train_planned_by_an_older_agl_is_followed_from_its_log(tmp_path: Path) -> None:
    """No metrics ConfigMap (an older agl rendered the plan): the rows come from the trainer's log, as before."""
    target = load_target(write_project(tmp_path))
    err, out, _, out_text = consoles()

    async def scenario() -> tuple[Any, dict[str, Any]]:
        async with cluster() as (server, api, logs):
            task = run_provision(api, target, options(follow=True, json_output=True), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            pod = await trainer_pod(server)
            await asyncio.to_thread(Resources(api, NS).delete, "ConfigMap", NAMES.metrics)
            assert await get(server, "ConfigMap", NAMES.metrics) is None
            logs.logs[pod] = bytearray(b'starting verl\n{"step": 1, "reward": 0.25}\n{"step": 2, "reward": 0.5}\n')
            await _until(out_text, 2)
            await patch_status(server, "Job", NAMES.trainer, {
                "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
            result = await asyncio.wait_for(task, 30)
            return result, await asyncio.to_thread(train_status, Resources(api, NS), NAMES)

    result, status = asyncio.run(scenario())
    assert [json.loads(line)["step"] for line in out_text.getvalue().splitlines()] == [1, 2]
    assert result.last_metrics == status["last_metrics"] == {"step": 2, "reward": 0.5}


def test_the_configmap_deleted_mid_train_does_not_print_the_logs_rows_again(tmp_path: Path) -> None:
    """`agl train stop` from elsewhere deletes the rows' ConfigMap: agl does not fall back to the log (its rows
    were printed already) and says the trainer is gone."""
    target = load_target(write_project(tmp_path))
    err, out, _, out_text = consoles()

    async def scenario() -> ProvisionError:
        async with cluster() as (server, api, logs):
            task = run_provision(api, target, options(follow=True, json_output=True), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            pod = await trainer_pod(server)
            logs.logs[pod] = bytearray(b'{"step": 1}\n{"step": 2}\n')
            writer = RowWriter(api, NS, NAMES.metrics)
            for step in (1, 2):
                await asyncio.to_thread(writer.append, {"step": step})
            await _until(out_text, 2)
            res = Resources(api, NS)
            await asyncio.to_thread(res.delete, "ConfigMap", NAMES.metrics)
            await asyncio.sleep(0.6)  # polls without the ConfigMap
            await asyncio.to_thread(res.delete, "Job", NAMES.trainer)
            with pytest.raises(ProvisionError) as caught:
                await asyncio.wait_for(task, 30)
            return caught.value

    error = asyncio.run(scenario())
    assert [json.loads(line)["step"] for line in out_text.getvalue().splitlines()] == [1, 2]
    assert f"Job {NAMES.trainer} was deleted" in error.message
