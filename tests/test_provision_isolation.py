"""Isolation of a train on the cluster, judged on what the provision renders: who may reach whom under its
NetworkPolicies (with Kubernetes' NetworkPolicy semantics, tests/helpers/netpol.py), the policy servers' key (a
generated Secret, only in the gateway's and the trainer's pods), and which pods hold a Kubernetes API token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_backend.provision.options import POLICY_PORTS, ProvisionError
from rl_backend.provision.session import dry_run
from rl_backend.rollout.k8s_manifest import render_job, rollout_labels
from rl_backend.rollout.k8s_spec import KubernetesSpec
from tests.helpers.k8s_rollouts import make_job
from tests.helpers.netpol import API_SERVER, INTERNET, METADATA_SERVER, Pod, allowed, policy_types
from tests.test_provision_support import NAMES, fast_schemas, load_target, options, write_project  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def _of(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def cluster_spec(manifests: list[dict[str, Any]]) -> KubernetesSpec:
    """The `kubernetes:` section of the cluster's copy of agl.yaml, as the trainer's rollout controller reads it."""
    (config,) = [c for c in _of(manifests, "ConfigMap") if c["metadata"]["name"] == NAMES.config]
    text = next(v for k, v in config["data"].items() if k.endswith("agl.yaml"))
    return KubernetesSpec.model_validate(yaml.safe_load(text)["kubernetes"])


def rollout_job(manifests: list[dict[str, Any]], root: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """A rollout Job as the trainer's controller renders it from the cluster's agl.yaml."""
    spec = cluster_spec(manifests)
    job = make_job(root, "r1-1", {"id": "t1"}, extra_env=env)
    from rl_backend.rollout.k8s_env import build_pod_env

    pod = build_pod_env(job.env, job.rollout_id, job.rollout_dir, gateway_url=spec.gateway_url, fixed_env=spec.env)
    return render_job(spec, run_id="20261201-1", rollout_id=job.rollout_id, command=job.command,
                      timeout_s=job.timeout_s, rollout_dir=job.rollout_dir, output_file=job.env["AGL_OUTPUT_FILE"],
                      job_labels=job.labels, env=pod.env, files=pod.files, withheld=pod.withheld, marker="m0",
                      base_dir=root, tail_bytes=1024)


def _pods(manifests: list[dict[str, Any]], root: Path) -> dict[str, Pod]:
    """A pod for each role, labelled as its controller labels it (Deployment, Job, KubeRay), plus strangers."""
    gateway_labels = _of(manifests, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    pods = {
        "gateway": Pod("gateway", gateway_labels, ip="10.244.0.2"),
        "rollout": Pod("rollout", rollout_job(manifests, root)["spec"]["template"]["metadata"]["labels"],
                       ip="10.244.0.3"),
        "other": Pod("other", {"app": "something-else"}, ip="10.244.0.4"),
        "same-labels-elsewhere": Pod("elsewhere", {"app.kubernetes.io/component": "rollout"}, namespace="team-b",
                                    ip="10.244.1.4"),
        "operator": Pod("operator", {"app.kubernetes.io/name": "kuberay-operator"}, namespace=OPERATOR_NS,
                        ip="10.244.2.5"),
        # Anyone may label a pod of their own namespace like the operator, or like this train's gateway.
        "spoofed-operator": Pod("spoof", {"app.kubernetes.io/name": "kuberay-operator"}, namespace="team-b",
                                ip="10.244.1.6"),
        "spoofed-gateway": Pod("spoof-gw", gateway_labels, namespace="team-b", ip="10.244.1.7"),
        "dns": Pod("coredns", {"k8s-app": "kube-dns"}, namespace="kube-system", ip="10.244.3.2"),
        "spoofed-dns": Pod("fake-dns", {"k8s-app": "kube-dns"}, namespace="team-b", ip="10.244.1.8"),
    }
    for job in _of(manifests, "Job"):
        pods["trainer"] = Pod("trainer", job["spec"]["template"]["metadata"]["labels"], ip="10.244.0.10")
    for rayjob in _of(manifests, "RayJob"):
        cluster = rayjob["spec"]["rayClusterSpec"]
        pods["head"] = Pod("head", {**cluster["headGroupSpec"]["template"]["metadata"]["labels"],
                                    "ray.io/node-type": "head"}, ip="10.244.0.11")
        pods["worker"] = Pod("worker", {**cluster["workerGroupSpecs"][0]["template"]["metadata"]["labels"],
                                        "ray.io/node-type": "worker"}, ip="10.244.0.12")
        pods["submitter"] = Pod("submitter", rayjob["spec"]["submitterPodTemplate"]["metadata"]["labels"],
                                ip="10.244.0.13")
    return pods


OPERATOR_NS = "ray-system"
# Ray's own listeners on a policy host: GCS, raylet (node manager), object manager, dashboard agent (HTTP, gRPC),
# metrics export, runtime-env agent, Ray client, a core worker's gRPC port.
RAY_PORTS = (6379, 6380, 6381, 52365, 52366, 8080, 52367, 10001, 10002, 19999)


def test_only_the_gateway_reaches_the_policy_and_only_rollouts_and_the_trainer_reach_the_gateway(
        tmp_path: Path) -> None:
    manifests = dry_run(load_target(write_project(tmp_path)), options(gpus=8)).manifests
    policies = _of(manifests, "NetworkPolicy")
    pods = _pods(manifests, tmp_path)
    gateway, trainer = pods["gateway"], pods["trainer"]
    assert allowed(policies, pods["rollout"], gateway, 8090)
    assert allowed(policies, trainer, gateway, 8090)  # the driver registers rollouts and its policy servers
    for stranger in ("other", "same-labels-elsewhere", "operator"):
        assert not allowed(policies, pods[stranger], gateway, 8090), stranger
    assert not allowed(policies, pods["rollout"], gateway, 9999)
    # The policy servers listen on ports the OS picks from the pod's ephemeral range, which the pod pins: the
    # gateway reaches that range, nobody else any port, and a pod labelled like the gateway elsewhere nothing.
    low, high = POLICY_PORTS
    for port in (low, (low + high) // 2, high):
        assert allowed(policies, gateway, trainer, port)
        for other in ("rollout", "other", "same-labels-elsewhere", "spoofed-gateway"):
            assert not allowed(policies, pods[other], trainer, port), (other, port)
    # ...and not the trainer's other listeners (its Ray, a debugger, a metrics port).
    for port in (*RAY_PORTS, 8000, 8265, low - 1, high + 1):
        assert not allowed(policies, gateway, trainer, port), port


def test_nothing_outside_the_ray_cluster_reaches_it(tmp_path: Path) -> None:
    manifests = dry_run(load_target(write_project(tmp_path)), options(gpus=16, nodes=2,
                                                                             kuberay_namespace=OPERATOR_NS)).manifests
    policies = _of(manifests, "NetworkPolicy")
    pods = _pods(manifests, tmp_path)
    head, worker = pods["head"], pods["worker"]
    # Ray's own traffic: GCS, raylets, object store, NCCL, any port, both ways.
    assert allowed(policies, worker, head, 6379) and allowed(policies, head, worker, 45678)
    assert allowed(policies, worker, worker, 29500)
    # Job submission and status: the submitter and the KubeRay operator, on the dashboard's port only.
    assert allowed(policies, pods["submitter"], head, 8265) and allowed(policies, pods["operator"], head, 8265)
    assert not allowed(policies, pods["operator"], head, 6379) and not allowed(policies, pods["submitter"], head, 10001)
    for stranger in ("rollout", "gateway", "other", "same-labels-elsewhere", "spoofed-operator"):
        for port in (8265, 6379, 10001):
            assert not allowed(policies, pods[stranger], head, port), (stranger, port)
    # The policy servers live on the GPU workers: the gateway reaches them there, and not the head.
    low, _ = POLICY_PORTS
    assert allowed(policies, pods["gateway"], worker, low)
    assert not allowed(policies, pods["gateway"], head, low)
    assert not allowed(policies, pods["rollout"], worker, low)
    # Ray's GCS, raylets, dashboard agent and workers: never from the gateway (Ray has no authentication).
    for port in RAY_PORTS:
        assert not allowed(policies, pods["gateway"], worker, port), port
        assert not allowed(policies, pods["gateway"], head, port), port
    assert allowed(policies, head, pods["gateway"], 8090) and allowed(policies, worker, pods["gateway"], 8090)


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env") or []}


def _containers(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for manifest in manifests:
        if manifest["kind"] in ("Deployment", "Job"):
            found[manifest["kind"]] = manifest["spec"]["template"]["spec"]["containers"][0]
        if manifest["kind"] == "RayJob":
            cluster = manifest["spec"]["rayClusterSpec"]
            found["head"] = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
            found["worker"] = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
            found["submitter"] = manifest["spec"]["submitterPodTemplate"]["spec"]["containers"][0]
    return found


@pytest.mark.parametrize("extra", [{"gpus": 1}, {"gpus": 16, "nodes": 2}])
def test_the_policy_servers_key_is_generated_and_reaches_the_gateway_and_trainer_only(
        tmp_path: Path, extra: dict[str, Any]) -> None:
    manifests = dry_run(load_target(write_project(tmp_path)), options(**extra)).manifests
    secret = next(s for s in _of(manifests, "Secret") if s["metadata"]["name"] == NAMES.policy_key)
    assert secret["stringData"]["token"].startswith("(random")  # generated when applied, never printed
    reference = {"secretKeyRef": {"name": NAMES.policy_key, "key": "token"}}
    containers = _containers(manifests)
    holders = {name for name, c in containers.items() if _env(c).get("AGL_POLICY_API_KEY", {}).get("valueFrom")
               == reference}
    assert holders == ({"Deployment", "Job"} if "Job" in containers else {"Deployment", "head", "worker"})
    # A rollout's pod never gets it, even when it sits in the trainer's environment.
    job = rollout_job(manifests, tmp_path, {"AGL_POLICY_API_KEY": "policy-key-0123456789",
                                            "AGL_GATEWAY_ADMIN_TOKEN": "admin-token-0123456789"})
    text = json.dumps(job)
    assert "policy-key-0123456789" not in text and "admin-token-0123456789" not in text
    # No policy Service and no fixed policy URL (the trainer registers its servers' addresses), no runtime LoRA
    # loading over HTTP (verl moves weights through its Ray actors).
    everything = json.dumps(manifests)
    assert "AGL_POLICY_URL" not in everything and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in everything
    assert [s["metadata"]["name"] for s in _of(manifests, "Service")] == [NAMES.gateway]


def _pod_specs(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for manifest in manifests:
        if manifest["kind"] in ("Deployment", "Job"):
            found[manifest["kind"]] = manifest["spec"]["template"]["spec"]
        if manifest["kind"] == "RayJob":
            cluster = manifest["spec"]["rayClusterSpec"]
            found["head"] = cluster["headGroupSpec"]["template"]["spec"]
            found["worker"] = cluster["workerGroupSpecs"][0]["template"]["spec"]
            found["submitter"] = manifest["spec"]["submitterPodTemplate"]["spec"]
    return found


def _token_volumes(pod: dict[str, Any]) -> set[str]:
    return {v["name"] for v in pod.get("volumes") or []
            if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources", []))}


@pytest.mark.parametrize("extra", [{"gpus": 1}, {"gpus": 16, "nodes": 2}])
def test_only_the_rollout_controllers_container_holds_an_api_token(tmp_path: Path, extra: dict[str, Any]) -> None:
    manifests = dry_run(load_target(write_project(tmp_path)), options(**extra)).manifests
    pods = _pod_specs(manifests)
    # No pod mounts a token pod-wide: every container of it (a grader's too) would read it.
    assert all(pod["automountServiceAccountToken"] is False for pod in pods.values()), pods.keys()
    holders = set()
    for role, pod in pods.items():
        tokens = _token_volumes(pod)
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            if {m["name"] for m in container.get("volumeMounts", [])} & tokens:
                mount = next(m for m in container["volumeMounts"] if m["name"] in tokens)
                # Where the Kubernetes client finds in-cluster credentials (token, ca.crt, namespace).
                assert mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount" and mount["readOnly"]
                holders.add((role, container["name"]))
    assert holders == ({("Job", "trainer")} if "Job" in pods else {("head", "ray-head")})
    controller = pods["Job"] if "Job" in pods else pods["head"]
    assert controller["serviceAccountName"] == NAMES.controller
    # ...and that pod runs no agent: every rollout is a Job of its own, which gets no token either.
    assert cluster_spec(manifests).model_dump()["project"]["config_map"] == NAMES.config
    copied = yaml.safe_load(next(v for k, v in _of(manifests, "ConfigMap")[0]["data"].items()
                                 if k.endswith("agl.yaml")))
    assert copied["runner"] == "kubernetes"
    assert rollout_job(manifests, tmp_path)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("extra", [{"gpus": 1}, {"gpus": 16, "nodes": 2}])
def test_graders_run_in_a_container_of_their_own_without_the_controllers_credentials(
        tmp_path: Path, extra: dict[str, Any]) -> None:
    from agl_cli.evaluation.grade_channel import GRADER_DIR_ENV
    from rl_backend.provision.plan import GRADER_UID, UID

    manifests = dry_run(load_target(write_project(tmp_path)), options(**extra)).manifests
    pods = _pod_specs(manifests)
    role = "Job" if "Job" in pods else "head"
    pod = pods[role]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (grader,) = [c for c in pod["initContainers"] if c["name"] == "grader"]
    (controller,) = pod["containers"]
    # The rollouts' image: the tools the agent's work is checked with (docker/README.md).
    assert grader["image"] == rollout_job(manifests, tmp_path)["spec"]["template"]["spec"]["containers"][0]["image"]
    # A native sidecar: up before the controller, ended with it (a Job's pod completes).
    assert grader["restartPolicy"] == "Always"
    assert grader["command"][:3] == ["python", "-m", "agl_cli.evaluation.grade_server"]
    # Its own non-root uid, not the controller's (the pod's), no way to gain privileges.
    security = grader["securityContext"]
    assert security["runAsUser"] == GRADER_UID != UID == pod["securityContext"]["runAsUser"]
    assert security["runAsNonRoot"] and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod.get("shareProcessNamespace") is False  # the controller's processes are not in its /proc
    # Nothing secret in its environment (no Secret reference, no value from the pod), none on its volumes.
    assert "envFrom" not in grader
    assert all("valueFrom" not in e for e in grader["env"]), grader["env"]
    assert not {"AGL_GATEWAY_ADMIN_TOKEN", "AGL_POLICY_API_KEY"} & {e["name"] for e in grader["env"]}
    mounted = {m["name"]: m for m in grader["volumeMounts"]}
    assert set(mounted) == {"project", "grader", "grader-tmp"}
    assert mounted["project"]["readOnly"] is True and "configMap" in volumes["project"]
    assert "emptyDir" in volumes["grader"] and "emptyDir" in volumes["grader-tmp"]
    # The one thing it shares with the controller: the grader emptyDir, at the path the controller is told.
    shared = next(m["mountPath"] for m in controller["volumeMounts"] if m["name"] == "grader")
    assert _env(controller)[GRADER_DIR_ENV]["value"] == shared == mounted["grader"]["mountPath"]
    assert shared in grader["command"]
    # The ConfigMap it reads holds no key (the Secrets are separate objects, given by reference).
    config = _of(manifests, "ConfigMap")[0]
    assert not {"AGL_GATEWAY_ADMIN_TOKEN", "AGL_POLICY_API_KEY", "token"} & set(config.get("data", {}))
    if role == "head":
        # The head's Ray requires a token, which KubeRay 1.7 gives only to the Ray container (containers[0]), an init
        # container named wait-gcs-ready and the submitter (configureTokenAuth): never to the grader container.
        (rayjob,) = _of(manifests, "RayJob")
        assert rayjob["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}
        assert pod["containers"][0]["name"] == "ray-head" and grader["name"] != "wait-gcs-ready"
    # Pods where no controller runs have no grader container (the GPU workers, the gateway, the submitter).
    others = [name for name, spec in pods.items() if name != role and spec.get("initContainers")]
    assert not any(c["name"] == "grader" for name in others for c in pods[name]["initContainers"])


def test_rollout_labels_match_the_gateway_policy(tmp_path: Path) -> None:
    # The rollout Job's labels come from the cluster's agl.yaml: the train's label must be among them.
    manifests = dry_run(load_target(write_project(tmp_path)), options()).manifests
    labels = rollout_labels(cluster_spec(manifests), "run", "r1", {})
    assert labels["agl.dev/train"] == "calc" and labels["app.kubernetes.io/component"] == "rollout"


def test_the_evaluator_reads_policies_as_kubernetes_does() -> None:
    # policyTypes unset: Ingress, plus Egress because there are egress rules (the API server's defaulting).
    deny = {"metadata": {"name": "p", "namespace": "default"},
            "spec": {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8",
                                                                        "except": ["10.9.0.0/16"]}}]}]}}
    assert policy_types(deny) == ["Ingress", "Egress"]
    pod, peer = Pod("a", {}, ip="10.1.0.1"), Pod("b", {}, ip="10.9.0.1")
    assert not allowed([deny], pod, METADATA_SERVER, 80)
    assert allowed([deny], pod, Pod("c", {}, namespace="x", ip="10.2.0.1"), 80)  # no policy guards c's ingress
    assert not allowed([deny], pod, peer, 80)  # except carves it out (and ingress is denied at b anyway)
    open_ingress = {**deny, "spec": {**deny["spec"], "ingress": [{}]}}
    assert allowed([open_ingress], pod, Pod("c", {}, ip="10.2.0.1"), 80)
    assert not allowed([open_ingress], pod, Pod("c", {}, ip="10.9.0.2"), 80)
    assert not allowed([open_ingress], pod, INTERNET, 443)



@pytest.mark.parametrize("extra", [{"gpus": 1}, {"gpus": 16, "nodes": 2}])
def test_rollout_pods_reach_only_dns_and_the_gateway_by_default(tmp_path: Path, extra: dict[str, Any]) -> None:
    # agl.yaml says nothing about network policies: the rollout pods (untrusted agent code) are still closed in.
    manifests = dry_run(load_target(write_project(tmp_path)), options(**extra)).manifests
    policies = _of(manifests, "NetworkPolicy")
    pods = _pods(manifests, tmp_path)
    rollout = pods["rollout"]
    assert allowed(policies, rollout, pods["gateway"], 8090)
    assert allowed(policies, rollout, pods["dns"], 53, "UDP") and allowed(policies, rollout, pods["dns"], 53)
    assert not allowed(policies, rollout, pods["spoofed-dns"], 53, "UDP")
    assert not allowed(policies, rollout, pods["spoofed-gateway"], 8090)
    for target, port in ((METADATA_SERVER, 80), (API_SERVER, 443), (API_SERVER, 6443), (INTERNET, 443)):
        assert not allowed(policies, rollout, target, port), target.name
    for name in ("other", "same-labels-elsewhere", "operator", *(k for k in ("trainer", "head", "worker")
                                                                 if k in pods)):
        for port in (80, 8000, 8265, 6379, *POLICY_PORTS):
            assert not allowed(policies, rollout, pods[name], port), (name, port)


def test_network_policy_in_agl_yaml_opens_what_it_says_and_nothing_more(tmp_path: Path) -> None:
    from tests.test_provision_support import AGL_YAML

    def plan(policy: Any) -> Any:
        section = {**AGL_YAML["kubernetes"], "network_policy": policy}
        return dry_run(load_target(write_project(tmp_path, kubernetes=section)), options())

    # `{}` is accepted (it used to be refused for want of a gateway address): the defaults, the train's gateway.
    closed = plan({})
    assert [p["metadata"]["name"] for p in _of(closed.manifests, "NetworkPolicy")][-1] == NAMES.rollout_egress
    mirror = Pod("mirror", {}, namespace="", ip="10.8.1.1", external=True)
    opened = plan({"allow_egress": [{"to": [{"ipBlock": {"cidr": "10.8.0.0/16"}}], "ports": [{"port": 443}]}]})
    policies = _of(opened.manifests, "NetworkPolicy")
    rollout = _pods(opened.manifests, tmp_path)["rollout"]
    assert allowed(policies, rollout, mirror, 443)
    assert not allowed(policies, rollout, mirror, 22) and not allowed(policies, rollout, METADATA_SERVER, 80)
    assert not allowed(_of(closed.manifests, "NetworkPolicy"), rollout, mirror, 443)
    # Switched off: no policy, and the plan says what that leaves open.
    off = plan({"enabled": False})
    assert NAMES.rollout_egress not in [p["metadata"]["name"] for p in _of(off.manifests, "NetworkPolicy")]
    assert any("metadata server" in note for note in off.notes)
    # A rule Kubernetes would refuse is refused before anything is applied, naming the policy.
    with pytest.raises(ProvisionError, match=f"NetworkPolicy/{NAMES.rollout_egress}") as bad:
        plan({"allow_egress": [{"to": [{"ipBlock": {"cidr": 10}}]}]})
    assert bad.value.exit_code == 2


@pytest.mark.parametrize("extra", [{"gpus": 1}, {"gpus": 16, "nodes": 2}])
def test_volumes_are_not_rechowned_at_every_pod_start(tmp_path: Path, extra: dict[str, Any]) -> None:
    # fsGroup alone makes the kubelet chown every file of the 200 GiB checkpoint volume at each pod start (minutes
    # on a restart); OnRootMismatch does it once, when the volume's root is not the group's yet.
    manifests = dry_run(load_target(write_project(tmp_path)), options(**extra)).manifests
    pod_specs = [rollout_job(manifests, tmp_path)["spec"]["template"]["spec"]]
    for manifest in manifests:
        if manifest["kind"] in ("Deployment", "Job"):
            pod_specs.append(manifest["spec"]["template"]["spec"])
        if manifest["kind"] == "RayJob":
            cluster = manifest["spec"]["rayClusterSpec"]
            pod_specs += [cluster["headGroupSpec"]["template"]["spec"],
                          cluster["workerGroupSpecs"][0]["template"]["spec"]]
    with_fs_group = [s["securityContext"] for s in pod_specs if "fsGroup" in s.get("securityContext", {})]
    assert len(with_fs_group) == len(pod_specs)
    assert all(c.get("fsGroupChangePolicy") == "OnRootMismatch" for c in with_fs_group), with_fs_group


def test_the_gateway_listens_on_every_address_of_its_pod_ipv6_included(tmp_path: Path) -> None:
    # A dual-stack pod has an IPv4 and an IPv6 address; rollouts may resolve the gateway's Service to either. The
    # gateway learns both from the downward API ($POD_IPS) and listens on each, never on 0.0.0.0.
    from rl_backend.gateway.listen import pod_hosts

    manifests = dry_run(load_target(write_project(tmp_path)), options()).manifests
    container = _of(manifests, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    env = _env(container)
    assert env["POD_IPS"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIPs"}}
    hosts = pod_hosts({"POD_IPS": "10.244.0.2,fd00:10:244::2"}, resolve=lambda _: [])
    assert hosts[:2] == ["10.244.0.2", "fd00:10:244::2"] and "0.0.0.0" not in hosts and "::" not in hosts
    assert "--in-cluster" in container["command"]


def test_an_executable_shipped_file_stays_executable_in_every_pod(tmp_path: Path) -> None:
    # A ConfigMap volume makes files 0644 unless an item says otherwise: `./agent.sh` would fail with "permission
    # denied" in the rollout pods (and the trainer's, for a grader script).
    config = write_project(tmp_path, agent={"command": "./agent.sh {task_file} {output_file}", "timeout_s": 60},
                           runner="local", kubernetes=None)  # no agent image: the agent's files are shipped
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\necho hi > \"$2\"\n")
    script.chmod(0o755)
    manifests = dry_run(load_target(config), options()).manifests
    job = rollout_job(manifests, tmp_path)
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    items = next(v["configMap"]["items"] for v in volumes.values() if "configMap" in v)
    by_path = {i["path"]: i for i in items}
    assert by_path["agent.sh"].get("mode") == 0o555
    assert "mode" not in by_path["agl.yaml"]  # the rest stays read-only, as the volume's default says
    trainer = _of(manifests, "Job")[0]["spec"]["template"]["spec"]
    project = next(v for v in trainer["volumes"] if v["name"] == "project")
    assert {i["path"]: i.get("mode") for i in project["configMap"]["items"]}["agent.sh"] == 0o555
    with pytest.raises(ValueError, match="mode"):
        KubernetesSpec.model_validate({**cluster_spec(manifests).model_dump(), "project": {
            "config_map": "c", "items": [{"key": "k", "path": "a.sh", "mode": 0o4755}]}})


def test_the_templates_agl_yaml_names_reach_the_cluster(tmp_path: Path) -> None:
    from tests.test_provision_support import AGL_YAML

    (tmp_path / "k8s").mkdir()
    from rl_backend.rollout.k8s_manifest import templates_dir

    job_text = (templates_dir() / "k8s" / "job.yaml.j2").read_text()
    (tmp_path / "k8s" / "my-job.yaml.j2").write_text(job_text.replace("spec:\n", "spec:\n  # custom\n", 1))
    policy_text = (templates_dir() / "k8s" / "networkpolicy.yaml.j2").read_text()
    (tmp_path / "k8s" / "my-policy.yaml.j2").write_text(
        policy_text.replace("  labels: {{ labels | json }}", "  labels: {{ dict(labels, team='rl') | json }}"))
    section = {**AGL_YAML["kubernetes"], "job_template": "k8s/my-job.yaml.j2",
               "network_policy": {"template": "k8s/my-policy.yaml.j2"}}
    manifests = dry_run(load_target(write_project(tmp_path, kubernetes=section)), options()).manifests
    # The rollout controller in the trainer's pod reads the Job template next to the cluster's agl.yaml: shipped.
    config = _of(manifests, "ConfigMap")[0]
    shipped = {i["path"]: config["data"][i["key"]] for i in config_items(manifests)}
    assert shipped["k8s/my-job.yaml.j2"] == (tmp_path / "k8s" / "my-job.yaml.j2").read_text()
    assert cluster_spec(manifests).job_template == "k8s/my-job.yaml.j2"
    # The provision renders the rollout pods' policy itself: from the user's template, not silently from agl's.
    egress = next(p for p in _of(manifests, "NetworkPolicy") if p["metadata"]["name"] == NAMES.rollout_egress)
    assert egress["metadata"]["labels"]["team"] == "rl"
    section["job_template"] = "k8s/missing.yaml.j2"
    with pytest.raises(ProvisionError, match="missing.yaml.j2") as missing:
        dry_run(load_target(write_project(tmp_path, kubernetes=section)), options())
    assert missing.value.exit_code == 2


def config_items(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    job = _of(manifests, "Job")[0]["spec"]["template"]["spec"]
    return next(v for v in job["volumes"] if v["name"] == "project")["configMap"]["items"]


def test_the_one_node_jobs_own_ray_listens_outside_the_ports_opened_to_the_gateway(tmp_path: Path) -> None:
    # ray.init would take Ray's listeners from the pod's ephemeral range, which is the policy servers' range, the
    # one the gateway may reach: the Job's trainer starts its head with every `ray start` port option pinned.
    from ray.scripts.scripts import start

    from rl_backend.trainer.verl_backend.ray_head import pinned_ports, start_args

    manifests = dry_run(load_target(write_project(tmp_path)), options(gpus=1)).manifests
    trainer = _of(manifests, "Job")[0]["spec"]["template"]["spec"]["containers"][0]
    ports = pinned_ports({"AGL_RAY_HEAD_PORTS": _env(trainer)["AGL_RAY_HEAD_PORTS"]["value"]})
    assert ports is not None
    # Every port option of the installed Ray's `ray start` is pinned, but the alternatives to those given.
    options_of_ray = {p.opts[0].lstrip("-") for p in start.params if "port" in p.name}
    assert options_of_ray - set(ports) == {"redis-shard-ports", "worker-port-list"}, options_of_ray - set(ports)
    # The installed Ray parses what the trainer runs (a renamed flag would fail here, not in the pod).
    parsed = start.make_context("start", start_args(ports, 8)[1:]).params
    assert parsed["head"] and parsed["include_dashboard"] is False and parsed["num_cpus"] == 8
    low, high = POLICY_PORTS
    numbers = {flag: int(value) for flag, value in ports.items()}
    assert all(not low <= n <= high for n in numbers.values()), numbers
    assert numbers["max-worker-port"] < low or numbers["min-worker-port"] > high  # the workers' whole range
    assert parsed["port"] == numbers["port"] and parsed["min_worker_port"] == numbers["min-worker-port"]
    # ...and none of them is open to the gateway (nor to anyone else) under the rendered policies.
    policies = _of(manifests, "NetworkPolicy")
    pods = _pods(manifests, tmp_path)
    for port in (*numbers.values(), numbers["min-worker-port"] + 1):
        for who in ("gateway", "rollout", "other"):
            assert not allowed(policies, pods[who], pods["trainer"], port), (who, port)
    assert allowed(policies, pods["gateway"], pods["trainer"], low)
    # A local train (no such variable) starts Ray through ray.init, as before; a broken one is named.
    assert pinned_ports({}) is None
    from rl_backend.trainer.verl_backend.ray_head import RayHeadError

    for broken in ("{6379", '{"port": "x"}', "[6379]"):
        with pytest.raises(RayHeadError, match=r"\$AGL_RAY_HEAD_PORTS"):
            pinned_ports({"AGL_RAY_HEAD_PORTS": broken})
