"""Drafts checked in one decode step (rl_backend/serving/drafts.py, engine.py): the lookup guesses from a sequence's
own earlier tokens, the runner computes a sequence's next positions in one step with the bits of one token a step,
and the engine with drafts gives exactly the tokens, logprobs and text it gives without them, within every limit a
request sets (max_tokens, stop strings), sampled requests untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rl_backend.serving.drafts import enabled, lookup

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rl_backend.serving.engine import Engine  # noqa: E402
from rl_backend.serving.llama_runner import LlamaRunner  # noqa: E402
from rl_backend.serving.model_store import load_model  # noqa: E402
from rl_backend.serving.sampling import SamplingParams  # noqa: E402
from tests.test_engine import ATTENTION, TEXTS, _attention, _prompts  # noqa: E402


@pytest.fixture(scope="module")
def loaded(tiny_chat_model: Path) -> Any:
    return load_model(str(tiny_chat_model), device="cpu")


def test_lookup_takes_what_followed_the_latest_longest_match() -> None:
    tokens = [5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 4, 2, 3]
    assert lookup(tokens, 2) == [7, 8]  # "2 3" last occurred before "7 8" (not before "9 9")
    assert lookup(tokens + [7], 5) == [8, 4, 2, 3, 7]  # "2 3 7" matched; a draft may run into the tail itself
    assert lookup([1, 2, 3, 4], 3) == []  # 4 never occurred before
    assert lookup([4, 4, 4], 3) == [4]  # the tail never matches itself: the match ends a token before it
    assert lookup([1, 2, 1], 0) == [] and lookup([1], 3) == []
    # A longer match wins over a later, shorter one.
    assert lookup([6, 1, 2, 8, 0, 2, 5, 6, 1, 2], 1) == [8]


def test_the_switch_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_DRAFTS", "0")
    assert not enabled() and enabled(True)
    monkeypatch.setenv("AGL_DRAFTS", "maybe")
    with pytest.raises(ValueError, match=r"\$AGL_DRAFTS must be 0 or 1, got 'maybe'"):
        enabled()


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_sequences_next_positions_in_one_step_are_one_token_a_step(loaded: Any, precision: str, attention: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Feeding a sequence its next token and the tokens that truly follow in one step gives, row for row, the logits
    of one token a step, bit for bit; a wrong guess changes nothing before it, and truncating drops it."""
    prompts = _prompts(loaded, TEXTS)
    kernel = _attention(attention, prompts, monkeypatch)
    runner = LlamaRunner(loaded.model, precision=precision, prefix_cache_bytes=0,  # type: ignore[arg-type]
                         attention_kernel=kernel)
    with torch.inference_mode():
        seqs, logits = runner.prefill(prompts)
        fed = [logits.argmax(-1).tolist()]
        steps = []
        for _ in range(5):
            steps.append(runner.decode(seqs, fed[-1]))
            fed.append(steps[-1].argmax(-1).tolist())
        truth = [s.tokens[len(p):] for s, p in zip(seqs, prompts, strict=True)]

        seqs, _ = runner.prefill(prompts)
        first = [t[0] for t in truth]
        wrong = (truth[1][2] + 1) % int(loaded.model.config.vocab_size)
        drafts = [truth[0][1:4], [truth[1][1], wrong], []]  # all right; right then wrong; none
        checked = runner.decode(seqs, first, drafts)
    assert checked.shape[0] == 4 + 3 + 1
    assert [torch.equal(checked[i], steps[i][0]) for i in range(4)] == [True] * 4
    assert torch.equal(checked[4], steps[0][1]) and torch.equal(checked[5], steps[1][1])  # before the wrong guess
    assert torch.equal(checked[7], steps[0][2])
    assert seqs[1].tokens[len(prompts[1]):] == [truth[1][0], truth[1][1], wrong]  # fed, for the caller to truncate


@pytest.fixture(scope="module")
def smollm(smollm2: None) -> Any:
    return load_model("smollm2-135m-instruct")


def _run(loaded: Any, drafts: bool, requests: list[tuple[list[int], SamplingParams]]) -> tuple[list[Any], dict[str, int]]:
    engine = Engine(loaded, max_batch_size=8, threads=2, prefix_cache_mb=0, drafts=drafts).start()
    try:
        outs = [engine.generate_sync(p, params, timeout_s=300) for p, params in requests]
    finally:
        engine.stop()
    return [(c.token_ids, [(x.token_id, x.logprob, x.top) for x in c.logprobs], c.text, c.finish_reason)
            for c in outs], engine.counters


QUESTIONS = ["List the days of the week, one per line, twice.", "Why do cats purr?"]


def test_the_engine_gives_the_same_outputs_with_drafts_as_without(smollm: Any) -> None:
    prompts = [smollm.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                    tokenize=True)["input_ids"] for q in QUESTIONS]
    greedy = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True, top_logprobs=2)
    requests = [(p, greedy) for p in prompts]
    requests.append((prompts[0], SamplingParams(max_tokens=21, temperature=0.0, ignore_eos=True)))  # ends mid-run
    requests.append((prompts[1], SamplingParams(max_tokens=24, temperature=0.9, seed=3, ignore_eos=True)))  # sampled
    without, plain = _run(smollm, False, requests)
    with_drafts, counters = _run(smollm, True, requests)
    assert with_drafts == without
    assert plain["draft_tokens"] == 0
    assert counters["confirmed_draft_tokens"] > 0, counters  # the path under test ran
    assert counters["steps"] < plain["steps"]
    assert len(with_drafts[2][0]) == 21

    # A stop string that falls inside a step's confirmed tokens ends the text there, as it does one token a step.
    text = without[0][2]
    # The first stretch of 12 characters past the middle not seen before: where the repeated list has drafts.
    at = next(k for k in range(len(text) // 2, len(text) - 12) if text.find(text[k : k + 12]) == k)
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True, stop=[text[at : at + 12]])
    stopped_without, _ = _run(smollm, False, [(prompts[0], params)])
    stopped, _ = _run(smollm, True, [(prompts[0], params)])
    assert stopped == stopped_without
    assert stopped[0][2] == text[:at] and stopped[0][3] == "stop"
