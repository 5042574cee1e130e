"""`agl train`'s torch backend and the training temperature: the engine records raw (temperature 1) logprobs, so at
another temperature the trainer recomputes the old logprobs at it (tests/test_trainer_torch.py); the temperatures
its loss cannot model are refused before a run is made, saying why and what to use (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agl_cli.main import app
from agl_cli.training.sync_job import TrainOptions, temperature_problem
from tests.helpers import REPO

CALC = REPO / "examples" / "calc" / "agl.yaml"


@pytest.mark.parametrize(("flags", "said"), [
    (["--temperature", "0"], ["--temperature 0:", "above 0", "use --temperature 1"]),
    (["--temperature", "-0.5"], ["--temperature -0.5:", "above 0"]),
    (["--temperature", "0.7", "--loop", "collocated-async"],
     ["--temperature 0.7 with --loop collocated-async", "raw (temperature 1) logprobs", "or --loop sync"]),
])
def test_a_temperature_the_loss_cannot_model_exits_2_before_a_run_is_made(tmp_path: Path, flags: list[str],
                                                                          said: list[str]) -> None:
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["train", str(CALC), "--runs-dir", str(runs), *flags])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert all(part in message for part in said), message
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize(("temperature", "loop"), [(1.0, "sync"), (0.7, "sync"), (1.3, "sync"),
                                                   (1.0, "collocated-async")])
def test_the_sync_loop_takes_any_positive_temperature(temperature: float, loop: str) -> None:
    assert temperature_problem(TrainOptions(temperature=temperature, loop=loop)) is None
