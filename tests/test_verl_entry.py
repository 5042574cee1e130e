"""`agl train CONFIG --backend verl`, the trainer image's entry point, on a machine without a GPU: the provision
templates' command reaches it, --dry-run prints a verl config verl accepts, a launch exits 2 naming what is missing,
and the step lines it prints are the rows the provisioner streams. Also: a gateway with $AGL_POLICY_URL forwards a
`kind: embedded` upstream to the OpenAI-compatible server there and records its token ids."""

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
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tasks.jsonl").write_text('{"id": 1, "q": "1+1"}\n')
    (folder / "agl.yaml").write_text(yaml.safe_dump(SPEC))
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
    from rl_backend.provision.plan import template_context  # noqa: F401 - the command below is what it renders

    config = _project(tmp_path / "project")
    _trainer_pod_env(monkeypatch, tmp_path)
    # The trainer Job's command (rl_backend/provision/plan.py), with the project where this test keeps it.
    command = ["agl", "train", f"{PROJECT_DIR}/agl.yaml", "--backend", "verl", "--resume"]
    args = [str(config) if a.startswith(PROJECT_DIR) else a for a in command[2:]] + ["--dry-run", "--json"]
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["settings"]["gpus_per_node"] == 8 and doc["settings"]["resume"] is True
    assert doc["config"]["trainer"]["default_local_dir"] == str(tmp_path / "checkpoints")
    assert doc["config"]["actor_rollout_ref"]["model"]["path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert doc["config"]["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] == "agl_rollout"
    assert doc["environment"]["AGL_GATEWAY_URL"].startswith("http://")
    plain = CliRunner().invoke(app, ["train", str(config), "--backend", "verl", "--dry-run", "--group-size", "8"])
    assert plain.exit_code == 0 and '"n": 8' in plain.stdout and "rendered and validated" in plain.output
    bad = CliRunner().invoke(app, ["train", str(config), "--backend", "verl", "--dry-run", "--kl-coef", "0.1"])
    assert bad.exit_code == 2 and "kl-coef" in bad.output


@needs_verl
def test_launching_without_cuda_or_vllm_exits_2_with_the_gpu_command(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_backend.trainer.verl_backend import runtime

    config = _project(tmp_path / "project")
    _trainer_pod_env(monkeypatch, tmp_path)
    monkeypatch.setattr(runtime, "missing_requirements", lambda: ["vLLM (pip extra `gpu`; CUDA only)",
                                                                  "a CUDA GPU (torch.cuda.is_available() is False)"])
    result = CliRunner().invoke(app, ["train", str(config), "--backend", "verl", "--resume"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "missing vLLM" in text and "CUDA GPU" in text
    assert "pip install '.[gpu,verl,k8s]' 'ray[default]'" in text and f"agl train {config} --backend verl" in text
    assert not (tmp_path / "agl-home").exists()  # nothing was started or created


def test_the_real_requirement_check_names_what_this_machine_lacks() -> None:
    from rl_backend.trainer.verl_backend.runtime import missing_requirements

    missing = missing_requirements()
    if importlib.util.find_spec("vllm") is None:
        assert any("vLLM" in m for m in missing)


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


def test_gateway_serves_an_embedded_upstream_from_agl_policy_url(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from agl_cli.commands.gateway_cmd import resolve_upstreams
    from rl_backend.gateway.config import UpstreamSpec

    fake = spawn_fast_fake()  # a real OpenAI-compatible server that answers vLLM-style (token ids, logprobs)
    try:
        monkeypatch.setenv("AGL_POLICY_URL", fake.url)
        said: list[str] = []
        resolved, servers = resolve_upstreams({"local": UpstreamSpec(kind="embedded", model="tiny")}, token_ids=set(),
                                              key_envs={}, log=said.append)
        assert servers == [] and resolved["local"].base_urls == [fake.url] and resolved["local"].returns_token_ids
        assert "AGL_POLICY_URL" in said[0] and "not loaded in this process" in said[0]

        (tmp_path / "agl.yaml").write_text(yaml.safe_dump({"name": "gw", "upstreams": SPEC["upstreams"],
                                                           "model": SPEC["model"]}))
        store = tmp_path / "s.sqlite"
        gw = spawn_serve([str(tmp_path), "--store", str(store)], admin_token="adm")  # inherits AGL_POLICY_URL
        try:
            reg = register(gw.url, "adm", "r1")
            client: Any = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["token"], max_retries=0)
            reply = client.chat.completions.create(model="anything", messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].message.content
        finally:
            assert gw.stop() == 0
    finally:
        fake.kill()
    db = RunStore(store)
    try:
        (call,) = db.calls()
    finally:
        db.close()
    assert call.upstream == "local" and call.model == "smollm2-135m-instruct"
    assert call.prompt_token_ids and call.completion_token_ids  # recorded: training can use them
