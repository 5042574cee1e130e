"""`agl train CONFIG --backend verl`, the trainer image's entry point, without a GPU: the provision templates'
command reaches it, --dry-run prints a verl config verl accepts, bad options exit 2 naming the fix, a launch without
CUDA or vLLM exits 2 naming what is missing, and the step lines it prints are the rows the provisioner streams.
Also: a cluster's gateway waits for the trainer to register the policy's servers (verl's rollout replicas) over
its admin API and then records their token ids; the pins of the GPU stack are verl's own; `agl doctor` says when
the installed stack does not fit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from typer.testing import CliRunner

from agl_cli.commands.train_verl import step_line
from agl_cli.main import app
from rl_backend.gateway.fake.procs import register, spawn_fast_fake, spawn_serve
from rl_backend.provision.metrics import metric_row
from rl_backend.provision.options import Names, ProvisionOptions
from rl_backend.provision.plan import PROJECT_DIR, choose_topology, trainer_env
from rl_backend.store.db import RunStore
from rl_backend.trainer.curves import StepRecord
from tests.helpers import GATEWAY_SERVE

needs_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")
SPEC = {
    "name": "calc",
    "agent": {"command": "python agent.py --task {task_file} --out {output_file}"},
    "tasks": {"path": "tasks.jsonl"},
    "grader": {"command": "python grade.py {task_file} {output_file}"},
    "upstreams": {"local": {"kind": "embedded", "model": "smollm2-135m-instruct"}},
    "model": "local/smollm2-135m-instruct",
}


def _project(folder: Path) -> Path:
    """A spec whose embedded model is a local folder: what verl loads, with nothing to convert or download."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tasks.jsonl").write_text('{"id": 1, "q": "1+1"}\n')
    (folder / "model").mkdir(exist_ok=True)
    (folder / "model" / "config.json").write_text("{}")
    spec = {**SPEC, "upstreams": {"local": {"kind": "embedded", "model": "model"}}, "model": "local/model"}
    (folder / "agl.yaml").write_text(yaml.safe_dump(spec))
    return folder / "agl.yaml"


def _trainer_pod_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The environment provision gives the trainer pod (values, not secret references)."""
    topology = choose_topology(ProvisionOptions(gpus=8, trainer="job"), None)
    for item in trainer_env(Names("calc"), "ml", topology):
        if "value" in item:
            monkeypatch.setenv(item["name"], item["value"])
    monkeypatch.setenv("AGL_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("AGL_HOME", str(tmp_path / "agl-home"))


@needs_verl
def test_the_provisioned_command_dry_runs_to_a_verl_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _project(tmp_path / "project")
    _trainer_pod_env(monkeypatch, tmp_path)
    # The trainer Job's command (rl_backend/provision/plan.py), with the project where this test keeps it.
    command = ["agl", "train", f"{PROJECT_DIR}/agl.yaml", "--backend", "verl", "--resume"]
    args = [str(config) if a.startswith(PROJECT_DIR) else a for a in command[2:]] + ["--dry-run", "--json"]
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["settings"]["gpus_per_node"] == 8 and doc["settings"]["rollout_name"] == "vllm"
    assert doc["config"]["actor_rollout_ref"]["model"]["path"] == str((config.parent / "model").resolve())
    assert doc["config"]["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] == "agl_rollout"
    assert doc["config"]["trainer"]["n_gpus_per_node"] == 8
    assert doc["environment"]["AGL_GATEWAY_URL"].startswith("http://")
    plain = CliRunner().invoke(app, ["train", str(config), "--backend", "verl", "--dry-run", "--steps", "3",
                                     "--device", "cpu"])
    assert plain.exit_code == 0 and "total_training_steps: 3" in plain.stdout and "agl_embedded" in plain.stdout
    assert "rendered and validated" in plain.output


@needs_verl
@pytest.mark.parametrize(("flags", "message"), [
    (["--kl-coef", "0.1"], "kl-coef"),
    (["--lora", "--lora-rank", "-4"], "LoRA rank must be positive, got -4"),
    (["--loop", "collocated-async"], "sync loop"),
    (["--device", "cpu", "--policy-server", "vllm", "--rollout-dtype", "fp8"], "rollout dtype 'fp8'"),
    (["--group-size", "1"], "at least 2"),
    (["--device", "tpu"], "auto, cuda or cpu"),
])
def test_options_verl_cannot_take_exit_2_naming_the_fix(tmp_path: Path, flags: list[str], message: str) -> None:
    config = _project(tmp_path / "project")
    result = CliRunner().invoke(app, ["train", str(config), "--backend", "verl", "--dry-run", *flags])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


@needs_verl
def test_launching_without_cuda_or_vllm_exits_2_with_the_gpu_command(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_backend.trainer.verl_backend import runtime

    config = _project(tmp_path / "project")
    _trainer_pod_env(monkeypatch, tmp_path)
    monkeypatch.setattr(runtime, "missing_requirements", lambda device, server: [
        "vLLM (pip extra `gpu`; CUDA only)", "a CUDA GPU (torch.cuda.is_available() is False)"])
    result = CliRunner().invoke(app, ["train", str(config), "--backend", "verl", "--resume", "--device", "cuda"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "missing vLLM" in text and "CUDA GPU" in text
    assert "pip install '.[gpu,verl,k8s]'" in text and f"agl train {config} --backend verl" in text
    assert "--device cpu" in text  # the way to try the backend without a GPU
    assert not (tmp_path / "agl-home").exists()  # nothing was started or created


def test_the_real_requirement_check_names_what_this_machine_lacks() -> None:
    from rl_backend.trainer.verl_backend.runtime import missing_requirements

    if importlib.util.find_spec("vllm") is None:
        assert any("vLLM" in m for m in missing_requirements("cuda", "vllm"))
    assert not any("vLLM" in m for m in missing_requirements("cpu", "embedded"))


def test_step_lines_are_the_rows_the_provisioner_streams() -> None:
    record = StepRecord(step=3, model_version="step-3", updated=True, started_at=1.0, ended_at=2.0, rollouts=16,
                        trained_rollouts=14, reward_mean=0.625, pass_rate=0.5, entropy=1.25, kl=None, loss=-0.01,
                        grad_norm=0.5, tokens_per_s=1000.0, rollouts_per_min=30.0, staleness_mean=0.0,
                        staleness_max=0, checkpoint=Path("/checkpoints/step-3"), metrics={})
    line = step_line(record)
    assert "\n" not in line
    for logged in (line, f"(TaskRunner pid=42) {line}", f"2025-01-01 12:00:00 INFO {line}"):
        row = metric_row(logged)
        assert row is not None and row["step"] == 3 and row["reward_mean"] == 0.625
        assert row["checkpoint"] == "/checkpoints/step-3" and row["updated"] is True


def test_a_cluster_gateway_serves_the_policy_once_the_trainer_registers_its_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a cluster the policy's servers are verl's rollout replicas, started by the trainer: the gateway (`agl
    gateway serve --in-cluster`) loads no model for the `kind: embedded` upstream, answers 503 until the trainer
    registers the servers' addresses (PUT /admin/upstreams/<name>/endpoints), then forwards there under the model
    name they answer to and records their token ids."""
    from rl_backend.gateway.remote import RemoteGateway

    monkeypatch.setenv("POD_IP", "127.0.0.1")  # the pod's address, as the downward API gives it
    fake = spawn_fast_fake()  # a real OpenAI-compatible server that answers vLLM-style (token ids, logprobs)
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({"name": "gw", "upstreams": SPEC["upstreams"],
                                                       "model": SPEC["model"]}))
    store = tmp_path / "s.sqlite"
    try:
        gw = spawn_serve(GATEWAY_SERVE, [str(tmp_path), "--store", str(store), "--in-cluster", "--port", "0"],
                         admin_token="adm")
        admin = RemoteGateway(gw.url, "adm")
        try:
            reg = register(gw.url, "adm", "r1")
            client: Any = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["token"], max_retries=0)
            ask = {"model": "anything", "messages": [{"role": "user", "content": "hi"}]}
            with pytest.raises(openai.InternalServerError) as waiting:
                client.chat.completions.create(**ask)
            assert waiting.value.status_code == 503 and "not registered yet" in str(waiting.value)
            with pytest.raises(ValueError, match="does not take registered endpoints"):
                admin.set_endpoints("nope", [fake.url])
            admin.set_endpoints("local", [fake.url], model="policy-7b")
            reply = client.chat.completions.create(**ask)
            assert reply.choices[0].message.content
        finally:
            admin.close()
            assert gw.stop() == 0
    finally:
        fake.kill()
    db = RunStore(store)
    try:
        calls = [c for c in db.calls() if c.error is None]
    finally:
        db.close()
    (call,) = calls
    assert call.upstream == "local" and call.model == "policy-7b"  # the name the registered servers answer to
    assert call.prompt_token_ids and call.completion_token_ids  # recorded: training can use them


@needs_verl
def test_the_gpu_stack_is_pinned_to_verls_own_pins() -> None:
    """verl 0.9.1's `vllm` extra pins vLLM, torch and transformers; agl's `gpu` extra and the trainer image pin the
    same (an unpinned vLLM, or an image on another vLLM's torch, cannot run verl)."""
    import tomllib
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    repo = Path(__file__).resolve().parent.parent
    gpu = {Requirement(r).name: str(Requirement(r).specifier)
           for r in tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]}
    verl_pins = {Requirement(r).name: str(Requirement(r).specifier) for r in requires("verl") or []
                 if 'extra == "vllm"' in r and Requirement(r).name in ("vllm", "torch", "transformers")}
    assert verl_pins and all(gpu[name] == spec for name, spec in verl_pins.items()), (gpu, verl_pins)
    dockerfile = (repo / "docker" / "trainer.Dockerfile").read_text()
    assert f"vllm/vllm-openai:v{verl_pins['vllm'].removeprefix('==')}" in dockerfile
    assert '".[k8s,verl,gpu]"' in dockerfile


@needs_verl
def test_doctor_says_when_the_gpu_stack_does_not_fit() -> None:
    result = CliRunner().invoke(app, ["doctor", "--stack", "gpu", "--json"])
    doc = json.loads(result.stdout)
    (stack,) = [c for c in doc["checks"] if c["name"].startswith("GPU training stack")]
    if importlib.util.find_spec("vllm") is None:  # this machine: a CPU torch and no vLLM
        assert result.exit_code == 1 and not stack["ok"] and stack["required"]
        assert "vllm not installed (verl 0.9.1 needs vllm==0.24.0)" in stack["detail"]
        assert "torch==2.11.0" in stack["detail"] and "'.[gpu,verl]'" in stack["fix"]
    plain = json.loads(CliRunner().invoke(app, ["doctor", "--json"]).stdout)
    (cpu,) = [c for c in plain["checks"] if c["name"] == "verl training stack"]
    assert cpu["ok"] and not cpu["required"]  # the CPU stack (verl, its transformers and tensordict) fits here
