"""The commands end to end, as a user runs them: `agl train CONFIG --on kubernetes --detach`, `agl train status`,
`agl train stop`, with credentials from a kubeconfig that points at the in-memory cluster."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from rl_backend.provision.metric_rows import RowWriter
from tests.test_provision_render import _app
from tests.test_provision_support import (  # noqa: F401 - fast_schemas is an autouse fixture
    ADMIN_TOKEN,
    NAMES,
    cluster,
    fast_schemas,
    gateway_up,
    stored_names,
    trainer_pod,
    wait_for,
    write_project,
)

pytestmark = pytest.mark.timeout(60)


def _kubeconfig(folder: Path, url: str) -> Path:
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "someone", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "test", "context": {"cluster": "kmock", "user": "someone", "namespace": "default"}}],
    }))
    return path


def test_provision_status_and_stop_from_the_command_line(tmp_path: Path) -> None:
    config = write_project(tmp_path / "project")
    runner = CliRunner()

    def agl_train(*args: str) -> Result:
        return runner.invoke(_app(), list(args), catch_exceptions=False)

    async def scenario() -> tuple[Result, Result, Result, Result, set[str]]:
        async with cluster() as (server, api, logs):
            kubeconfig = str(_kubeconfig(tmp_path, api.configuration.host))
            up = asyncio.ensure_future(asyncio.to_thread(
                agl_train, str(config), "--on", "kubernetes", "--detach", "--json", "--kubeconfig", kubeconfig))
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            pod = await trainer_pod(server)
            logs.logs[pod] = bytearray(b'{"step": 3, "reward": 0.5}\n')
            await asyncio.to_thread(RowWriter(api, "default", NAMES.metrics).append, {"step": 3, "reward": 0.5})
            provisioned = await asyncio.wait_for(up, 30)
            # status by the train's name, then by its agl.yaml; stop by name.
            status = await asyncio.to_thread(agl_train, "status", "calc", "--json", "--kubeconfig", kubeconfig)
            by_config = await asyncio.to_thread(agl_train, "status", str(config), "--kubeconfig", kubeconfig)
            stopped = await asyncio.to_thread(agl_train, "stop", "calc", "--json", "--kubeconfig", kubeconfig)
            return provisioned, status, by_config, stopped, stored_names(server)

    provisioned, status, by_config, stopped, remaining = asyncio.run(scenario())
    assert provisioned.exit_code == 0, provisioned.output
    summary: dict[str, Any] = json.loads(provisioned.stdout)
    assert summary["outcome"] == "ready" and summary["trainer"]["kind"] == "Job" and len(summary["objects"]) == 17
    assert ADMIN_TOKEN not in provisioned.output  # (the CLI generates its own token; none is ever printed)
    assert "token" not in provisioned.stdout.lower()
    document = json.loads(status.stdout)
    assert document["phase"] == "running" and document["last_metrics"] == {"step": 3, "reward": 0.5}
    assert by_config.exit_code == 0 and "train calc (namespace default): running" in by_config.stdout
    deleted = json.loads(stopped.stdout)["deleted"]
    assert len(deleted) == 17 and deleted[0] == "Job/agl-calc-trainer"
    assert {n for n in remaining if not n.startswith(("Pod/", "EndpointSlice/"))} == {"Secret/agl-upstream-keys"}


def test_a_failure_exits_1_with_the_reason_and_no_traceback(tmp_path: Path) -> None:
    config = write_project(tmp_path / "project")

    async def scenario() -> Result:
        async with cluster(user_keys=False) as (_, api, _logs):
            kubeconfig = str(_kubeconfig(tmp_path, api.configuration.host))
            return await asyncio.to_thread(CliRunner().invoke, _app(), [
                str(config), "--on", "kubernetes", "--kubeconfig", kubeconfig])

    result = asyncio.run(scenario())
    assert result.exit_code == 2  # a config problem: the Secret with the upstream keys is missing
    assert "error: Secret agl-upstream-keys does not exist" in result.output and "Traceback" not in result.output


def test_no_cluster_access_is_a_clear_error(tmp_path: Path) -> None:
    config = write_project(tmp_path / "project")
    result = CliRunner().invoke(_app(), ["status", "--kubeconfig", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "cannot load Kubernetes credentials" in result.output
    assert CliRunner().invoke(_app(), [str(config), "--on", "kubernetes", "--kubeconfig",
                                       str(tmp_path / "missing")]).exit_code == 1
