"""The embedded engine's runners on a tiny random Llama (seconds, not minutes): the fast runner computes what the
Hugging Face forward computes, batched prefill and decode are batch invariant, a finished request's cache serves the
next prompt that extends it, new weights drop the cache, bfloat16 keeps batch invariance, and the HF runner still
serves what the fast runner cannot."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rl_backend.serving import llama_runner  # noqa: E402
from rl_backend.serving.engine import Engine  # noqa: E402
from rl_backend.serving.llama_runner import LlamaRunner, unsupported_reason  # noqa: E402
from rl_backend.serving.model_store import load_model  # noqa: E402
from rl_backend.serving.sampling import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def loaded(tiny_chat_model: Path) -> Any:
    return load_model(str(tiny_chat_model), device="cpu")


def _prompts(loaded: Any, texts: list[str]) -> list[list[int]]:
    return [loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)["input_ids"] for t in texts]


TEXTS = ["Hi!", "Write a short story about a robot who learns to paint, with a twist at the end.", "Why is the sky blue?"]


def _hf_logits(model: Any, ids: list[int]) -> Any:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def test_fast_runner_computes_the_hf_forward(loaded: Any) -> None:
    assert unsupported_reason(loaded.model) is None
    runner = LlamaRunner(loaded.model, prefix_cache_bytes=0)
    prompts = _prompts(loaded, TEXTS)
    with torch.inference_mode():
        seqs, logits = runner.prefill(prompts)
        steps = [logits]
        tokens = [logits.argmax(-1).tolist()]
        for _ in range(5):
            steps.append(runner.decode(seqs, tokens[-1]))
            tokens.append(steps[-1].argmax(-1).tolist())
    for row, prompt in enumerate(prompts):
        generated = [t[row] for t in tokens[:-1]]
        reference = _hf_logits(loaded.model, prompt + generated)[len(prompt) - 1 :]
        ours = torch.stack([s[row] for s in steps])
        assert torch.allclose(ours, reference, atol=1e-4), (ours - reference).abs().max()
        assert seqs[row].tokens == prompt + generated


ATTENTION = ["attention-kernel", "torch-attention", "kernel-for-short-rows"]


def _attention(mode: str, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether the runner gets the kernel; for "kernel-for-short-rows", a row length limit that sends the shortest
    prompt's row to the kernel, at first, and the others to torch (with the kernel built as C, rows past 192 keys go
    to torch)."""
    if mode == "kernel-for-short-rows":
        limit = sorted(map(len, prompts))[1]  # below it the shortest prompt's row, at first; the others above
        assert 0 < sum(len(p) < limit for p in prompts) < len(prompts)
        monkeypatch.setattr(llama_runner, "KERNEL_LONGEST", limit)
        monkeypatch.setattr(llama_runner, "NATIVE_KERNEL_LONGEST", limit)
    return mode != "torch-attention"


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_rows_do_not_depend_on_their_batch(loaded: Any, precision: str, attention: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt prefilled and decoded alone gives the same logits as inside a batch (bit for bit on oneDNN CPUs)."""
    prompts = _prompts(loaded, TEXTS)
    kernel = _attention(attention, prompts, monkeypatch)
    runner = LlamaRunner(loaded.model, precision=precision, prefix_cache_bytes=0,  # type: ignore[arg-type]
                         attention_kernel=kernel)

    def run(batch: list[list[int]]) -> list[Any]:
        with torch.inference_mode():
            seqs, logits = runner.prefill(batch)
            out = [logits]
            for _ in range(4):
                out.append(runner.decode(seqs, out[-1].argmax(-1).tolist()))
            return [torch.stack([o[i] for o in out]) for i in range(len(batch))]

    together = run(prompts)
    assert (runner._attention_kernel() is not None) == kernel
    for i, prompt in enumerate(prompts):
        (alone,) = run([prompt])
        assert torch.equal(alone, together[i])


def test_attention_kernel_computes_what_torch_attention_computes(loaded: Any) -> None:
    """The compiled decode attention and torch's row-by-row products give the same tokens and logits to float32
    rounding."""
    prompts = _prompts(loaded, TEXTS)

    def run(kernel: bool) -> Any:
        runner = LlamaRunner(loaded.model, prefix_cache_bytes=0, attention_kernel=kernel)
        with torch.inference_mode():
            seqs, logits = runner.prefill(prompts)
            out = []
            for _ in range(8):
                logits = runner.decode(seqs, logits.argmax(-1).tolist())
                out.append(logits)
        return torch.stack(out)

    ours, theirs = run(True), run(False)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


def test_bfloat16_stays_close_to_float32(loaded: Any) -> None:
    prompts = _prompts(loaded, TEXTS)
    with torch.inference_mode():
        _, full = LlamaRunner(loaded.model, prefix_cache_bytes=0).prefill(prompts)
        _, half = LlamaRunner(loaded.model, precision="bfloat16", prefix_cache_bytes=0).prefill(prompts)
    gap = (torch.log_softmax(full, -1) - torch.log_softmax(half, -1)).abs().max().item()
    assert 0 < gap < 0.1


def test_next_turn_reuses_the_previous_turn_and_computes_the_same(loaded: Any) -> None:
    (prompt,) = _prompts(loaded, ["Count the letters in the word strawberry, one by one."])
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    warm = Engine(loaded, threads=1).start()
    cold = Engine(loaded, threads=1, prefix_cache_mb=0).start()
    try:
        first = warm.generate_sync(prompt, params, timeout_s=60)
        assert first.token_ids == cold.generate_sync(prompt, params, timeout_s=60).token_ids
        # The agent's next turn: the previous prompt and reply, then a tool result, then the assistant opener.
        tail = loaded.tokenizer.encode("<|im_end|>\n<|im_start|>user\nRESULT: 10<|im_end|>\n<|im_start|>assistant\n")
        second = prompt + first.token_ids + tail
        before = warm.stats()["reused_tokens"]
        again = warm.generate_sync(second, params, timeout_s=60)
        reused = warm.stats()["reused_tokens"] - before
        # What the first turn computed (its prompt and reply but the last token, never fed), cut to a multiple of 16
        # at least four positions before the end, came from the cache.
        cached = len(prompt) + len(first.token_ids) - 1
        assert reused == min(cached, len(second) - 4) // 16 * 16 and reused > len(prompt)
        fresh = cold.generate_sync(second, params, timeout_s=60)
        assert cold.stats()["reused_tokens"] == 0
        assert again.token_ids == fresh.token_ids
        assert [c.logprob for c in again.logprobs] == pytest.approx([c.logprob for c in fresh.logprobs], abs=1e-5)

        # The same prompt again (a sibling: another variant, another seed) reuses it and gets the same bits.
        before = warm.stats()["reused_tokens"]
        repeat = warm.generate_sync(second, params, timeout_s=60)
        assert warm.stats()["reused_tokens"] > before
        assert repeat.token_ids == again.token_ids
        assert [c.logprob for c in repeat.logprobs] == [c.logprob for c in again.logprobs]
    finally:
        warm.stop()
        cold.stop()


def test_new_weights_drop_the_cached_prefixes(loaded: Any) -> None:
    (prompt,) = _prompts(loaded, ["Tell me something about the moon and the tides, in detail please."])
    params = SamplingParams(max_tokens=4, temperature=0, top_logprobs=1)
    engine = Engine(loaded, threads=1).start()
    try:
        base = engine.generate_sync(prompt, params, timeout_s=60)
        original = {k: v.clone() for k, v in loaded.model.state_dict().items()}
        changed = {k: v * 1.5 if k.endswith("mlp.down_proj.weight") else v for k, v in original.items()}
        engine.load_state_dict(changed, "step-1", timeout_s=60)
        after = engine.generate_sync(prompt, params, timeout_s=60)
        assert after.model_version == "step-1"
        assert engine.stats()["reused_tokens"] == 0
        reference = torch.log_softmax(_hf_logits(loaded.model, prompt)[-1], -1)
        assert after.logprobs[0].logprob == pytest.approx(reference[after.token_ids[0]].item(), abs=1e-4)
        assert after.logprobs[0].logprob != pytest.approx(base.logprobs[0].logprob, abs=1e-4)
        engine.load_state_dict(original, "base-again", timeout_s=60)
        back = engine.generate_sync(prompt, params, timeout_s=60)
        assert back.token_ids == base.token_ids and back.logprobs[0].logprob == base.logprobs[0].logprob
    finally:
        engine.stop()


def test_hf_runner_serves_what_the_fast_runner_cannot(loaded: Any) -> None:
    prompts = _prompts(loaded, TEXTS)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    hf = Engine(loaded, threads=1, fast=False).start()
    fast = Engine(loaded, threads=1, prefix_cache_mb=0).start()
    try:
        assert hf.stats()["runner"] == "hf" and fast.stats()["runner"] == "fast"
        results: dict[str, list[Any]] = {}
        for name, engine in (("hf", hf), ("fast", fast)):
            out: list[Any] = [None] * len(prompts)

            def go(i: int, engine: Engine = engine, out: list[Any] = out) -> None:
                out[i] = engine.generate_sync(prompts[i], params, timeout_s=60)

            threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            results[name] = out
        for a, b in zip(results["hf"], results["fast"], strict=True):
            assert len(a.token_ids) == len(b.token_ids) == 6
            for x, y in zip(a.logprobs, b.logprobs, strict=True):
                if x.token_id == y.token_id:
                    assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
    finally:
        hf.stop()
        fast.stop()
    with pytest.raises(ValueError, match="bfloat16"):
        Engine(loaded, fast=False, precision="bfloat16")
    with pytest.raises(ValueError, match="precision"):
        Engine(loaded, precision="float8")  # type: ignore[arg-type]


def test_streams_wake_their_event_loop_once_per_step_not_once_per_token(loaded: Any) -> None:
    """8 concurrent streams: the engine hands each step's 8 tokens to the event loop in one wake-up (each wake-up is a
    self-pipe write and a GIL hand-over that the decode step waits for), and every stream still gets every token."""
    import asyncio

    engine = Engine(loaded, max_batch_size=8, threads=1, prefix_cache_mb=0).start()
    prompts = _prompts(loaded, [f"{TEXTS[i % len(TEXTS)]} ({i})" for i in range(8)])
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

    async def run() -> tuple[list[list[int]], int]:
        loop = asyncio.get_running_loop()
        wakeups = [0]
        original = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            wakeups[0] += 1
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]

        async def one(prompt: list[int]) -> list[int]:
            return [t async for d in engine.stream(prompt, params) for t in d.token_ids]

        return list(await asyncio.gather(*(one(p) for p in prompts))), wakeups[0]

    try:
        steps_before = engine.counters["steps"]
        streams, wakeups = asyncio.run(run())
        steps = engine.counters["steps"] - steps_before
        # The same tokens as the engine gives each prompt alone (batch invariance holds through the hand-over).
        alone = [engine.generate_sync(p, params, timeout_s=120).token_ids for p in prompts[:2]]
    finally:
        engine.stop()
    assert [len(s) for s in streams] == [12] * 8
    assert streams[:2] == alone
    # One per decode step, plus one per prefill (the 8 may be admitted over a few steps); not 8 * 12 = 96.
    assert wakeups <= steps + 8, (wakeups, steps)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_scripted_decode_step_computes_the_python_step_bit_for_bit(loaded: Any, precision: str, attention: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode step runs in TorchScript; the Python step it replaces gives the same bits."""
    prompts = _prompts(loaded, TEXTS)
    kernel = _attention(attention, prompts, monkeypatch)

    def run(scripted: bool, batch: list[list[int]]) -> Any:
        runner = LlamaRunner(loaded.model, precision=precision, prefix_cache_bytes=0, scripted=scripted,  # type: ignore[arg-type]
                             attention_kernel=kernel)
        with torch.inference_mode():
            seqs, logits = runner.prefill(batch)
            out = []
            for _ in range(6):  # past the profiling executor's first runs, and across a cache growth
                logits = runner.decode(seqs, logits.argmax(-1).tolist())
                out.append(logits)
        assert (runner._compiled_step() is not None) == scripted
        return torch.stack(out)

    assert torch.equal(run(True, prompts), run(False, prompts))
    assert torch.equal(run(True, prompts[:1]), run(False, prompts[:1]))


def test_bfloat16_without_the_cpus_bfloat16_kernels_is_emulated(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPUs whose oneDNN has no bfloat16 products (AVX2 only), bfloat16 keeps its numbers and batch invariance."""
    from rl_backend.serving import linear

    monkeypatch.setattr(linear, "bf16_native", lambda: False)
    prompts = _prompts(loaded, TEXTS)
    runner = LlamaRunner(loaded.model, precision="bfloat16", prefix_cache_bytes=0)
    assert runner._packed()[0].qkv.mode == linear.BF16_EMULATED
    with torch.inference_mode():
        _, together = runner.prefill(prompts)
        alone = [runner.prefill([p])[1][0] for p in prompts]
        _, full = LlamaRunner(loaded.model, prefix_cache_bytes=0).prefill(prompts)
    assert all(torch.equal(a, together[i]) for i, a in enumerate(alone))
    gap = (torch.log_softmax(full, -1) - torch.log_softmax(together, -1)).abs().max().item()
    assert 0 < gap < 0.1


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_rows_product_does_not_depend_on_how_many_rows_share_it(precision: str) -> None:
    """Every product, of 1 to 100 rows (decode batches and prefills), gives each row the bits it has alone, at the
    shapes of SmolLM2's fused q/k/v, MLP down and head products; in bfloat16 on CPUs with AMX tiles this needs the
    products split at 32 rows, scripted or not."""
    from rl_backend.serving import scripted
    from rl_backend.serving.linear import PackedLinear

    generator = torch.Generator().manual_seed(0)
    scripted_linear = torch.jit.script(scripted.packed_linear)
    for out_features, in_features in [(960, 576), (576, 1536), (4096, 576)]:
        product = PackedLinear(torch.randn(out_features, in_features, generator=generator) * 0.05, None, precision)  # type: ignore[arg-type]
        x = torch.randn(100, in_features, generator=generator)
        alone = torch.cat([product(x[i:i + 1]) for i in range(len(x))])
        for rows in (2, 8, 32, 33, 47, 64, 100):
            assert torch.equal(product(x[:rows]), alone[:rows]), (out_features, in_features, rows)
        if product.mode is not None:
            assert torch.equal(scripted_linear(x[:70], product.packed, None, product.mode), alone[:70])


def test_decode_env_switches(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_backend.serving.runners import SCRIPTED_DECODE_ENV, make_runner

    monkeypatch.setenv(SCRIPTED_DECODE_ENV, "0")
    assert make_runner(loaded.model, "float32", fast=None, cache_mb=0).scripted is False  # type: ignore[attr-defined]
    monkeypatch.setenv(SCRIPTED_DECODE_ENV, "yes")
    with pytest.raises(ValueError, match=r"\$AGL_SCRIPTED_DECODE must be 0 or 1, got 'yes'"):
        make_runner(loaded.model, "float32", fast=None, cache_mb=0)
    monkeypatch.delenv(SCRIPTED_DECODE_ENV)
    assert make_runner(loaded.model, "float32", fast=None, cache_mb=0).scripted is True  # type: ignore[attr-defined]
    monkeypatch.setenv("AGL_ATTENTION_KERNEL", "0")
    assert make_runner(loaded.model, "float32", fast=None, cache_mb=0).attention_kernel is False  # type: ignore[attr-defined]
    monkeypatch.setenv("AGL_ATTENTION_KERNEL", "no")
    with pytest.raises(ValueError, match=r"\$AGL_ATTENTION_KERNEL must be 0 or 1, got 'no'"):
        make_runner(loaded.model, "float32", fast=None, cache_mb=0)
