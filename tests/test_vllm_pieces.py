"""The small pieces of the vLLM path, each on its own (no vLLM server starts here; the vLLM tier is
tests/test_verl_vllm_cpu.py): the tool-call parser agl picks per model family, the metadata alias under which verl
finds vLLM's CPU build, and the environment a vLLM server gets on a CPU."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl_backend.trainer.verl_backend import vllm_cpu
from rl_backend.trainer.verl_backend.vllm_tools import tool_call_parser


def _model(folder: Path, model_type: str, tokens: tuple[str, ...] = ()) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    added = [{"id": i, "content": t, "special": True} for i, t in enumerate(tokens)]
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": added, "model": {"vocab": {"a": 0}}}))
    return str(folder)


def test_the_parser_follows_the_family_when_the_tokenizer_has_its_token(tmp_path: Path) -> None:
    assert tool_call_parser(_model(tmp_path / "qwen", "qwen2")) == "hermes"
    assert tool_call_parser(_model(tmp_path / "llama3", "llama", ("<|python_tag|>",))) == "llama3_json"
    # SmolLM2 is a `llama` without Llama 3's tool token: vLLM would refuse to start llama3_json on its tokenizer.
    assert tool_call_parser(_model(tmp_path / "smollm2", "llama")) == "hermes"
    assert tool_call_parser(_model(tmp_path / "mistral", "mistral", ("[TOOL_CALLS]",))) == "mistral"
    assert tool_call_parser(_model(tmp_path / "unknown", "some_new_family")) == "hermes"
    assert tool_call_parser("HuggingFaceTB/SmolLM3-3B") == "hermes"  # not a local folder: the fallback


def test_a_chosen_parser_wins_and_none_turns_tool_calls_off(tmp_path: Path) -> None:
    model = _model(tmp_path / "qwen", "qwen2")
    assert tool_call_parser(model, "pythonic") == "pythonic"
    assert tool_call_parser(model, "none") is None and tool_call_parser(model, " None ") is None


def test_the_cpu_list_is_what_vllm_accepts() -> None:
    assert vllm_cpu.cpu_list([1, 0]) == "0-1"
    assert vllm_cpu.cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert vllm_cpu.cpu_list([3]) == "3"


def test_the_server_environment_keeps_what_the_user_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    env = vllm_cpu.server_env("127.0.0.1")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] != "all" and env["VLLM_CPU_OMP_THREADS_BIND"][0].isdigit()
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    assert vllm_cpu.server_env(None) == {"VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_CPU_OMP_THREADS_BIND": "1"}


@pytest.mark.skipif(not vllm_cpu.installed(), reason="needs vLLM's CPU build: bash requirements/install-vllm-cpu.sh")
def test_verl_finds_vllms_cpu_build_under_the_name_vllm() -> None:
    """verl's vLLM package refuses to import without a `vllm` distribution; vLLM picks its CPU platform from the
    `+cpu` in that version. In a process of its own: the alias changes what importlib.metadata answers."""
    probe = ("import importlib.metadata as m; from rl_backend.trainer.verl_backend import vllm_cpu; "
             "before = [d.metadata['Name'] for d in m.distributions(name='vllm')]; "
             "print(before, vllm_cpu.alias_distribution(), vllm_cpu.alias_distribution(), m.version('vllm'), "
             "m.distribution('vllm').metadata['Name'], sum(isinstance(f, vllm_cpu._VllmCpuAlias) for f in "
             "__import__('sys').meta_path))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "True", "True", f"{metadata.version('vllm-cpu')}+cpu", "vllm", "1"]
