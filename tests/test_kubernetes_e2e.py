"""End to end: `KubernetesController.run(job)` against kmock, with a stand-in kubelet (tests/helpers/kubelet.py)
that runs each Job's container command — agl's real wrapper around a real agent — as a local process with the
pod's env only, and reports through the API. The output file reaches agl only through the pod log: the agent's
folder is an emptyDir that the host never sees."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from rl_backend.rollout.base import ProcessResult
from rl_backend.rollout.k8s_spec import KubernetesSpec
from rl_backend.rollout.kubernetes import KubernetesController
from tests.helpers.k8s_rollouts import TOKEN, make_job, write_agent
from tests.helpers.kubelet import StandInKubelet, kube_api, list_jobs

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not all(shutil.which(t) for t in ("sh", "base64", "tee", "tail", "head", "wc")),
                       reason="the wrapper needs a POSIX shell and coreutils"),
]


async def _run_all(tmp_path: Path, tasks: list[dict[str, Any]], **overrides: Any
                   ) -> tuple[list[ProcessResult], list[Any], StandInKubelet, list[dict[str, Any]]]:
    image = write_agent(tmp_path / "image")  # the "image": the agent at its WORKDIR, python on its PATH
    spec = KubernetesSpec.model_validate({
        "image": "agent:1", "gateway_url": "http://10.1.2.3:8400", "workdir": str(image), "env": {"HOME": "/tmp"},
        "pass_env": ["AGENT_*"], "watch_timeout_s": 5, "create_qps": 50, **overrides,
    })
    image_env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "LANG": "C.UTF-8"}
    async with kube_api() as (server, api), StandInKubelet(server, image_env=image_env) as kubelet:
        async with KubernetesController(spec, run_id="run-e2e", api_client=api, deny_env={"UPSTREAM_KEY_ENV"},
                                        watch_read_slack_s=1.0) as controller:
            jobs = [make_job(tmp_path / "host", f"r{i}-1", task, timeout_s=task.get("timeout", 20))
                    for i, task in enumerate(tasks)]
            results = await asyncio.gather(*(controller.run(job) for job in jobs))
        remaining = await list_jobs(server)
    return list(results), jobs, kubelet, remaining


def test_rollouts_run_as_jobs_end_to_end(tmp_path: Path) -> None:
    tasks = [{"id": "ok", "answer": 42}, {"id": "crash", "fail": 3, "write": False}, {"id": "half", "fail": 2}]
    results, jobs, kubelet, remaining = asyncio.run(_run_all(tmp_path, tasks))
    ok, crash, half = results

    assert ok.exit_code == 0 and not ok.timed_out
    written = json.loads(Path(jobs[0].env["AGL_OUTPUT_FILE"]).read_text())
    assert written["answer"] == 42
    seen = written["seen"]  # what the agent saw inside its "pod"
    assert seen["OPENAI_BASE_URL"] == "http://10.1.2.3:8400/rollouts/r0-1/openai/v1"
    assert seen["OPENAI_API_KEY"] == seen["ANTHROPIC_API_KEY"] == TOKEN
    assert seen["UPSTREAM_KEY_ENV"] is None and seen["AGL_ADMIN_TOKEN"] is None
    assert seen["AGENT_MAX_TURNS"] == "4" and seen["HOME"] == "/tmp"
    assert "agent starting ok" in ok.stdout_tail and "agent note on stderr" in ok.stderr_tail

    assert crash.exit_code == 3 and crash.stderr_tail.rstrip().endswith("Traceback: the agent gave up")
    assert not Path(jobs[1].env["AGL_OUTPUT_FILE"]).exists()
    assert half.exit_code == 2 and Path(jobs[2].env["AGL_OUTPUT_FILE"]).is_file()  # wrote, then failed

    # The host's rollout folders kept only what agl put there (task file) plus the output agl wrote back.
    assert sorted(p.name for p in jobs[1].rollout_dir.iterdir()) == ["task.json"]
    # The pods saw only the allow-listed env: nothing of agl's own environment (PATH is the image's).
    for env in kubelet.seen_env.values():
        assert "UPSTREAM_KEY_ENV" not in env and "AGL_HOME" not in env and env["PATH"].startswith(
            os.path.dirname(sys.executable))
    assert remaining == []  # close() deleted the run's Jobs


def test_a_rollout_past_its_deadline_is_killed_and_timed_out(tmp_path: Path) -> None:
    tasks = [{"id": "slow", "sleep": 30, "timeout": 1}]
    results, jobs, kubelet, _ = asyncio.run(_run_all(tmp_path, tasks, startup_allowance_s=0, unschedulable_after_s=0))
    (slow,) = results
    assert slow.timed_out and slow.exit_code is None
    assert "agent starting slow" in slow.stdout_tail
    assert kubelet.killed  # the stand-in kubelet enforced activeDeadlineSeconds
    assert not Path(jobs[0].env["AGL_OUTPUT_FILE"]).exists()
