"""The embedded model server: an OpenAI-compatible server over a local Hugging Face causal LM.

It returns token ids and logprobs the way vLLM does and takes new weights between training steps. Importing this
package is cheap; torch and transformers load only when one of the names below is first used.

    from rl_backend.serving import start_embedded_server
    server = start_embedded_server()            # smollm2-135m-instruct, on a free port
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    ...
    server.engine.load_weights_from_dir("ckpt/step-10", version="step-10")
    server.stop()

Command line: `python -m rl_backend.serving --model M --host H --port P`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Engine
    from .model_store import DEFAULT_MODEL, LoadedModel, ModelNotAvailable, ensure_converted, load_model
    from .outputs import Completion, Delta, EngineError
    from .sampling import SamplingParams
    from .server import EmbeddedServer, create_app, start_embedded_server

_EXPORTS = {
    "Completion": "outputs",
    "Delta": "outputs",
    "Engine": "engine",
    "EngineError": "outputs",
    "DEFAULT_MODEL": "model_store",
    "LoadedModel": "model_store",
    "ModelNotAvailable": "model_store",
    "ensure_converted": "model_store",
    "load_model": "model_store",
    "SamplingParams": "sampling",
    "EmbeddedServer": "server",
    "create_app": "server",
    "start_embedded_server": "server",
}

__all__ = [
    "Completion",
    "DEFAULT_MODEL",
    "Delta",
    "EmbeddedServer",
    "Engine",
    "EngineError",
    "LoadedModel",
    "ModelNotAvailable",
    "SamplingParams",
    "create_app",
    "ensure_converted",
    "load_model",
    "start_embedded_server",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
