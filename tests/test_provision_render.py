"""What a provision would apply, without a cluster: `--dry-run` through the command line (every manifest validates),
the Role's rules (namespaced, Jobs and Pods only), upstream keys only by reference, the trainer's topology (Job,
RayJob, several nodes), the files shipped in the ConfigMap, and `agl train` routing between local and cluster."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from agl_cli.commands import train_k8s
from rl_backend.provision.options import ProvisionError, parse_secret_ref
from rl_backend.provision.rayjob_schema import validate_rayjob
from rl_backend.provision.render import rayjob_note, render_all
from rl_backend.provision.session import dry_run, render_train
from rl_backend.rollout.k8s_manifest import validate_schema
from tests.test_provision_support import (  # noqa: F401 - fast_schemas is an autouse fixture
    AGL_YAML,
    KUBERAY_NS,
    NAMES,
    UPSTREAM_KEY,
    cluster,
    consoles,
    fast_schemas,
    get,
    load_target,
    options,
    pod_for,
    run_provision,
    wait_for,
    write_project,
)

pytestmark = pytest.mark.timeout(60)


def _app() -> typer.Typer:
    """`agl train` as the lead wires it: a TrainGroup with the local `run` command and ours."""
    app = typer.Typer(cls=train_k8s.TrainGroup, no_args_is_help=True)

    @app.command("run", hidden=True)
    def run(config: Path, backend: str = "embedded") -> None:
        print(json.dumps({"local": str(config), "backend": backend}))

    train_k8s.register(app)
    return app


def _by_kind(manifests: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for manifest in manifests:
        found.setdefault(manifest["kind"], []).append(manifest)
    return found


@pytest.mark.parametrize("extra", [[], ["--gpus", "16"], ["--trainer", "rayjob", "--gpus", "4"]])
def test_dry_run_prints_every_manifest_and_each_validates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          extra: list[str]) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", UPSTREAM_KEY)
    config = write_project(tmp_path)
    result = CliRunner().invoke(_app(), [str(config), "--on", "kubernetes", "--dry-run", *extra])
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = [d["kind"] for d in docs]
    rayjob = extra != []
    assert kinds == ["ConfigMap", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Secret", "Secret", "NetworkPolicy",
                     "NetworkPolicy", *(["NetworkPolicy"] if rayjob else []), "NetworkPolicy", "PersistentVolumeClaim",
                     "PersistentVolumeClaim", "Service", "PodDisruptionBudget", "PodDisruptionBudget", "Deployment",
                     "RayJob" if rayjob else "Job"]
    for doc in docs:
        if doc["kind"] == "RayJob":
            validate_rayjob(doc, "1.30")  # against KubeRay's CRD schema; its pod templates as PodTemplateSpec
        else:
            validate_schema(doc, "1.30")
    assert UPSTREAM_KEY not in result.output
    assert (rayjob_note() in result.stdout) == rayjob  # said where it is printed
    assert "nothing was applied" in result.stderr


def test_dry_run_json_holds_the_manifests(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), [str(write_project(tmp_path)), "--on=kubernetes", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["outcome"] == "dry-run" and len(document["manifests"]) == 17
    assert document["trainer"]["kind"] == "Job"


def test_the_role_is_namespaced_and_grants_only_what_the_controller_uses(tmp_path: Path) -> None:
    result = dry_run(load_target(write_project(tmp_path)), options(namespace="team-a"))
    kinds = _by_kind(result.manifests)
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    (role,) = kinds["Role"]
    assert role["metadata"]["namespace"] == "team-a"
    rules = {(tuple(r["apiGroups"]), resource, tuple(r["verbs"]), tuple(r.get("resourceNames") or ()))
             for r in role["rules"] for resource in r["resources"]}
    # Exactly the calls rl_backend/rollout/kubernetes.py makes: Jobs (create, read, list+watch, delete one or the
    # run's all), the run's pods listed (exit codes, pods that cannot start), a pod's log. No jobs/status, no pods
    # get/watch, no pods/status. And what rl_backend/provision/metric_rows.py does: get and patch the one ConfigMap
    # of the step rows, by name (no list, no create, no other ConfigMap: not the project's, not another train's).
    assert rules == {
        (("batch",), "jobs", ("create", "get", "list", "watch", "delete", "deletecollection"), ()),
        (("",), "pods", ("list",), ()),
        (("",), "pods/log", ("get",), ()),
        (("",), "configmaps", ("get", "patch"), (NAMES.metrics,)),
    }
    assert all("*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"] for r in role["rules"])
    assert not any("nonResourceURLs" in r for r in role["rules"])
    assert [r["resourceNames"] for r in role["rules"] if "resourceNames" in r] == [[NAMES.metrics]]
    # The ConfigMap it names is this train's, created by the plan (empty: a re-run's patch keeps the rows).
    metrics = next(c for c in kinds["ConfigMap"] if c["metadata"]["name"] == NAMES.metrics)
    assert metrics["metadata"]["labels"]["agl.dev/train"] == NAMES.train and "data" not in metrics
    (binding,) = kinds["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAMES.controller, "namespace": "team-a"}]
    # Only the trainer's pod runs with that identity; the gateway gets no API token at all.
    (deployment,) = kinds["Deployment"]
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in deployment["spec"]["template"]["spec"]
    (sa,) = kinds["ServiceAccount"]
    assert sa["automountServiceAccountToken"] is False


def test_upstream_keys_appear_only_by_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", UPSTREAM_KEY)
    monkeypatch.setenv("CLAUDE_KEY", UPSTREAM_KEY + "-claude")
    target = load_target(write_project(tmp_path))
    opts = options(key_secrets=[parse_secret_ref("CLAUDE_KEY=anthropic-creds:api-key")])
    result = dry_run(target, opts)
    text = json.dumps(result.manifests)
    assert UPSTREAM_KEY not in text
    env = {e["name"]: e for e in _by_kind(result.manifests)["Deployment"][0]["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["CLAUDE_KEY"] == {"name": "CLAUDE_KEY", "valueFrom": {"secretKeyRef": {
        "name": "anthropic-creds", "key": "api-key"}}}
    assert "value" not in env["OPENAI_API_KEY"]
    secret = _by_kind(result.manifests)["Secret"][0]
    assert secret["stringData"]["token"].startswith("(random")  # a placeholder: the real token is never rendered
    # Defense in depth: were a value to end up in a manifest (a template's doing), nothing is applied.
    *_, rendered = render_train(target, opts, None, "p")
    context = _context(target, opts)
    with pytest.raises(ProvisionError, match="upstream key"):
        render_all(context, withheld=["anthropic-creds"], kubernetes_version="1.30")
    assert rendered.manifests


def _context(target: Any, opts: Any) -> dict[str, Any]:
    from rl_backend.provision.options import Names
    from rl_backend.provision.plan import choose_topology, template_context
    from rl_backend.provision.session import rollout_plan
    from rl_backend.provision.target import carried_files, key_refs

    names = Names("calc")
    files = carried_files(target, names, "default", [], rollout_plan(target, opts))
    return template_context(names=names, namespace="default", options=opts, topology=choose_topology(opts, False),
                            refs=key_refs(target, opts.key_secrets), files=files, provision_id="p",
                            image_pull_secrets=[])


def test_the_trainer_topology(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    single = dry_run(target, options(gpus=8))
    job = _by_kind(single.manifests)["Job"][0]
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    many = dry_run(target, options(gpus=16))
    rayjob = _by_kind(many.manifests)["RayJob"][0]["spec"]
    (workers,) = rayjob["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == 2 and workers["rayStartParams"]["num-gpus"] == "8"
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    head = rayjob["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == NAMES.controller  # the driver (and rollout controller) runs on the head
    assert "nvidia.com/gpu" not in head["containers"][0]["resources"].get("limits", {})
    assert rayjob["entrypoint"] == "agl train /etc/agl/project/agl.yaml --backend verl --resume"
    # The policy servers run where the GPUs are: the workers host them, the head (no GPUs) does not.
    assert workers["template"]["metadata"]["labels"]["agl.dev/policy-host"] == "true"
    assert "agl.dev/policy-host" not in rayjob["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    assert job["spec"]["template"]["metadata"]["labels"]["agl.dev/policy-host"] == "true"
    pvc = [p for p in _by_kind(many.manifests)["PersistentVolumeClaim"] if p["metadata"]["name"] == NAMES.checkpoints]
    assert pvc[0]["spec"]["accessModes"] == ["ReadWriteMany"]  # every node writes its shards
    with pytest.raises(ProvisionError, match="does not split evenly"):
        dry_run(target, options(gpus=12, nodes=5))
    with pytest.raises(ProvisionError, match="need KubeRay"):
        dry_run(target, options(gpus=16, trainer="job"))


def test_the_configmap_ships_the_named_files_and_refuses_what_does_not_fit(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    result = dry_run(target, options(include=["grade.py"]))
    config = _by_kind(result.manifests)["ConfigMap"][0]
    items = _by_kind(result.manifests)["Job"][0]["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"]
    assert {i["path"] for i in items} == {"agl.yaml", "tasks.jsonl", "prompts/a.md", "grade.py"}
    assert {i["key"] for i in items} == set(config["data"])
    with pytest.raises(ProvisionError, match="outside the folder"):
        dry_run(target, options(include=["../elsewhere.py"]))
    (tmp_path / "big.jsonl").write_text("x" * 1_000_000)
    with pytest.raises(ProvisionError, match="ConfigMap holds at most"):
        dry_run(target, options(include=["big.jsonl"]))


def test_with_kuberay_the_trainer_is_a_rayjob_and_is_up_with_its_head_and_workers(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, _, _ = consoles()

    async def scenario() -> Any:
        async with cluster(kuberay=True) as (server, api, _):
            from tests.test_provision_support import gateway_up

            task = run_provision(api, target, options(gpus=16), err, out)
            rayjob = await wait_for(server, "RayJob", NAMES.trainer)
            await gateway_up(server)
            cluster_spec = rayjob["spec"]["rayClusterSpec"]
            await pod_for(server, cluster_spec["headGroupSpec"]["template"], "agl-calc-trainer-raycluster-head")
            await pod_for(server, cluster_spec["workerGroupSpecs"][0]["template"], "agl-calc-trainer-worker-1")
            await asyncio.sleep(0.3)
            assert not task.done()  # one of two workers
            await pod_for(server, cluster_spec["workerGroupSpecs"][0]["template"], "agl-calc-trainer-worker-2")
            result = await asyncio.wait_for(task, 30)
            return result, await get(server, "NetworkPolicy", NAMES.ray_ingress)

    result, ray_policy = asyncio.run(scenario())
    assert result.outcome == "ready" and result.topology.kind == "rayjob" and result.topology.nodes == 2
    assert ("RayJob", NAMES.trainer, "created") in [(s.kind, s.name, s.action) for s in result.steps]
    # The dashboard admits the operator from the namespace it was found in, not a look-alike from anywhere.
    operator_peer = ray_policy["spec"]["ingress"][1]["from"][1]
    assert operator_peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": KUBERAY_NS}}


def test_a_rayjob_without_a_kuberay_operator_to_find_is_refused_before_anything_is_applied(tmp_path: Path) -> None:
    target = load_target(write_project(tmp_path))
    err, out, _, _ = consoles()

    async def scenario() -> Any:
        async with cluster(kuberay=True) as (server, api, _):
            del server.objects["apps/v1/deployments", KUBERAY_NS, "kuberay-operator"]
            with pytest.raises(ProvisionError) as failure:
                await asyncio.wait_for(run_provision(api, target, options(gpus=16), err, out), 30)
            return failure.value, await get(server, "ConfigMap")

    error, config_maps = asyncio.run(scenario())
    assert error.exit_code == 2 and "kuberay-operator" in error.message and "--kuberay-namespace" in str(error)
    assert config_maps == []
    # Named explicitly, it is used as given.
    manifests = dry_run(target, options(gpus=16, kuberay_namespace="kuberay")).manifests
    ray_policy = next(m for m in manifests if m["metadata"]["name"] == NAMES.ray_ingress)
    assert ray_policy["spec"]["ingress"][1]["from"][1]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "kuberay"}


def test_agl_train_routes_to_the_local_or_the_cluster_command(tmp_path: Path) -> None:
    config = write_project(tmp_path)
    runner = CliRunner()
    local = runner.invoke(_app(), [str(config), "--backend", "torch"])  # the default backend's own name
    assert local.exit_code == 0 and json.loads(local.stdout) == {"local": str(config), "backend": "embedded"}
    # --backend verl is the trainer image's command (tests/test_verl_entry.py); this spec trains no embedded model
    verl_run = runner.invoke(_app(), [str(config), "--backend", "verl", "--resume", "--dry-run"])
    assert verl_run.exit_code == 2 and "kind: embedded" in verl_run.output
    cluster_run = runner.invoke(_app(), [str(config), "--on", "kubernetes", "--dry-run", "--json"])
    assert cluster_run.exit_code == 0 and json.loads(cluster_run.stdout)["outcome"] == "dry-run"
    assert "status" in runner.invoke(_app(), ["--help"]).stdout
    usage = runner.invoke(_app(), [str(config), "--on", "kubernetes", "--gpus", "0", "--dry-run"])
    assert usage.exit_code == 2 and "--gpus must be at least 1" in usage.output


def test_the_command_module_does_not_import_the_kubernetes_client() -> None:
    code = ("import sys, agl_cli.commands.train_k8s; "
            "print(any(m == 'kubernetes' or m.startswith('kubernetes.') for m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "False"


def test_a_loopback_upstream_is_said_before_anything_is_applied(tmp_path: Path) -> None:
    local = {"local": {"kind": "openai-compatible", "base_url": "http://127.0.0.1:8000/v1"}}
    notes = dry_run(load_target(write_project(tmp_path, upstreams=local, model=None)), options()).notes
    assert any("local (http://127.0.0.1:8000/v1) names a loopback address" in note for note in notes)


def test_network_policy_in_agl_yaml_becomes_the_trains_rollout_egress_policy(tmp_path: Path) -> None:
    # The train's Role cannot create a NetworkPolicy: the provision renders the rollout pods' policy itself, aimed at
    # the gateway's pods (never at an address), and the cluster's agl.yaml asks the controller for none.
    section = {**AGL_YAML["kubernetes"], "gateway_url": "http://10.0.0.9:8090",
               "network_policy": {"dns": {"cidrs": ["169.254.20.10/32"]}}}
    result = dry_run(load_target(write_project(tmp_path, kubernetes=section)), options())
    policies = {p["metadata"]["name"]: p for p in _by_kind(result.manifests)["NetworkPolicy"]}
    egress = policies["agl-calc-rollout-egress"]["spec"]
    assert egress["podSelector"]["matchLabels"] == NAMES.component("rollout")
    assert egress["policyTypes"] == ["Ingress", "Egress"] and egress["ingress"] == []
    to_gateway, dns = egress["egress"]
    assert to_gateway == {"to": [{"podSelector": {"matchLabels": NAMES.component("gateway")}}],
                          "ports": [{"protocol": "TCP", "port": 8090}]}
    assert {"ipBlock": {"cidr": "169.254.20.10/32"}} in dns["to"]  # NodeLocal DNSCache, next to kube-dns
    config = _by_kind(result.manifests)["ConfigMap"][0]
    copied = yaml.safe_load(next(v for k, v in config["data"].items() if k.endswith("agl.yaml")))
    assert "network_policy" not in copied["kubernetes"]
    # The laptop's gateway_url means nothing in the cluster: rollouts call the deployed gateway.
    assert copied["kubernetes"]["gateway_url"] == "http://agl-calc-gateway.default.svc:8090"


def test_disruption_budgets_keep_drains_off_the_trainer_and_gateway_pods(tmp_path: Path) -> None:
    """A node drain (an upgrade, the autoscaler's scale-down) evicts nothing of a running train: each budget
    selects exactly the pods of its part, whatever the topology, and no pod of another train."""
    from rl_backend.rollout.k8s_watch import labels_match

    target = load_target(write_project(tmp_path))
    for result in (dry_run(target, options(gpus=8)), dry_run(target, options(gpus=16))):
        kinds = _by_kind(result.manifests)
        budgets = {b["metadata"]["name"]: b["spec"] for b in kinds["PodDisruptionBudget"]}
        assert set(budgets) == {NAMES.gateway, NAMES.trainer}
        assert all(b["maxUnavailable"] == 0 for b in budgets.values())
        pods = [kinds["Deployment"][0]["spec"]["template"]]
        if "Job" in kinds:
            pods.append(kinds["Job"][0]["spec"]["template"])
        else:
            cluster = kinds["RayJob"][0]["spec"]["rayClusterSpec"]
            pods += [cluster["headGroupSpec"]["template"], *[w["template"] for w in cluster["workerGroupSpecs"]]]

        def covered(budget: dict[str, Any], pod: dict[str, Any]) -> bool:
            labels = pod["metadata"]["labels"]
            selector = budget["selector"]
            return labels_match({"metadata": {"labels": labels}}, selector["matchLabels"]) and all(
                labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))

        gateway_pod, *trainer_pods = pods
        assert covered(budgets[NAMES.gateway], gateway_pod)
        assert not any(covered(budgets[NAMES.gateway], p) for p in trainer_pods)
        assert trainer_pods and all(covered(budgets[NAMES.trainer], p) for p in trainer_pods)
        assert not covered(budgets[NAMES.trainer], gateway_pod)
        other = {"metadata": {"labels": {**trainer_pods[0]["metadata"]["labels"], "agl.dev/train": "other"}}}
        assert not covered(budgets[NAMES.trainer], other)
