"""Which of vLLM's tool-call parsers reads a model's tool calls: chosen from the model's family, settable.

vLLM's OpenAI server answers a request that carries `tools` (with `tool_choice` unset or "auto", what the OpenAI and
Anthropic SDKs send) only when it was started with `--enable-auto-tool-choice --tool-call-parser NAME`; the parser
turns the text the model wrote in its family's tool-call format into the response's `tool_calls`. agl starts verl's
vLLM servers with the parser of the trained model's family (its config.json `model_type`, checked against its
tokenizer: vLLM refuses to start a parser whose special token the tokenizer lacks), or the one agl.yaml's upstream
(`tool_call_parser:`) or `agl train --tool-call-parser` names; `none` starts vLLM without tool calls.
"""

from __future__ import annotations

import json
from pathlib import Path

OFF = "none"
# A family's tool-call format, by Hugging Face `model_type`, as vLLM's documentation pairs them.
PARSERS_BY_FAMILY = {
    "qwen2": "hermes", "qwen2_moe": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes", "smollm3": "hermes",
    "llama": "llama3_json", "llama4": "llama4_pythonic", "mistral": "mistral", "mixtral": "mistral",
    "granite": "granite", "internlm2": "internlm", "deepseek_v3": "deepseek_v3", "gpt_oss": "openai",
}
# `<tool_call>{json}</tool_call>`: what most open chat models fine-tuned for tools write. Plain text to vLLM's parser,
# so it starts with any tokenizer.
FALLBACK = "hermes"
# Parsers vLLM refuses to start with unless the tokenizer has this token (it checks when the server starts): a model
# of the family without it (SmolLM2 is a `llama` without Llama 3's tool token) gets the fallback.
NEEDS_TOKEN = {"llama3_json": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "tekken.json")


def family(model_path: str) -> str | None:
    """The model's `model_type` from its config.json (None for a model that is not a local folder)."""
    config = Path(model_path) / "config.json"
    try:
        value = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


def has_token(model_path: str, token: str) -> bool | None:
    """Whether the model's tokenizer files name `token` (None when there are none to read here)."""
    found = None
    for name in _TOKENIZER_FILES:
        path = Path(model_path) / name
        if path.is_file():
            found = found or token.encode() in path.read_bytes()
    return found


def tool_call_parser(model_path: str, chosen: str | None = None) -> str | None:
    """The parser vLLM starts with: `chosen` (None: by family, `none`: no tool calls), else the family's when the
    tokenizer has what that parser needs, else hermes."""
    if chosen is not None:
        return None if chosen.strip().lower() == OFF else chosen.strip()
    parser = PARSERS_BY_FAMILY.get(family(model_path) or "", FALLBACK)
    token = NEEDS_TOKEN.get(parser)
    if token is not None and has_token(model_path, token) is False:
        return FALLBACK
    return parser
