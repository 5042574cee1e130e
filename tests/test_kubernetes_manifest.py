"""Kubernetes manifests without a cluster: names, the env allow-list (no upstream key or admin token ever reaches a
manifest), schema validation of every rendered Job and NetworkPolicy, user templates, and the wrapper script's
output block read back by the log parser (the script run here with sh, as a container would)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rl_backend.netaddr import is_own_address
from rl_backend.rollout.k8s_env import PodEnvError, UnreachableGatewayError, build_pod_env, pod_env
from rl_backend.rollout.k8s_manifest import (
    LABEL_ROLLOUT,
    LABEL_RUN,
    LABEL_VARIANT,
    ManifestError,
    check_no_leak,
    job_name,
    label_value,
    render_job,
    render_policy,
    templates_dir,
    validate_schema,
)
from rl_backend.rollout.k8s_output import LogReader
from rl_backend.rollout.k8s_spec import KubernetesSpec
from rl_backend.rollout.k8s_watch import TokenBucket
from tests.helpers.k8s_rollouts import ADMIN_TOKEN, TOKEN, UPSTREAM_KEY, make_job, write_agent

RUN = "20261130-080000-ab12"


def _spec(**overrides: Any) -> KubernetesSpec:
    return KubernetesSpec.model_validate({"image": "agent:1", "gateway_url": "http://10.1.2.3:8400", **overrides})


def _render(spec: KubernetesSpec, job: Any, *, pass_env: tuple[str, ...] = (), deny: tuple[str, ...] = (),
            marker: str = "m0123456789abcdef") -> dict[str, Any]:
    pod = build_pod_env(job.env, job.rollout_id, job.rollout_dir, gateway_url=spec.gateway_url, fixed_env=spec.env,
                        pass_env=[*spec.pass_env, *pass_env], deny_env=deny)
    manifest = render_job(
        spec, run_id=RUN, rollout_id=job.rollout_id, command=job.command, timeout_s=job.timeout_s,
        rollout_dir=job.rollout_dir, output_file=job.env.get("AGL_OUTPUT_FILE"), job_labels=job.labels,
        env=pod.env, files=pod.files, withheld=pod.withheld, marker=marker, base_dir=Path("."), tail_bytes=4096,
    )
    validate_schema(manifest, "1.30")  # every manifest a test renders is checked against the schema again
    return manifest


def _container(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["template"]["spec"]["containers"][0]


def test_names_are_deterministic_short_and_valid() -> None:
    assert job_name(RUN, "r0123456789ab-1") == job_name(RUN, "r0123456789ab-1")
    assert job_name(RUN, "r0123456789ab-1") != job_name("another-run", "r0123456789ab-1")
    odd = job_name(RUN, "Weird_ID/with spaces and a very long tail " * 3)
    assert len(odd) <= 52 and odd == odd.lower() and odd[0].isalnum() and odd[-1].isalnum()
    assert label_value("temperature=0.7,model=openai/gpt-4.1-mini") != label_value("temperature=0.7")
    for value in ["base", "a" * 80, "x=1,y=2", "-lead", "ü"]:
        sanitized = label_value(value)
        assert len(sanitized) <= 63 and (not sanitized or sanitized[0].isalnum() and sanitized[-1].isalnum())


def test_env_allow_list_keeps_the_rollouts_own_variables_only(tmp_path: Path) -> None:
    job = make_job(tmp_path, "r1-1", {"id": "t1"})
    kept, withheld = pod_env(job.env, "r1-1", gateway_url="http://10.1.2.3:8400", deny_env={"UPSTREAM_KEY_ENV"})
    assert kept["OPENAI_BASE_URL"] == "http://10.1.2.3:8400/rollouts/r1-1/openai/v1"
    assert kept["ANTHROPIC_BASE_URL"] == "http://10.1.2.3:8400/rollouts/r1-1/anthropic"
    assert kept["AGL_REWARD_URL"] == "http://10.1.2.3:8400/rollouts/r1-1/reward"
    assert kept["OPENAI_API_KEY"] == kept["ANTHROPIC_API_KEY"] == TOKEN  # the scoped token
    assert kept["AGL_ROLLOUT_ID"] == "r1-1"
    for gone in ["PATH", "HOME", "UPSTREAM_KEY_ENV", "AGL_ADMIN_TOKEN", "AGL_HOME", "AGENT_MAX_TURNS"]:
        assert gone not in kept
    assert UPSTREAM_KEY in withheld and ADMIN_TOKEN in withheld
    kept, _ = pod_env(job.env, "r1-1", gateway_url="http://10.1.2.3:8400", pass_env=["AGENT_*", "*"])
    assert kept["AGENT_MAX_TURNS"] == "4"
    assert "AGL_ADMIN_TOKEN" not in kept and "UPSTREAM_KEY_ENV" not in kept and "PATH" not in kept


@pytest.mark.parametrize("case", ["api_key_env", "real_key_without_gateway", "glob_everything"])
def test_an_upstream_key_never_reaches_the_manifest(tmp_path: Path, case: str) -> None:
    extra: dict[str, str] = {}
    pass_env: tuple[str, ...] = ()
    if case == "real_key_without_gateway":
        # No gateway for this rollout: OPENAI_API_KEY is the user's real key and the base URL is the vendor's.
        extra = {"OPENAI_API_KEY": UPSTREAM_KEY, "OPENAI_BASE_URL": "https://api.openai.com/v1"}
    if case == "glob_everything":
        pass_env = ("*",)
    job = make_job(tmp_path, "r2-1", {"id": "t"}, extra_env=extra)
    manifest = _render(_spec(), job, pass_env=pass_env, deny=("UPSTREAM_KEY_ENV",))
    text = json.dumps(manifest)
    assert UPSTREAM_KEY not in text and ADMIN_TOKEN not in text
    names = {e["name"] for e in _container(manifest)["env"]}
    assert "UPSTREAM_KEY_ENV" not in names and "AGL_ADMIN_TOKEN" not in names
    if case == "real_key_without_gateway":
        assert "OPENAI_API_KEY" not in names
    # And whatever template rendered it, a withheld value found in a manifest stops the submission.
    with pytest.raises(ManifestError, match="secret"):
        check_no_leak({"spec": {"x": f"prefix {UPSTREAM_KEY}"}}, [UPSTREAM_KEY])


def test_a_gateway_on_loopback_needs_gateway_url(tmp_path: Path) -> None:
    job = make_job(tmp_path, "r3-1", {"id": "t"})
    with pytest.raises(UnreachableGatewayError, match="gateway_url"):
        pod_env(job.env, "r3-1", gateway_url=None)


def test_a_task_file_too_big_for_an_env_var_is_refused(tmp_path: Path) -> None:
    job = make_job(tmp_path, "r4-1", {"id": "t", "blob": "x" * 200_000})
    with pytest.raises(PodEnvError, match="at most"):
        build_pod_env(job.env, "r4-1", job.rollout_dir, gateway_url="http://10.1.2.3:8400", fixed_env={})


def test_the_job_manifest_has_agls_invariants_and_a_restrictive_pod(tmp_path: Path) -> None:
    spec = _spec(resources={"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
                 env={"HOME": "/tmp"}, ttl_seconds_after_finished=120, workdir="/app")
    job = make_job(tmp_path, "r5-1", {"id": "t5"}, timeout_s=42.5, variant="temperature=0.7")
    manifest = _render(spec, job)
    meta, job_spec = manifest["metadata"], manifest["spec"]
    pod = job_spec["template"]["spec"]
    container = _container(manifest)
    assert meta["name"] == job_name(RUN, "r5-1")
    for labels in (meta["labels"], job_spec["template"]["metadata"]["labels"]):
        assert labels[LABEL_RUN] == RUN and labels[LABEL_ROLLOUT] == "r5-1"
        assert labels[LABEL_VARIANT] == label_value("temperature=0.7")
    assert meta["annotations"]["agl.dev/variant"] == "temperature=0.7"
    assert job_spec["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert job_spec["activeDeadlineSeconds"] == math.ceil(42.5 + spec.startup_allowance_s + spec.unschedulable_after_s)
    assert job_spec["ttlSecondsAfterFinished"] == 120
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]} and security["runAsNonRoot"] is True
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    assert container["workingDir"] == "/app"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"tmp": "/tmp", "work": str(job.rollout_dir)}
    assert all("emptyDir" in v for v in pod["volumes"])
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["HOME"] == "/tmp" and env["OPENAI_API_KEY"] == TOKEN
    assert any(name.startswith("AGL_FILE_") for name in env)  # the task file travels in the Job
    script = container["command"][2]
    assert sys.executable not in script and "python agent.py" in script  # {python} became the image's python


def test_invalid_manifests_are_refused_before_submission(tmp_path: Path) -> None:
    job = make_job(tmp_path, "r6-1", {"id": "t"})
    with pytest.raises(ManifestError, match="not valid for Kubernetes"):
        _render(_spec(tolerations=[{"key": "gpu", "operator": "Exists", "bogus": True}]), job)
    with pytest.raises(ValidationError):
        _spec(resources={"requests": {"cpu": "lots"}})


def test_a_users_own_template_replaces_the_default_but_not_the_invariants(tmp_path: Path) -> None:
    default = (templates_dir() / "k8s" / "job.yaml.j2").read_text()
    job = make_job(tmp_path, "r7-1", {"id": "t"})
    custom = tmp_path / "my-job.yaml.j2"
    custom.write_text(default.replace("  annotations: {{ annotations | json }}\nspec:",
                                      '  annotations: {"team": "research"}\nspec:'))
    manifest = _render(_spec(job_template=str(custom)), job)
    assert manifest["metadata"]["annotations"] == {"team": "research"}
    custom.write_text(default.replace("backoffLimit: 0", "backoffLimit: 3"))
    with pytest.raises(ManifestError, match="backoffLimit"):
        _render(_spec(job_template=str(custom)), job)
    custom.write_text(default.replace("labels: {{ labels | json }}", 'labels: {"app": "x"}'))
    with pytest.raises(ManifestError, match="agl.dev/run"):
        _render(_spec(job_template=str(custom)), job)


def test_the_network_policy_admits_only_the_gateway_and_dns() -> None:
    policy = render_policy(_spec(network_policy={}), RUN, Path("."))
    assert policy["spec"]["podSelector"] == {"matchLabels": {LABEL_RUN: RUN}}
    assert policy["spec"]["ingress"] == [] and set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    gateway, dns = policy["spec"]["egress"]
    assert gateway == {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}], "ports": [{"protocol": "TCP", "port": 8400}]}
    assert {p["port"] for p in dns["ports"]} == {53}
    in_cluster = render_policy(_spec(gateway_url="http://agl-gateway.agl:8400", network_policy={
        "gateway_pod_selector": {"app": "agl-gateway"}, "gateway_namespace_selector": {"name": "agl"}}), RUN, Path("."))
    assert in_cluster["spec"]["egress"][0]["to"] == [
        {"podSelector": {"matchLabels": {"app": "agl-gateway"}}, "namespaceSelector": {"matchLabels": {"name": "agl"}}}]
    with pytest.raises(ValidationError, match="gateway's address"):
        _spec(gateway_url="http://gateway.example:8400", network_policy={})


@pytest.mark.skipif(not all(shutil.which(t) for t in ("sh", "base64", "tee", "tail", "head", "wc")),
                    reason="needs a POSIX shell and coreutils")
@pytest.mark.parametrize("task", [{"id": "ok", "answer": 42}, {"id": "bad", "fail": 3, "write": False}])
def test_the_wrapper_prints_a_block_the_log_reader_reads_back(tmp_path: Path, task: dict[str, Any]) -> None:
    job = make_job(tmp_path / "host", "r8-1", task)
    manifest = _render(_spec(), job)
    container = _container(manifest)
    env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin",
           **{e["name"]: e["value"] for e in container["env"]}}
    image = write_agent(tmp_path / "image")
    shutil.rmtree(job.rollout_dir)  # the pod's folder starts empty (an emptyDir); the wrapper recreates the task
    done = subprocess.run(container["command"], env=env, cwd=image, capture_output=True, timeout=30)
    reader = LogReader("m0123456789abcdef", 4096, 1 << 20)
    for i in range(0, len(done.stdout), 7):  # chunk boundaries anywhere
        reader.feed(done.stdout[i:i + 7])
    out = reader.result()
    assert out.complete and out.exit_code == done.returncode == task.get("fail", 0)
    assert "agent starting" in out.log_tail and "AGL-" not in out.log_tail
    assert out.stderr is not None and "agent note on stderr" in out.stderr
    if task.get("fail"):
        assert out.output is None and out.stderr.rstrip().endswith("Traceback: the agent gave up")
    else:
        written = json.loads(out.output or b"")
        assert written["answer"] == 42 and written["seen"]["OPENAI_API_KEY"] == TOKEN
        assert written["seen"]["UPSTREAM_KEY_ENV"] is None and written["seen"]["AGL_ADMIN_TOKEN"] is None
        assert out.output_size == len(out.output or b"")


def test_the_log_reader_ignores_foreign_markers_and_reports_broken_blocks() -> None:
    import base64

    def block(marker: str, output: bytes, code: int) -> bytes:
        b64 = base64.b64encode(output).decode()
        return (f"AGL-{marker} begin\nAGL-{marker} stderr 0\nAGL-{marker} output {len(output)}\n{b64}\n"
                f"AGL-{marker} exit {code}\nAGL-{marker} end\n").encode()

    reader = LogReader("mine", 1024, 1 << 16)
    reader.feed(b"hello\n" + block("spoof", b"fake", 0) + block("mine", b"real", 0) + b"trailing")
    out = reader.result()
    assert out.output == b"real" and out.exit_code == 0 and "AGL-spoof" in out.log_tail
    cut = LogReader("mine", 1024, 1 << 16)
    cut.feed(block("mine", b"real", 0)[:40])  # killed while printing
    assert not cut.result().complete and cut.result().output is None
    bad = LogReader("mine", 1024, 1 << 16)
    bad.feed(b"AGL-mine begin\nAGL-mine output 4\n!!!!not base64\nAGL-mine exit 0\nAGL-mine end\n")
    assert bad.result().problems and bad.result().output is None


def test_the_token_bucket_paces_acquisitions() -> None:
    async def scenario() -> float:
        bucket = TokenBucket(rate=20.0, burst=2)
        started = time.monotonic()
        for _ in range(6):
            await bucket.acquire()
        return time.monotonic() - started

    elapsed = asyncio.run(scenario())
    assert elapsed >= (6 - 2) / 20.0 - 0.01


def test_the_gateway_listens_where_pods_can_reach_it() -> None:
    assert _spec().listen_address() == ("0.0.0.0", 8400)  # 10.1.2.3 is not this machine's: NATed, any interface
    # This machine's own address: only there, not on every interface (public Wi-Fi included).
    assert _spec(gateway_url="http://127.0.0.1:8400").listen_address() == ("127.0.0.1", 8400)
    if socket.has_ipv6 and is_own_address("::1"):
        assert _spec(gateway_url="http://[::1]:8400").listen_address() == ("::1", 8400)
    assert _spec(gateway_url="http://[fd00:7::7]:8400").listen_address() == ("::", 8400)  # IPv6: bound on IPv6
    assert _spec(gateway_listen="10.1.2.3:9000").listen_address() == ("10.1.2.3", 9000)
    assert KubernetesSpec(image="a").listen_address() is None
    with pytest.raises(ValidationError, match="host:port"):
        _spec(gateway_listen="nowhere")
