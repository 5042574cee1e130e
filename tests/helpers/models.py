"""Tiny random Llamas with SmolLM2's tokenizer and chat template, as Hugging Face folders, and the training projects
around them: what training and serving tests run on when the model's quality does not matter (no download: the
tokenizer comes from the local SmolLM2 conversion)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.agl import FIXTURES


def write_training_project(folder: Path, model: str, *, name: str = "tinyverl", python: str | None = None) -> Path:
    """A training project in `folder` around the model folder `model` (relative to it): 8 train and 4 val tasks, the
    two-turn agent and the seed grader (every GRPO group holds both rewards). Returns its agl.yaml."""
    run = shlex.quote(python or sys.executable)
    tasks = [{"id": f"t{i}", "question": f"Say something about {i}.", "split": "train" if i < 8 else "val"}
             for i in range(12)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    spec = {
        "name": name,
        "agent": {"command": f"{run} {shlex.quote(str(FIXTURES / 'two_turn_agent.py'))}", "timeout_s": 120},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": {"command": f"{run} {shlex.quote(str(FIXTURES / 'seed_grader.py'))} {{task_file}} {{output_file}}"},
        "upstreams": {"local": {"kind": "embedded", "model": model}},
        "model": f"local/{model}",
        "concurrency": 4,
    }
    (folder / "agl.yaml").write_text(json.dumps(spec, indent=1))  # JSON is YAML
    return folder / "agl.yaml"


def make_tiny_chat_model(folder: Path, *, kv_heads: int = 2, heads: int = 4, max_positions: int = 512) -> Path:
    """A randomly initialised 2-layer Llama with SmolLM2-135M-Instruct's tokenizer and chat template (skips the test
    where the tokenizer's package or the local extra is missing). The embedded server, the gateway and the trainer
    run their real code on it in seconds, where SmolLM2 itself would add minutes and nothing to check. vLLM's CPU
    attention needs a head size of at least 32 (`heads=2` on the hidden size of 64) and serves the 6144-token context
    the verl backend asks for only from a model whose `max_positions` allows it."""
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
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        tie_word_embeddings=True,
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
