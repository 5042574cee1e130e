"""LoRA ranks with vLLM serving the policy: the adapter is merged into the weights verl syncs, so vLLM never loads
an adapter and any positive rank trains, locally and through the cluster's trainer flags; a rank below 1 exits 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agl_cli.main import app
from tests.test_provision_support import fast_schemas  # noqa: F401 - an autouse fixture
from tests.test_provision_trainer import _command, _plan
from tests.test_verl_entry import _project

needs_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")


@needs_verl
@pytest.mark.parametrize("rank", ["12", "4", "600"])
def test_a_rank_outside_vllms_list_trains_merged(tmp_path: Path, rank: str) -> None:
    config = _project(tmp_path / "project")
    result = CliRunner().invoke(app, ["train", str(config), "--backend", "verl", "--dry-run", "--json",
                                      "--device", "cuda", "--policy-server", "vllm", "--lora", "--lora-rank", rank])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    model = doc["config"]["actor_rollout_ref"]["model"]
    assert model["lora_rank"] == int(rank) and model["lora"]["merge"] is True
    assert doc["settings"]["rollout_name"] == "vllm"


@needs_verl
def test_the_cluster_passes_such_a_rank_to_a_trainer_that_takes_it() -> None:
    command = _command(_plan("--lora", "--lora-rank", "12")["manifests"])
    assert command[-3:] == ["--lora", "--lora-rank", "12"]
