"""Stopping a cluster train leaves nothing behind: the trainer ends its rollout Jobs itself on SIGTERM (what the
kubelet sends when `agl train stop` deletes its pod), and `stop` deletes the rollout Jobs the trainer still
created during its grace period.

The trainer is a real process here (the test sends it SIGTERM), talking to kmock with the stand-in kubelet running
its rollout Jobs; it starts a local Ray the way verl's trainer does, since Ray's driver init takes over SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.helpers.kubelet import cluster_in_thread

pytestmark = pytest.mark.timeout(180)

TRAINER = textwrap.dedent('''
    """The trainer's side of a cluster train: SIGTERM as Ctrl-C, a local Ray, rollouts as Jobs."""
    import asyncio, sys
    from pathlib import Path

    from agl_cli.evaluation.controllers import run_then_close
    from agl_cli.evaluation.interrupts import TermAsInterrupt
    from rl_backend.rollout.k8s_spec import KubernetesSpec
    from rl_backend.rollout.kubernetes import KubernetesController
    from rl_backend.trainer.verl_backend.trainer import _init_ray
    from tests.helpers.k8s_rollouts import make_job

    root, kubeconfig = Path(sys.argv[1]), sys.argv[2]
    spec = KubernetesSpec.model_validate({"image": "agent:1", "kubeconfig": kubeconfig, "workdir": str(root),
                                          "gateway_url": "http://10.1.2.3:8400", "watch_timeout_s": 1})
    with TermAsInterrupt() as stop:
        import ray

        _init_ray(lambda: ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False), print)
        controller = KubernetesController(spec, run_id="20261202-stop", base_dir=root)

        async def rollouts():
            jobs = [make_job(root, f"r{i}-1", {"id": f"t{i}", "sleep": 120}, timeout_s=300) for i in range(2)]
            return await asyncio.gather(*(controller.run(job) for job in jobs))

        print("rollouts starting", flush=True)
        try:
            asyncio.run(run_then_close(controller, rollouts))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(stop.exit_code)
''')


def _jobs(api_url: str) -> list[str]:
    with urllib.request.urlopen(f"{api_url}/apis/batch/v1/namespaces/default/jobs") as response:
        return [job["metadata"]["name"] for job in json.load(response)["items"]]


def _kubeconfig(folder: Path, api_url: str) -> Path:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "kmock",
              "clusters": [{"name": "kmock", "cluster": {"server": api_url}}],
              "users": [{"name": "me", "user": {"token": "unused"}}],
              "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "me"}}]}
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_sigterm_to_a_trainer_running_ray_deletes_its_rollout_jobs_and_exits_143(tmp_path: Path) -> None:
    image_env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"}
    (tmp_path / "agent.py").write_text((Path(__file__).parent / "helpers" / "k8s_rollouts.py").read_text()
                                       .split("AGENT = r'''", 1)[1].split("'''", 1)[0])
    (tmp_path / "trainer.py").write_text(TRAINER)
    with cluster_in_thread(image_env) as api_url:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "RAY_ADDRESS": ""}
        env.pop("RAY_ADDRESS")
        proc = subprocess.Popen([sys.executable, str(tmp_path / "trainer.py"), str(tmp_path),
                                 str(_kubeconfig(tmp_path, api_url))], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 120
            while len(_jobs(api_url)) < 2:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "the trainer never created its rollout Jobs"
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)  # what the kubelet sends when `agl train stop` deletes the pod
            output = proc.communicate(timeout=60)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
        remaining = _jobs(api_url)
    assert proc.returncode == 143, output  # 128 + SIGTERM, after the Ctrl-C path ran: not Ray's sys.exit(15)
    assert "interrupted" in output, output
    assert remaining == []  # close() ran: the run's Jobs were deleted before the process ended


def test_stop_deletes_the_rollout_jobs_a_dying_trainer_starts_in_its_grace_period() -> None:
    """The trainer's pod keeps running for its grace period after its Job is deleted (a finalizer here: kmock
    then keeps the pod, marked for deletion, as a real API server does until the kubelet reports it gone) and
    starts one more rollout Job meanwhile; `stop` waits for the pod and deletes that Job too."""
    from rl_backend.provision.options import ClusterOptions
    from rl_backend.provision.session import stop
    from tests.test_provision_support import NAMES, NS, cluster, create, get, stored_names

    rollout_labels = {**NAMES.selector(), "agl.dev/run": "20261202-run"}

    async def scenario() -> tuple[list[str], set[str]]:
        async with cluster() as (server, api, _):
            await create(server, "Job", {"kind": "Job", "metadata": {"name": NAMES.trainer,
                                                                      "labels": NAMES.labels("trainer")}, "spec": {}})
            await create(server, "Pod", {"kind": "Pod", "metadata": {
                "name": f"{NAMES.trainer}-q2w3e", "finalizers": ["test.agl.dev/kubelet"],
                "labels": {**NAMES.labels("trainer"), "job-name": NAMES.trainer}},
                "spec": {"terminationGracePeriodSeconds": 5, "containers": []}})
            await create(server, "Job", {"kind": "Job", "metadata": {"name": "agl-0001-r1-1", "labels": rollout_labels},
                                         "spec": {}})
            stopping = asyncio.ensure_future(asyncio.to_thread(stop, NAMES.train, ClusterOptions(namespace=NS),
                                                               api_client=api))
            while not stopping.done() and not (
                    (await get(server, "Pod", f"{NAMES.trainer}-q2w3e"))["metadata"].get("deletionTimestamp")):
                await asyncio.sleep(0.05)
            # The trainer, SIGTERMed, is mid-batch: one more rollout Job appears after stop's first pass.
            await create(server, "Job", {"kind": "Job", "metadata": {"name": "agl-0001-r2-1", "labels": rollout_labels},
                                         "spec": {}})
            await asyncio.sleep(1.5)
            async with server.patch(f"/api/v1/namespaces/{NS}/pods/{NAMES.trainer}-q2w3e",
                                    json={"metadata": {"finalizers": []}}) as response:  # the kubelet: it is gone
                assert response.status == 200, await response.text()
            deleted = await asyncio.wait_for(stopping, 30)
            return deleted, stored_names(server)

    deleted, remaining = asyncio.run(scenario())
    assert {"Job/agl-0001-r1-1", "Job/agl-0001-r2-1", f"Job/{NAMES.trainer}"} <= set(deleted)
    assert not {n for n in remaining if n.startswith(("Job/", "Pod/"))}, remaining


def test_a_training_run_runs_one_plan_after_another_on_kubernetes(tmp_path: Path) -> None:
    """Training runs a plan per step (and the held-out ones), each through `run_plan`, which closes the controller
    at the end (deleting the plan's Jobs): the next plan must still run its rollouts as Jobs."""
    from types import SimpleNamespace

    from agl_cli.spec.schema import load_spec
    from agl_cli.training.sync_job import run_plan
    from tests.helpers.k8s_rollouts import make_job

    (tmp_path / "agent.py").write_text((Path(__file__).parent / "helpers" / "k8s_rollouts.py").read_text()
                                       .split("AGENT = r'''", 1)[1].split("'''", 1)[0])
    (tmp_path / "tasks.jsonl").write_text('{"id": "t"}\n')
    (tmp_path / "grade.py").write_text("print(1.0)\n")
    image_env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"}
    with cluster_in_thread(image_env) as api_url:
        spec_doc = {"name": "k8s", "agent": {"command": "{python} agent.py {task_file} {output_file}"},
                    "tasks": {"path": "tasks.jsonl"}, "grader": {"command": "{python} grade.py"},
                    "runner": "kubernetes",
                    "kubernetes": {"image": "agent:1", "kubeconfig": str(_kubeconfig(tmp_path, api_url)),
                                   "workdir": str(tmp_path), "gateway_url": "http://10.1.2.3:8400",
                                   "startup_allowance_s": 0, "create_qps": 50, "watch_timeout_s": 1}}
        (tmp_path / "agl.yaml").write_text(yaml.safe_dump(spec_doc, sort_keys=False))
        spec = load_spec(tmp_path / "agl.yaml")
        from agl_cli.evaluation.controllers import make_controller

        results: list[object] = []

        class Plans(SimpleNamespace):
            """What run_plan uses of an EvalRunner: its spec, run and controller, and `run(plan)`."""

            async def run(self, plan: list[str]) -> None:
                results.extend([await self.controller.run(make_job(tmp_path, rid, {"id": rid})) for rid in plan])

        runner = Plans(spec=spec, run_dir=SimpleNamespace(run_id="20261202-plans"),
                       controller=make_controller(spec, "20261202-plans"))
        run_plan(runner, ["s1-1"])  # type: ignore[arg-type]
        run_plan(runner, ["s2-1"])  # type: ignore[arg-type]
        remaining = _jobs(api_url)
    assert [getattr(r, "exit_code", None) for r in results] == [0, 0], results
    assert remaining == []
