"""The context the verl backend's policy servers give a multi-turn agent: the longest prompt and answer are set by
agl.yaml (the trained upstream's max_prompt_length/max_response_length) or the flags (which win), vLLM's
max_model_len is their sum, verl's token budgets always hold one whole sequence, and a sum beyond the model's own
max_position_embeddings exits 2 saying what to lower."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agl_cli.main import app
from tests.test_verl_entry import _project

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")


def _config(tmp_path: Path, *, upstream: dict[str, Any] | None = None, positions: int | None = None) -> Path:
    config = _project(tmp_path / "project")
    if positions is not None:
        (config.parent / "model" / "config.json").write_text(json.dumps({"max_position_embeddings": positions}))
    if upstream:
        spec = yaml.safe_load(config.read_text())
        spec["upstreams"]["local"].update(upstream)
        config.write_text(yaml.safe_dump(spec))
    return config


def _dry_run(config: Path, *flags: str) -> Any:
    return CliRunner().invoke(app, ["train", str(config), "--backend", "verl", "--dry-run", "--json", "--device",
                                    "cpu", *flags])


def _lengths(result: Any) -> tuple[int, int, int, int, int]:
    assert result.exit_code == 0, result.output
    cfg = json.loads(result.stdout)["config"]["actor_rollout_ref"]
    rollout, actor = cfg["rollout"], cfg["actor"]
    return (rollout["prompt_length"], rollout["response_length"], rollout["max_model_len"],
            actor["ppo_max_token_len_per_gpu"], rollout["log_prob_max_token_len_per_gpu"])


def test_lengths_come_from_agl_yaml_and_the_flags_win(tmp_path: Path) -> None:
    assert _lengths(_dry_run(_config(tmp_path / "a")))[:3] == (4096, 2048, 6144)
    config = _config(tmp_path / "b", upstream={"max_prompt_length": 12000, "max_response_length": 1000})
    assert _lengths(_dry_run(config))[:3] == (12000, 1000, 13000)
    assert _lengths(_dry_run(config, "--max-response-length", "3000"))[:3] == (12000, 3000, 15000)
    assert _lengths(_dry_run(config, "--max-prompt-length", "500", "--max-response-length", "300"))[:3] == (500, 300,
                                                                                                             800)


def test_verls_token_budgets_hold_the_longest_sequence(tmp_path: Path) -> None:
    # 16384 tokens per micro-batch is the default; a 30000-token context needs more, or verl fails mid-step.
    prompt, response, total, update, recompute = _lengths(_dry_run(_config(tmp_path, positions=32768),
                                                                   "--max-prompt-length", "24000",
                                                                   "--max-response-length", "6000"))
    assert (prompt, response, total) == (24000, 6000, 30000)
    assert update >= total and recompute >= total


def test_a_context_beyond_the_models_own_limit_exits_2_naming_it(tmp_path: Path) -> None:
    config = _config(tmp_path, positions=8192)
    assert _lengths(_dry_run(config, "--max-prompt-length", "6144"))[2] == 8192  # exactly the limit fits
    # An unset response length takes what the prompt leaves; lengths given are kept, and refused when too long.
    assert _lengths(_dry_run(config, "--max-prompt-length", "7000"))[:3] == (7000, 1192, 8192)
    result = _dry_run(config, "--max-prompt-length", "7000", "--max-response-length", "2048")
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "9048 tokens" in message and "max_position_embeddings (8192)" in message
    assert "--max-prompt-length" in message and "agl.yaml" in message


def test_unset_lengths_fit_a_small_models_context(tmp_path: Path) -> None:
    assert _lengths(_dry_run(_config(tmp_path / "a", positions=512)))[:3] == (384, 128, 512)
    assert _lengths(_dry_run(_config(tmp_path / "b", positions=8192)))[:3] == (4096, 2048, 6144)
    assert _lengths(_dry_run(_config(tmp_path / "c", positions=512), "--max-response-length", "100"))[:3] == (412, 100,
                                                                                                              512)


@pytest.mark.parametrize("flag", ["--max-prompt-length", "--max-response-length"])
def test_a_length_below_one_token_exits_2(tmp_path: Path, flag: str) -> None:
    result = _dry_run(_config(tmp_path), flag, "0")
    assert result.exit_code == 2 and f"{flag} must be at least 1" in " ".join(result.output.split())


def test_agl_yaml_refuses_a_length_below_one(tmp_path: Path) -> None:
    result = _dry_run(_config(tmp_path, upstream={"max_response_length": 0}))
    assert result.exit_code == 2 and "max_response_length" in result.output
