"""`agl init` writes what the user said and what the machine has: a price per model (`--price MODEL=IN,OUT`, asked
for on a terminal) with a warning for any paid model left unpriced, a paid provider's dev API on a loopback address
that stays paid (`free: false`: never $0 for want of a price), the budget from `--budget-usd` or a question (unset,
and said so, when no one can answer), and the concurrency from the cores it may use."""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agl_cli.main import app
from agl_cli.spec.prices import price_table, unpriced_models
from agl_cli.spec.schema import load_spec
from rl_backend.gateway.pricing import Usage
from rl_backend.gateway.resolver import describe
from tests.helpers import AGL, agl_env

DEV_API = "http://127.0.0.1:8931/v1"  # a paid provider's dev API, reached over loopback
TWO_MODELS = ["init", "--upstream", DEV_API, "--models", "small,large"]
A_CALL = Usage(input_tokens=1_000_000, output_tokens=1_000_000)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks.jsonl").write_text('{"id": "t1"}\n')
    return tmp_path


def _cost(folder: Path, model: str) -> float | None:
    """What a call of 1M tokens in and 1M out costs under the written spec, as every run prices it."""
    spec = load_spec(folder / "agl.yaml")
    return price_table(spec).cost(describe("hosted", spec.upstreams["hosted"]), [model], A_CALL)


def test_a_price_per_model(folder: Path) -> None:
    result = CliRunner().invoke(app, [*TWO_MODELS, "--price", "small=0.10,0.40", "--price", "hosted/large=2,8,1"])
    assert result.exit_code == 0, result.output
    spec = load_spec(folder / "agl.yaml")
    assert yaml.safe_load((folder / "agl.yaml").read_text())["prices"] == {
        "hosted/small": {"input": 0.1, "output": 0.4}, "hosted/large": {"input": 2, "output": 8, "cached_input": 1}}
    assert unpriced_models(spec) == [] and "warning" not in result.output
    assert _cost(folder, "small") == pytest.approx(0.5) and _cost(folder, "large") == pytest.approx(10.0)


def test_an_unpriced_model_is_named_and_never_free_on_loopback(folder: Path) -> None:
    """The default model priced as before (a bare --price), the other one not: a warning names it, and its calls
    cost unknown, not $0, though the upstream's URL is loopback."""
    result = CliRunner().invoke(app, [*TWO_MODELS, "--price", "0.10,0.40"])
    assert result.exit_code == 0, result.output
    assert "warning: no price for hosted/large" in result.stderr and "--price large=INPUT,OUTPUT" in result.stderr
    assert _cost(folder, "small") == pytest.approx(0.5) and _cost(folder, "large") is None
    assert unpriced_models(load_spec(folder / "agl.yaml")) == [("hosted", "large")]
    # No price at all: every model unknown; a loopback URL alone once made them all $0.
    again = CliRunner().invoke(app, [*TWO_MODELS, "--force"])
    assert "warning: no price for hosted/small, hosted/large" in again.stderr
    assert _cost(folder, "small") is None and _cost(folder, "large") is None
    assert "free: false" in (folder / "agl.yaml").read_text()


def test_free_is_said_outright(folder: Path) -> None:
    """A model served on this machine (vLLM on loopback): --free, and nothing to price or cap."""
    result = CliRunner().invoke(app, [*TWO_MODELS, "--free"])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr and "budget.usd is unset" not in result.stderr
    assert _cost(folder, "large") == 0.0 and load_spec(folder / "agl.yaml").upstreams["hosted"].free is True


@pytest.mark.parametrize(("args", "says"), [
    (["--price", "medium=1,2"], "'medium' is not one of the models agl init writes"),
    (["--price", "small=1"], "INPUT,OUTPUT[,CACHED_INPUT]"),
    (["--price", "small=1,2", "--price", "hosted/small=1,2"], "hosted/small is priced twice"),
    (["--budget-usd", "-1"], "--budget-usd must be at least 0"),
    (["--concurrency", "0"], "--concurrency must be at least 1"),
])
def test_bad_prices_and_settings_are_usage_errors(folder: Path, args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, [*TWO_MODELS, *args])
    assert result.exit_code == 2 and says in result.output
    assert not (folder / "agl.yaml").exists()


def test_the_budget_comes_from_the_flag_or_is_unset_and_said_so(folder: Path) -> None:
    given = CliRunner().invoke(app, [*TWO_MODELS, "--price", "small=0.1,0.4", "--price", "large=2,8",
                                     "--budget-usd", "1"])
    assert given.exit_code == 0 and load_spec(folder / "agl.yaml").budget.usd == 1.0
    unset = CliRunner().invoke(app, [*TWO_MODELS, "--price", "small=0.1,0.4", "--price", "large=2,8", "--force"])
    assert unset.exit_code == 0 and load_spec(folder / "agl.yaml").budget.usd is None
    assert "budget.usd is unset, so nothing caps what a run spends on models" in unset.stderr
    # The embedded model costs nothing: no budget to ask for or warn about.
    local = CliRunner().invoke(app, ["init", "--force"])
    assert local.exit_code == 0 and "budget" not in local.stderr and load_spec(folder / "agl.yaml").budget.usd is None
    # A model agl ships a price for is paid all the same.
    shipped = CliRunner().invoke(app, ["init", "--force", "--upstream", "https://api.openai.com/v1", "--models",
                                       "gpt-4.1-mini"])
    assert "budget.usd is unset" in shipped.stderr and "no price" not in shipped.stderr


@pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset to give agl one core")
def test_the_concurrency_is_the_cores_agl_may_use(folder: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    assert CliRunner().invoke(app, ["init"]).exit_code == 0
    assert load_spec(folder / "agl.yaml").concurrency == min(cores, 16)
    subprocess.run(["taskset", "-c", "0", *AGL, "init", "--force"], cwd=folder, env=agl_env(), check=True,
                   capture_output=True, timeout=60)
    assert load_spec(folder / "agl.yaml").concurrency == 1 and "this machine's 1 core." in (folder / "agl.yaml").read_text()
    assert CliRunner().invoke(app, ["init", "--force", "--concurrency", "6"]).exit_code == 0
    assert load_spec(folder / "agl.yaml").concurrency == 6


def _answer_prompts(command: list[str], cwd: Path, answers: dict[str, str], timeout_s: float = 60) -> str:
    """Run `command` on a terminal (a pty), answering each prompt whose text contains a key of `answers`."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(command, cwd=cwd, env=agl_env(), stdin=terminal, stdout=terminal, stderr=terminal,
                               close_fds=True)
    os.close(terminal)
    seen, pending, deadline = b"", list(answers.items()), time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:  # the terminal closed: the process is done
                    break
                if not chunk:
                    break
                seen += chunk
            while pending and pending[0][0].encode() in seen.split(b"\n")[-1]:
                prompt, answer = pending.pop(0)
                seen += b"\n"  # past this prompt: the next one waits for its own text
                os.write(controller, answer.encode() + b"\n")
            if process.poll() is not None and not ready:
                break
        assert process.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, seen.decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
        os.close(controller)
    assert not pending, f"never asked: {pending}\n{seen.decode(errors='replace')}"
    return seen.decode(errors="replace")


@pytest.mark.skipif(sys.platform != "linux", reason="a pty as the terminal")
def test_on_a_terminal_it_asks_for_each_price_and_the_budget(folder: Path) -> None:
    shown = _answer_prompts([*AGL, *TWO_MODELS], folder, {
        "hosted/small: USD per 1M input tokens": "0.10", "hosted/small: USD per 1M output tokens": "0.40",
        "hosted/small: USD per 1M cached input tokens": "",
        "hosted/large: USD per 1M input tokens": "2", "hosted/large: USD per 1M output tokens": "8",
        "hosted/large: USD per 1M cached input tokens": "",
        "Budget for model spend per run, in USD": "1",
    })
    spec = load_spec(folder / "agl.yaml")
    assert spec.budget.usd == 1.0 and unpriced_models(spec) == [] and "warning" not in shown
    assert _cost(folder, "large") == pytest.approx(10.0)
