"""The trainer a cluster train runs: where (a Job on one node, a RayJob only across nodes, with the policy on the
GPU pods), with which flags (the user's `agl train` flags, checked before rendering), how often it is retried, and
the checkpoint volume's access mode. Then the acceptance plan: examples/calc at 1, 8 and 16 GPUs, every manifest
validated against the Kubernetes schema and KubeRay's RayJob CRD schema."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agl_cli.main import app
from rl_backend.provision.rayjob_schema import SCHEMA_FILE, validate_rayjob
from rl_backend.rollout.k8s_manifest import ManifestError, validate_schema
from tests.helpers import REPO
from tests.test_provision_isolation import _of, cluster_spec, rollout_job
from tests.test_provision_render import _app
from tests.test_provision_support import (  # noqa: F401 - fast_schemas is an autouse fixture
    NAMES,
    cluster,
    consoles,
    fast_schemas,
    gateway_up,
    load_target,
    options,
    run_provision,
    trainer_pod,
    wait_for,
    write_project,
)

pytestmark = pytest.mark.timeout(60)
CALC = REPO / "examples" / "calc" / "agl.yaml"


def _plan(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(_app(), [str(CALC), "--on", "kubernetes", "--dry-run", "--json", *args])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def _command(manifests: list[dict[str, Any]]) -> list[str]:
    for manifest in manifests:
        if manifest["kind"] == "Job":
            return list(manifest["spec"]["template"]["spec"]["containers"][0]["command"])
        if manifest["kind"] == "RayJob":
            import shlex

            return shlex.split(manifest["spec"]["entrypoint"])
    raise AssertionError("no trainer")


@pytest.mark.parametrize("gpus", [[], ["--gpus", "16", "--nodes", "2"]])
def test_the_users_training_flags_reach_the_trainer(gpus: list[str]) -> None:
    plan = _plan(*gpus, "--steps", "3", "--lora", "--lora-rank", "32", "--lr", "2e-05", "--group-size", "8",
                 "--loop", "sync", "--heldout-limit", "10", "--heldout-split", "test split")
    assert _command(plan["manifests"]) == [
        "agl", "train", "/etc/agl/project/agl.yaml", "--backend", "verl", "--resume", "--steps", "3",
        "--group-size", "8", "--lr", "2e-05", "--lora", "--lora-rank", "32", "--loop", "sync", "--heldout-limit",
        "10", "--heldout-split", "test split"]
    # Unset flags are not passed: the trainer's defaults apply.
    assert _command(_plan()["manifests"])[6:] == []
    assert _command(_plan("--no-lora", "--loss-agg", "token-mean", "--kl-coef", "0.01")["manifests"])[6:] == \
        ["--no-lora", "--loss-agg", "token-mean", "--kl-coef", "0.01"]


def test_the_rendered_trainer_command_is_one_the_verl_trainer_takes() -> None:
    """The flags rendered into the trainer's command, given to the real `agl train --backend verl` (dry run)."""
    command = _command(_plan("--steps", "3", "--lora", "--lora-rank", "32", "--group-size", "8", "--loss-agg",
                             "token-mean", "--kl-coef", "0.01", "--heldout-limit", "10")["manifests"])
    args = [str(CALC) if a == "/etc/agl/project/agl.yaml" else a for a in command[2:]]
    result = CliRunner().invoke(app, ["train", *args, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)["settings"]
    assert (settings["steps"], settings["lora_rank"], settings["kl_coef"]) == (3, 32, 0.01)


@pytest.mark.parametrize(("flags", "message"), [
    (["--lora", "--lora-rank", "0"], "--lora-rank 0: a LoRA rank is at least 1"),
    (["--no-lora", "--lora-rank", "16"], "--lora-rank needs --lora"),
    (["--group-size", "1"], "--group-size must be at least 2"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--loss-agg", "sum"], "--loss-agg 'sum': use rollout, token-mean, seq-mean-token-mean"),
    (["--loop", "collocated-async"], "the cluster's verl trainer trains with the sync loop"),
    (["--kl-coef", "0.1"], "--kl-coef > 0 needs --loss-agg token-mean"),
    (["--lr", "-1"], "--lr must be a non-negative number"),
])
def test_training_flags_are_checked_before_anything_is_rendered(flags: list[str], message: str) -> None:
    result = CliRunner().invoke(_app(), [str(CALC), "--on", "kubernetes", "--dry-run", *flags])
    assert result.exit_code == 2 and message in result.output, result.output
    assert result.stdout == ""


def test_the_trainer_job_and_the_rayjob_retry_alike() -> None:
    job = next(m for m in _plan()["manifests"] if m["kind"] == "Job")
    rayjob = next(m for m in _plan("--gpus", "16")["manifests"] if m["kind"] == "RayJob")
    assert job["spec"]["backoffLimit"] == rayjob["spec"]["backoffLimit"] == 3


@pytest.mark.parametrize(("args", "kind", "access"), [
    ([], "Job", "ReadWriteOnce"),
    (["--gpus", "8"], "Job", "ReadWriteOnce"),  # one node: a Job, KubeRay or not
    (["--gpus", "16"], "RayJob", "ReadWriteMany"),
    (["--gpus", "4", "--trainer", "rayjob"], "RayJob", "ReadWriteMany"),  # head and worker: two pods, one volume
])
def test_a_rayjob_only_across_nodes_and_rwx_whenever_two_pods_mount_the_checkpoints(
        args: list[str], kind: str, access: str) -> None:
    plan = _plan(*args)
    assert plan["trainer"]["kind"] == kind
    pvc = next(m for m in plan["manifests"] if m["metadata"]["name"] == NAMES.checkpoints)
    assert pvc["spec"]["accessModes"] == [access]


def test_with_kuberay_installed_one_node_is_still_a_job(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, _, _ = consoles()

    async def scenario() -> Any:
        async with cluster(kuberay=True) as (server, api, _):
            task = run_provision(api, target, options(gpus=8), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await gateway_up(server)
            await trainer_pod(server)
            return await asyncio.wait_for(task, 30)

    result = asyncio.run(scenario())
    assert result.topology.kind == "job" and result.topology.gpus_per_node == 8
    assert ("Job", NAMES.trainer, "created") in [(s.kind, s.name, s.action) for s in result.steps]


def test_the_shipped_crd_schema_catches_what_kuberay_would_refuse() -> None:
    rayjob = next(m for m in _plan("--gpus", "16")["manifests"] if m["kind"] == "RayJob")
    validate_rayjob(rayjob, "1.30")
    for path, value, message in [
        (("spec", "backoffLimit"), "3", "'3' is not of type 'integer'"),
        (("spec", "rayClusterSpec", "headGroupSpec", "rayStartParams"), {"num-gpus": 0}, "is not of type 'string'"),
        (("spec", "shutdownAfterJobFinish"), True, "Additional properties are not allowed"),
        (("spec", "submissionMode"), 7, "is not of type 'string'"),
    ]:
        broken = json.loads(json.dumps(rayjob))
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(ManifestError, match=message):
            validate_rayjob(broken, "1.30")
    assert json.loads(SCHEMA_FILE.read_text())["kuberay_version"] == "v1.7.0"


@pytest.mark.parametrize(("args", "nodes", "gpus_per_node"), [
    (["--gpus", "1"], 1, 1), (["--gpus", "8"], 1, 8), (["--gpus", "16", "--nodes", "2"], 2, 8)])
def test_the_calc_example_renders_a_coherent_validated_plan(tmp_path: Path, args: list[str], nodes: int,
                                                            gpus_per_node: int) -> None:
    plan = _plan(*args)
    manifests = plan["manifests"]
    for manifest in manifests:  # independently of the provision's own checks
        if manifest["kind"] == "RayJob":
            validate_rayjob(manifest, "1.30")
        else:
            validate_schema(manifest, "1.30")
    # Rollouts: Jobs that run the calc agent from the shipped project.
    spec = cluster_spec(manifests)
    shipped = {item["path"] for item in spec.model_dump()["project"]["items"]}
    assert {"agent.py", "grade.py", "tasks.jsonl", "prompts/system.md", "prompts/fewshot.md"} <= shipped
    job = rollout_job(manifests, tmp_path)
    assert job["spec"]["template"]["spec"]["containers"][0]["workingDir"] == "/etc/agl/project"
    # The policy on the GPU pods, and only there.
    gpu_pods, policy_hosts = [], []
    for manifest in manifests:
        templates = []
        if manifest["kind"] == "Job":
            templates = [manifest["spec"]["template"]]
        if manifest["kind"] == "RayJob":
            cluster_spec_ = manifest["spec"]["rayClusterSpec"]
            templates = [cluster_spec_["headGroupSpec"]["template"],
                         *[g["template"] for g in cluster_spec_["workerGroupSpecs"]]]
            assert cluster_spec_["workerGroupSpecs"][0]["replicas"] == nodes
        for template in templates:
            limits = template["spec"]["containers"][0]["resources"].get("limits", {})
            gpu_pods.append(limits.get("nvidia.com/gpu") == str(gpus_per_node))
            policy_hosts.append(template["metadata"]["labels"].get("agl.dev/policy-host") == "true")
    assert gpu_pods == policy_hosts and any(gpu_pods)
    access = next(m for m in manifests if m["metadata"]["name"] == NAMES.checkpoints)["spec"]["accessModes"]
    assert access == ["ReadWriteMany" if nodes > 1 else "ReadWriteOnce"]
    policies = {m["metadata"]["name"] for m in _of(manifests, "NetworkPolicy")}
    assert policies == {"agl-calc-gateway-ingress", "agl-calc-policy-ingress",
                        *(["agl-calc-ray-ingress"] if nodes > 1 else [])}
    copied = yaml.safe_load(next(v for k, v in _of(manifests, "ConfigMap")[0]["data"].items()
                                 if k.endswith("agl.yaml")))
    assert copied["runner"] == "kubernetes"
