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
from rl_backend.provision.plan import TRAINER_RUNS
from rl_backend.provision.rayjob_schema import SCHEMA_FILE, validate_rayjob
from rl_backend.provision.readiness import trainer_check, trainer_finished
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
    # The policy servers' context: a multi-turn agent on the cluster is not held to the 4096 + 2048 defaults.
    assert _command(_plan(*gpus, "--max-prompt-length", "6144", "--max-response-length", "1024")["manifests"])[6:] == \
        ["--max-prompt-length", "6144", "--max-response-length", "1024"]
    # An agent with tools on a model whose family agl does not know, and vLLM in float32.
    assert _command(_plan(*gpus, "--tool-call-parser", "llama3_json", "--rollout-dtype", "float32")["manifests"])[6:] \
        == ["--tool-call-parser", "llama3_json", "--rollout-dtype", "float32"]


def test_the_rendered_trainer_command_is_one_the_verl_trainer_takes() -> None:
    """The flags rendered into the trainer's command, given to the real `agl train --backend verl` (dry run)."""
    command = _command(_plan("--steps", "3", "--lora", "--lora-rank", "32", "--group-size", "8", "--loss-agg",
                             "token-mean", "--kl-coef", "0.01", "--heldout-limit", "10", "--max-prompt-length", "1000",
                             "--max-response-length", "500", "--tool-call-parser", "llama3_json", "--rollout-dtype",
                             "float32", "--temperature", "1")["manifests"])
    args = [str(CALC) if a == "/etc/agl/project/agl.yaml" else a for a in command[2:]]
    result = CliRunner().invoke(app, ["train", *args, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)["settings"]
    assert (settings["steps"], settings["lora_rank"], settings["kl_coef"]) == (3, 32, 0.01)
    assert (settings["max_prompt_length"], settings["max_response_length"]) == (1000, 500)
    assert (settings["tool_call_parser"], settings["rollout_dtype"], settings["temperature"]) == \
        ("llama3_json", "float32", 1.0)


@pytest.mark.parametrize(("flags", "message"), [
    (["--lora", "--lora-rank", "0"], "--lora-rank 0: a LoRA rank is at least 1"),
    (["--no-lora", "--lora-rank", "16"], "--lora-rank needs --lora"),
    (["--group-size", "1"], "--group-size must be at least 2"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--loss-agg", "sum"], "--loss-agg 'sum': use rollout, token-mean, seq-mean-token-mean"),
    (["--loop", "collocated-async"], "the cluster's verl trainer trains with the sync loop"),
    (["--kl-coef", "0.1"], "--kl-coef > 0 needs --loss-agg token-mean"),
    (["--lr", "-1"], "--lr must be a non-negative number"),
    (["--max-prompt-length", "0"], "--max-prompt-length must be at least 1"),
    (["--max-response-length", "-5"], "--max-response-length must be at least 1"),
    # The verl trainer would refuse these minutes later, on a GPU.
    (["--temperature", "0.7"], "--temperature 0.7: the cluster's verl trainer records the policy's raw"),
    (["--rollout-dtype", "fp8"], "--rollout-dtype 'fp8': use bfloat16, float16, float32"),
    (["--tool-call-parser", " "], "--tool-call-parser must name a parser"),
])
def test_training_flags_are_checked_before_anything_is_rendered(flags: list[str], message: str) -> None:
    result = CliRunner().invoke(_app(), [str(CALC), "--on", "kubernetes", "--dry-run", *flags])
    assert result.exit_code == 2 and message in result.output, result.output
    assert result.stdout == ""


def _runs(trainer: dict[str, Any]) -> int:
    """How many times the trainer runs before its controller gives up. A Job whose pod restarts OnFailure fails once
    its containers' restarts reach backoffLimit (the restart that reaches it is killed: backoffLimit runs); with
    restartPolicy Never, once failed pods exceed it (backoffLimit + 1 runs). KubeRay retries a RayJob while
    status.failed < backoffLimit + 1 (backoffLimit + 1 runs)."""
    limit = int(trainer["spec"]["backoffLimit"])
    if trainer["kind"] == "RayJob":
        return limit + 1
    return limit if trainer["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure" else limit + 1


def test_the_trainer_job_and_the_rayjob_retry_alike() -> None:
    job = next(m for m in _plan()["manifests"] if m["kind"] == "Job")
    rayjob = next(m for m in _plan("--gpus", "16")["manifests"] if m["kind"] == "RayJob")
    assert _runs(job) == _runs(rayjob) == TRAINER_RUNS == 3


def test_the_ray_cluster_goes_away_soon_after_the_train_ends() -> None:
    # shutdownAfterJobFinishes deletes the RayCluster ttlSecondsAfterFinished after the job ends: its GPU workers are
    # held that long for nothing. A minute lets `agl train` read the last metrics; an hour cost an hour of GPUs.
    rayjob = next(m for m in _plan("--gpus", "16")["manifests"] if m["kind"] == "RayJob")
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
    assert 0 <= rayjob["spec"]["ttlSecondsAfterFinished"] <= 120


@pytest.mark.parametrize(("status", "finished"), [
    # KubeRay 1.7: an attempt failed and another is coming (backoffLimit not reached): not over.
    ({"jobStatus": "FAILED", "jobDeploymentStatus": "Retrying", "failed": 1}, None),
    ({"jobStatus": "FAILED", "jobDeploymentStatus": "Running", "failed": 1}, None),  # before the operator decides
    ({"jobStatus": "", "jobDeploymentStatus": "Initializing", "failed": 2}, None),  # the next attempt's cluster
    ({"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}, None),
    ({"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "failed": 3, "reason": "BackoffLimitExceeded"},
     ("failed", "FAILED: BackoffLimitExceeded")),
    ({"jobStatus": "FAILED", "jobDeploymentStatus": "Complete"}, ("failed", "FAILED")),  # KubeRay before backoffLimit
    ({"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete"}, ("succeeded", "")),
    ({"jobDeploymentStatus": "ValidationFailed", "message": "bad spec"}, ("failed", "ValidationFailed: bad spec")),
])
def test_a_retrying_rayjob_is_not_over(status: dict[str, Any], finished: Any) -> None:
    rayjob = {"kind": "RayJob", "status": status}
    assert trainer_finished(rayjob) == finished
    check = trainer_check(rayjob, [], name=NAMES.trainer, kind="RayJob", nodes=2)
    assert (check.failure is not None) == (finished is not None and finished[0] == "failed")
    if status.get("jobDeploymentStatus") == "Retrying":
        assert "attempt 1 of 3 failed" in check.detail and "retrying" in check.detail


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
    assert policies == {"agl-calc-gateway-ingress", "agl-calc-policy-ingress", "agl-calc-rollout-egress",
                        *(["agl-calc-ray-ingress"] if nodes > 1 else [])}
    copied = yaml.safe_load(next(v for k, v in _of(manifests, "ConfigMap")[0]["data"].items()
                                 if k.endswith("agl.yaml")))
    assert copied["runner"] == "kubernetes"


@pytest.mark.parametrize("args", [[], ["--gpus", "16"]])
def test_converted_models_land_on_the_volume_every_trainer_pod_mounts(args: list[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Known models are converted once into the model cache; with HOME=/tmp (an emptyDir of one pod) the RayJob's
    # GPU workers got a path that existed on the head only. The cache must be on the shared checkpoint volume.
    from rl_backend.serving.model_store import cache_root

    pods = []
    for manifest in _plan(*args)["manifests"]:
        if manifest["kind"] == "Job":
            pods.append(manifest["spec"]["template"]["spec"])
        if manifest["kind"] == "RayJob":
            cluster = manifest["spec"]["rayClusterSpec"]
            pods += [cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"][0]["template"]["spec"]]
    assert pods
    for pod in pods:
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        for key, value in env.items():
            if value is not None:
                monkeypatch.setenv(key, value)
        volume = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "checkpoints")
        claim = next(v for v in pod["volumes"] if v["name"] == "checkpoints")["persistentVolumeClaim"]["claimName"]
        assert claim == NAMES.checkpoints
        assert cache_root().is_relative_to(volume), (cache_root(), volume)


def test_a_trainer_jobs_policy_servers_listen_where_the_gateway_pod_reaches_them() -> None:
    # The Job's pod starts a Ray of its own; its policy servers used to listen on loopback, which the gateway (in
    # its own pod) cannot reach. The pod names its address, and the trainer's own Ray keeps it.
    from rl_backend.trainer.verl_backend.listen import POLICY_HOST_ENV, own_ray_policy_host

    job = next(m for m in _plan()["manifests"] if m["kind"] == "Job")
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[POLICY_HOST_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert own_ray_policy_host({POLICY_HOST_ENV: "10.244.0.10"}) == "10.244.0.10"
    assert own_ray_policy_host({}) == "127.0.0.1"  # a laptop's train: its own gateway only
    rayjob = next(m for m in _plan("--gpus", "16")["manifests"] if m["kind"] == "RayJob")
    for group in (rayjob["spec"]["rayClusterSpec"]["headGroupSpec"],
                  rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]):
        names = {e["name"] for e in group["template"]["spec"]["containers"][0]["env"]}
        assert POLICY_HOST_ENV not in names  # a RayJob's servers take their node's address from Ray
