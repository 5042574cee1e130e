"""`agl train --on kubernetes` against kmock with the official client: the whole provision sequence, waiting for
readiness while the test flips statuses, re-running it (idempotent; a refused re-run changes nothing), the owner
every object points at, `stop`, and rollback when a create fails."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import kmock
import pytest

from rl_backend.provision.metric_rows import RowWriter, parse_rows
from rl_backend.provision.options import ANNOTATION_PROVISION, LABEL_TRAIN, ClusterOptions, ProvisionError
from rl_backend.provision.session import stop
from rl_backend.rollout.k8s_manifest import validate_schema
from tests.test_provision_support import (  # noqa: F401 - fast_schemas is an autouse fixture
    ADMIN_TOKEN,
    NAMES,
    NS,
    POLICY_KEY,
    UPSTREAM_KEY,
    cluster,
    consoles,
    create,
    fast_schemas,
    gateway_up,
    get,
    load_target,
    options,
    patch_status,
    run_provision,
    stored,
    stored_names,
    trainer_pod,
    wait_for,
    write_project,
)

pytestmark = pytest.mark.timeout(60)

EXPECTED = [
    ("ConfigMap", "agl-calc-config"), ("ConfigMap", "agl-calc-metrics"), ("ServiceAccount", "agl-calc-controller"),
    ("Role", "agl-calc-controller"),
    ("RoleBinding", "agl-calc-controller"), ("Secret", "agl-calc-gateway-admin"), ("Secret", "agl-calc-policy-key"),
    ("NetworkPolicy", "agl-calc-gateway-ingress"), ("NetworkPolicy", "agl-calc-policy-ingress"),
    ("NetworkPolicy", "agl-calc-rollout-egress"), ("PersistentVolumeClaim", "agl-calc-gateway-store"),
    ("PersistentVolumeClaim", "agl-calc-checkpoints"),
    ("Service", "agl-calc-gateway"), ("PodDisruptionBudget", "agl-calc-gateway"),
    ("PodDisruptionBudget", "agl-calc-trainer"), ("Deployment", "agl-calc-gateway"), ("Job", "agl-calc-trainer"),
]


async def _bring_up(server: kmock.KubernetesEmulator, task: asyncio.Future[Any]) -> None:
    """Play the controllers one at a time, checking the provision waits for each."""
    await gateway_up(server)
    await asyncio.sleep(0.3)
    assert not task.done(), "the provision returned before the trainer pod was Running"
    await trainer_pod(server, phase="Pending")
    await asyncio.sleep(0.3)
    assert not task.done()
    await patch_status(server, "Pod", f"{NAMES.trainer}-q2w3e", {"phase": "Running"})


async def _provisioned(server: kmock.KubernetesEmulator, api: Any, target: Any, err: Any, out: Any) -> Any:
    """A first provision of the train, its gateway and trainer pod played up at once: its result."""
    first = run_provision(api, target, options(), err, out)
    await wait_for(server, "Job", NAMES.trainer)
    await gateway_up(server)
    await trainer_pod(server)
    return await asyncio.wait_for(first, 30)


def test_the_provision_creates_every_object_with_its_spec_and_waits_for_readiness(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", UPSTREAM_KEY)
    target = load_target(write_project(tmp_path))
    err, out, err_text, _ = consoles()

    async def scenario() -> tuple[Any, list[dict[str, Any]]]:
        async with cluster() as (server, api, _):
            task = run_provision(api, target, options(), err, out)
            await wait_for(server, "Job", NAMES.trainer)
            await asyncio.sleep(0.3)
            assert not task.done(), "the provision returned before the gateway was available"
            await _bring_up(server, task)
            return await asyncio.wait_for(task, 30), stored(server)

    result, objects = asyncio.run(scenario())
    assert result.outcome == "ready"
    assert [(s.kind, s.name, s.action) for s in result.steps] == [(k, n, "created") for k, n in EXPECTED]
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    owner = by_name["ConfigMap", NAMES.config]["metadata"]
    for key in EXPECTED:
        meta = by_name[key]["metadata"]
        labels = meta["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "agl" and labels[LABEL_TRAIN] == "calc"
        assert labels["app.kubernetes.io/name"] == "agl" and labels["app.kubernetes.io/instance"] == "agl-calc"
        # One owner: deleting the ConfigMap garbage-collects the rest; the volumes outlive it on purpose.
        if key == ("ConfigMap", NAMES.config) or key[0] == "PersistentVolumeClaim":
            assert "ownerReferences" not in meta, key
        else:
            assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "ConfigMap", "name": NAMES.config,
                                                "uid": owner["uid"]}], key
        if key[0] != "Secret":  # the Secret's token is checked below
            validate_schema({k: v for k, v in by_name[key].items() if k != "status"}, "1.30")

    deployment = by_name["Deployment", NAMES.gateway]["spec"]["template"]["spec"]
    gateway = deployment["containers"][0]
    assert gateway["command"] == ["agl", "gateway", "serve", "/etc/agl/project/agl.yaml", "--in-cluster",
                                  "--store", "/data/store.sqlite", "--port", "8090"]
    env = {e["name"]: e for e in gateway["env"]}
    assert env["OPENAI_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "agl-upstream-keys", "key": "OPENAI_API_KEY"}}
    assert env["CLAUDE_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "agl-upstream-keys", "key": "CLAUDE_KEY"}}
    assert env["AGL_GATEWAY_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": NAMES.admin_secret, "key": "token"}
    assert env["AGL_POLICY_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": NAMES.policy_key, "key": "token"}
    assert "AGL_POLICY_URL" not in env  # the trainer registers its policy servers' addresses with the gateway
    assert deployment["automountServiceAccountToken"] is False
    assert {v["name"]: v for v in deployment["volumes"]}["store"]["persistentVolumeClaim"]["claimName"] == NAMES.store_pvc

    job = by_name["Job", NAMES.trainer]
    pod = job["spec"]["template"]["spec"]
    trainer = pod["containers"][0]
    assert trainer["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert trainer["command"] == ["agl", "train", "/etc/agl/project/agl.yaml", "--backend", "verl", "--resume"]
    # The token goes to the trainer's container alone (projected), not pod-wide: the grader container gets none.
    assert pod["serviceAccountName"] == NAMES.controller and pod["automountServiceAccountToken"] is False
    assert "api-token" in {m["name"] for m in trainer["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == NAMES.checkpoints
    assert {"key", "path"} <= set(volumes["project"]["configMap"]["items"][0])
    trainer_env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert trainer_env["AGL_GATEWAY_URL"] == "http://agl-calc-gateway.default.svc:8090"
    assert "OPENAI_API_KEY" not in trainer_env  # the gateway holds the upstream keys, the trainer never
    assert {e["name"]: e for e in trainer["env"]}["AGL_POLICY_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == \
        NAMES.policy_key

    config = by_name["ConfigMap", NAMES.config]
    paths = {i["path"] for i in volumes["project"]["configMap"]["items"]}
    assert paths == {"agl.yaml", "tasks.jsonl", "prompts/a.md", "grade.py"}  # the grader runs in the trainer's pod
    copied = next(v for k, v in config["data"].items() if k.endswith("agl.yaml"))
    assert "namespace: default" in copied and "kubeconfig" not in copied and "agl.dev/train: calc" in copied
    assert by_name["Secret", NAMES.admin_secret]["stringData"] == {"token": ADMIN_TOKEN}
    assert by_name["Secret", NAMES.policy_key]["stringData"] == {"token": POLICY_KEY}  # a token of its own
    assert by_name["PersistentVolumeClaim", NAMES.checkpoints]["spec"]["accessModes"] == ["ReadWriteOnce"]
    everything = json.dumps(objects) + err_text.getvalue()
    assert UPSTREAM_KEY not in everything
    assert ADMIN_TOKEN not in err_text.getvalue()


def test_a_rerun_is_idempotent_and_keeps_the_token_and_the_running_trainer(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, _, _ = consoles()

    async def scenario() -> tuple[Any, Any, set[str], set[str], dict[str, Any]]:
        async with cluster() as (server, api, _):
            one = await _provisioned(server, api, target, err, out)
            await asyncio.to_thread(RowWriter(api, NS, NAMES.metrics).append, {"step": 1, "reward": 0.5})
            before = stored_names(server)
            again = await asyncio.wait_for(run_provision(api, target, options(), err, out), 30)
            rows.append(await get(server, "ConfigMap", NAMES.metrics))
            return one, again, before, stored_names(server), await get(server, "Secret", NAMES.admin_secret)

    rows: list[dict[str, Any]] = []
    one, again, before, after, secret = asyncio.run(scenario())
    assert before == after
    # The trainer's step rows outlive the re-run's patch of their ConfigMap (the plan renders it without data).
    assert parse_rows(rows[0]) == ([{"step": 1, "reward": 0.5}], 0)
    actions = {(s.kind, s.name): s.action for s in again.steps}
    assert actions[("Secret", NAMES.admin_secret)] == "kept" and secret["stringData"] == {"token": ADMIN_TOKEN}
    assert actions[("PersistentVolumeClaim", NAMES.checkpoints)] == "kept"
    assert actions[("Job", NAMES.trainer)] == "kept"
    assert actions[("Deployment", NAMES.gateway)] == "patched"


def test_stop_deletes_exactly_what_the_train_made(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, _, _ = consoles()

    async def scenario() -> tuple[list[str], set[str], list[str], set[str]]:
        async with cluster() as (server, api, _):
            await _provisioned(server, api, target, err, out)
            # Not the train's: another train's ConfigMap, a ConfigMap of nobody's; the train's: a rollout Job the
            # controller left behind (the cluster's agl.yaml gives rollout Jobs the train's label).
            await create(server, "ConfigMap", {"kind": "ConfigMap", "metadata": {"name": "other", "labels": {
                "app.kubernetes.io/managed-by": "agl", LABEL_TRAIN: "other"}}})
            await create(server, "ConfigMap", {"kind": "ConfigMap", "metadata": {"name": "unrelated"}})
            await create(server, "Job", {"metadata": {"name": "agl-1234-r1-1", "labels": {
                "app.kubernetes.io/managed-by": "agl", LABEL_TRAIN: "calc", "agl.dev/run": "x"}}, "spec": {}})
            cluster_options = ClusterOptions(namespace=NS)
            kept = await asyncio.to_thread(stop, "calc", cluster_options, keep_volumes=True, api_client=api)
            after_keep = stored_names(server)
            deleted = await asyncio.to_thread(stop, "calc", cluster_options, api_client=api)
            return kept, after_keep, deleted, stored_names(server)

    kept, after_keep, deleted, remaining = asyncio.run(scenario())
    assert "PersistentVolumeClaim/agl-calc-checkpoints" in after_keep
    assert sorted(deleted) == ["PersistentVolumeClaim/agl-calc-checkpoints", "PersistentVolumeClaim/agl-calc-gateway-store"]
    expected = {f"{k}/{n}" for k, n in EXPECTED} | {"Job/agl-1234-r1-1"}
    assert set(kept) == expected - {"PersistentVolumeClaim/agl-calc-checkpoints",
                                    "PersistentVolumeClaim/agl-calc-gateway-store"}
    assert kept[0] == "Job/agl-1234-r1-1" or kept[0] == "Job/agl-calc-trainer"  # the trainer kind goes first
    assert kept[-1] == "ConfigMap/agl-calc-config"  # the owner goes last
    # What is left: the stand-in pods and endpoints (their controllers would delete them), the foreign objects, and
    # the user's own Secret with the upstream keys (agl reads it by reference; it is not agl's to delete).
    assert {n for n in remaining if not n.startswith(("Pod/", "EndpointSlice/"))} == {
        "ConfigMap/other", "ConfigMap/unrelated", "Secret/agl-upstream-keys"}


@pytest.mark.parametrize(("kind", "status"), [("RoleBinding", 422), ("Deployment", 500), ("Job", 422)])
def test_a_failed_create_rolls_back_everything_created_before_it(tmp_path: Path, kind: str, status: int) -> None:
    target = load_target(write_project(tmp_path))
    err, out, err_text, _ = consoles()

    async def scenario() -> tuple[BaseException | None, set[str]]:
        async with cluster() as (server, api, _):
            await create(server, "ConfigMap", {"kind": "ConfigMap", "metadata": {"name": "unrelated"}})
            path = {"RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
                    "Deployment": "/apis/apps/v1/namespaces/default/deployments",
                    "Job": "/apis/batch/v1/namespaces/default/jobs"}[kind]

            def refuse(request: kmock.Request) -> Any:
                # kmock stores a created object even when a reaction answers an error. A 422 stores nothing on a
                # real server; here a 500 also stored nothing: drop it, so every retry fails the same way.
                name = request.data["metadata"]["name"]
                plural = path.rsplit("/", 1)[1]
                for key in [k for k, _ in server.objects.items() if k[0].plural == plural and k[2] == name]:
                    del server.objects[key]
                raise kmock.KubernetesError(status=status, reason="Injected", message=f"injected {status}")

            server["post", path] << refuse
            try:
                await asyncio.wait_for(run_provision(api, target, options(), err, out), 30)
                return None, stored_names(server)
            except ProvisionError as exc:
                return exc, stored_names(server)

    error, remaining = asyncio.run(scenario())
    assert isinstance(error, ProvisionError)
    assert f"cannot create {kind}/" in error.message and f"injected {status}" in error.message
    assert remaining == {"ConfigMap/unrelated", "Secret/agl-upstream-keys"}  # nothing of the train is left
    assert "rolled back" in err_text.getvalue()


def test_a_500_whose_create_was_stored_is_adopted_and_still_rolled_back(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, err_text, _ = consoles()

    async def scenario() -> tuple[BaseException | None, int, set[str]]:
        async with cluster() as (server, api, _):
            calls = {"deployments": 0}

            def flaky(request: kmock.Request) -> Any:
                calls["deployments"] += 1
                if calls["deployments"] > 1:
                    return NotImplemented
                raise kmock.KubernetesError(status=500, reason="Internal", message="etcd timeout (stored anyway)")

            def refuse(request: kmock.Request) -> Any:
                name = request.data["metadata"]["name"]
                del server.objects["batch/v1/jobs", NS, name]
                raise kmock.KubernetesError(status=422, reason="Invalid", message="spec.template: invalid")

            server["post", "/apis/apps/v1/namespaces/default/deployments"] << flaky
            server["post", "/apis/batch/v1/namespaces/default/jobs"] << refuse
            error: BaseException | None = None
            try:
                await asyncio.wait_for(run_provision(api, target, options(), err, out), 30)
            except ProvisionError as exc:
                error = exc
            posts = [r for r in server if r.method == "POST" and r.url.path.endswith("/deployments")]
            return error, len(posts), stored_names(server)

    error, attempts, remaining = asyncio.run(scenario())
    assert isinstance(error, ProvisionError) and "spec.template: invalid" in error.message
    # The retry met 409, found its own provision id on the Deployment, adopted it; the rollback deleted it.
    assert attempts == 2 and "created Deployment/agl-calc-gateway" in err_text.getvalue()
    assert remaining == {"Secret/agl-upstream-keys"}


def test_an_object_of_the_same_name_that_is_not_the_trains_is_left_alone(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, _, _ = consoles()

    async def scenario() -> tuple[BaseException, dict[str, Any], set[str]]:
        async with cluster() as (server, api, _):
            await create(server, "Service", {"kind": "Service", "metadata": {"name": NAMES.gateway, "labels": {"app": "theirs"},
                                                          "annotations": {ANNOTATION_PROVISION: "x"}}})
            with pytest.raises(ProvisionError) as caught:
                await asyncio.wait_for(run_provision(api, target, options(), err, out), 30)
            return caught.value, await get(server, "Service", NAMES.gateway), stored_names(server)

    error, service, remaining = asyncio.run(scenario())
    assert "not part of train 'calc'" in str(error)
    assert service["metadata"]["labels"] == {"app": "theirs"}
    assert remaining == {f"Service/{NAMES.gateway}", "Secret/agl-upstream-keys"}


def test_a_refused_rerun_changes_nothing_in_the_running_train(tmp_path: Path) -> None:
    config = write_project(tmp_path)
    err, out, _, _ = consoles()

    async def scenario() -> tuple[ProvisionError, list[str], Any, Any, Any]:
        async with cluster() as (server, api, _):
            await _provisioned(server, api, load_target(config), err, out)
            before = (await get(server, "ConfigMap", NAMES.config), await get(server, "Deployment", NAMES.gateway))
            seen = len(list(server))
            # A new prompt: the ConfigMap, the gateway's config hash and the trainer's spec would all change.
            (tmp_path / "prompts" / "a.md").write_text("Be terse.\n")
            with pytest.raises(ProvisionError) as caught:
                await asyncio.wait_for(run_provision(api, load_target(config), options(), err, out), 30)
            writes = [f"{r.method} {r.url.path}" for r in list(server)[seen:] if r.method not in ("GET",)]
            after = (await get(server, "ConfigMap", NAMES.config), await get(server, "Deployment", NAMES.gateway))
            return caught.value, writes, before, after, await get(server, "Job", NAMES.trainer)

    error, writes, before, after, trainer = asyncio.run(scenario())
    assert writes == []  # decided before any write: no create, patch or delete reached the API
    assert after == before  # the ConfigMap and the gateway's config hash (a restart) are as they were
    assert "running with a different spec" in error.message and "nothing was changed" in error.message
    assert isinstance(error, ProvisionError) and error.exit_code == 2
    assert trainer is not None


def test_a_finished_trainer_is_replaced_and_the_train_resumes(tmp_path: Path) -> None:
    config = write_project(tmp_path)
    err, out, _, _ = consoles()

    async def scenario() -> tuple[dict[tuple[str, str], str], dict[str, Any]]:
        async with cluster() as (server, api, _):
            await _provisioned(server, api, load_target(config), err, out)
            await patch_status(server, "Job", NAMES.trainer, {"conditions": [{"type": "Complete", "status": "True"}],
                                                              "succeeded": 1})
            (tmp_path / "prompts" / "a.md").write_text("Be terse.\n")
            again = run_provision(api, load_target(config), options(), err, out)
            await asyncio.sleep(0.5)
            await patch_status(server, "Pod", f"{NAMES.trainer}-q2w3e", {"phase": "Running"})
            result = await asyncio.wait_for(again, 30)
            return {(s.kind, s.name): s.action for s in result.steps}, await get(server, "ConfigMap", NAMES.config)

    actions, config_map = asyncio.run(scenario())
    assert actions[("Job", NAMES.trainer)] == "replaced" and actions[("ConfigMap", NAMES.config)] == "patched"
    assert any("Be terse." in text for text in config_map["data"].values())
