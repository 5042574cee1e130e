"""Sampling settings the verl backend's loss can account for: its policy servers record raw (temperature 1)
logprobs and the actor recomputes at temperature 1, so a training temperature other than 1 is refused with the
reason, and the agent's top_p is set to 1 on every training call (the gateway writes it into the request; the rest of
what could shape sampling: tests/test_gateway_training_fields.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agl_cli.main import app
from agl_cli.training.sync_job import TrainOptions
from agl_cli.training.verl_job import VerlTrainingRun
from rl_backend.gateway.knobs import apply_knobs
from rl_backend.store.records import Api
from tests.test_verl_entry import _project

needs_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")


@needs_verl
@pytest.mark.parametrize("temperature", ["0.7", "1.3"])
def test_a_training_temperature_the_loss_cannot_model_exits_2_saying_why(tmp_path: Path, temperature: str) -> None:
    config = _project(tmp_path / "project")
    result = CliRunner().invoke(app, ["train", str(config), "--backend", "verl", "--dry-run", "--device", "cpu",
                                      "--temperature", temperature])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"--temperature {temperature}" in message and "raw (temperature 1) logprobs" in message
    assert "use --temperature 1" in message


@needs_verl
def test_temperature_1_renders_raw_logprobs_recomputed_at_temperature_1(tmp_path: Path) -> None:
    config = _project(tmp_path / "project")
    result = CliRunner().invoke(app, ["train", str(config), "--backend", "verl", "--dry-run", "--device", "cpu",
                                      "--temperature", "1"])
    assert result.exit_code == 0, result.output
    rollout = yaml.safe_load(result.stdout)["actor_rollout_ref"]["rollout"]
    assert rollout["logprobs_mode"] == "raw_logprobs"


def _verl_run(temperature: float) -> Any:
    run = object.__new__(VerlTrainingRun)  # only the options matter to what the gateway is told
    run.options = TrainOptions(temperature=temperature, backend="verl")
    return run


def test_training_calls_sample_from_the_whole_distribution_whatever_the_agent_asks() -> None:
    overrides = _verl_run(1.0).sampling_overrides()
    assert overrides == {"temperature": 1.0, "top_p": 1.0, "training_call": True}
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": 0.5,
                            "temperature": 0.2}
    applied = apply_knobs(Api.openai_chat, body, overrides)
    assert body["top_p"] == 1.0 and body["temperature"] == 1.0
    # Recorded with the call: what the agent's request became, and the agent's values it no longer carries.
    assert applied == {"temperature": 1.0, "top_p": 1.0, "sampling_overridden": {"temperature": 0.2, "top_p": 0.5}}
