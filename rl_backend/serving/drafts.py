"""Guesses at a sequence's next tokens, taken from its own earlier tokens, for the engine to check in one step.

Text repeats itself: a name, a phrase of the prompt, a line of code, a list's pattern. Where the last few tokens
occurred before, the tokens that followed them then are a cheap guess at what follows now (n-gram lookup, as in
prompt lookup decoding). The engine feeds such a draft after a row's next token in the same decode step
(`LlamaRunner.decode`), keeps the longest run of it that greedy decoding confirms, and drops the rest. A row's
result never depends on the other rows in its step, so the tokens and logprobs are exactly those of one token per
step; what changes is how many tokens one read of the weights yields.
"""

from __future__ import annotations

import os

# Rows a step may fill with drafts: the float32 panel product computes rows in blocks of 8 (decode_ops.cpp), so a
# step of fewer rows reads the weights for the same time whatever fills the block; drafts use only that room.
DRAFT_ROWS = 8
LONGEST_MATCH = 3
# The most tokens one row guesses per step: a longer guess is rarely confirmed whole, and each guessed row costs its
# attention and sampling (on the serving benchmark's prompts, one request: 7 tokens 52.2 tok/s, 3 tokens 54.2, 1
# token 52.7, none 48.5).
LONGEST_DRAFT = 3
ENV = "AGL_DRAFTS"  # "0" decodes one token per row per step (the same tokens, to compare the two)


def enabled(requested: bool | None = None) -> bool:
    """Whether the engine checks drafts: `requested`, else $AGL_DRAFTS (default 1)."""
    if requested is not None:
        return requested
    value = os.environ.get(ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"${ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def lookup(tokens: list[int], limit: int, longest: int = LONGEST_MATCH) -> list[int]:
    """Up to `limit` tokens that followed the latest earlier occurrence of the last n tokens of `tokens`, trying n
    from `longest` down to 1; [] where none occurred."""
    end = len(tokens)
    if limit <= 0 or end < 2:
        return []
    reversed_tokens = tokens[::-1]  # list.index searches forward, in C: search the reversed list for the latest
    for n in range(min(longest, end - 1), 0, -1):
        tail = tokens[end - n :]
        last = tail[-1]
        at = 1  # reversed, position 0 is the tail's own end: an earlier occurrence ends before it
        while True:
            try:
                at = reversed_tokens.index(last, at)
            except ValueError:
                break
            stop = end - at  # the candidate occurrence is tokens[stop - n : stop]
            if stop >= n and tokens[stop - n : stop] == tail:
                return tokens[stop : stop + limit]
            at += 1
    return []
