"""From generated token ids to text, incrementally, with stop strings; and the bytes of single tokens.

Text is always derived from the generated ids (never the other way round), so a client that decodes the returned
`token_ids` with `skip_special_tokens=True` gets exactly the returned text, unless a stop string cut it short.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any


class TextTracker:
    """Turns a growing list of token ids into text deltas safe to send, and spots stop strings.

    Uses the usual two-offset window (as in TGI and vLLM): decoding only the last few ids keeps each step O(1), and a
    delta is released only once it no longer ends in an incomplete UTF-8 sequence. Text that could be the start of a
    stop string is held back until it is clear that it is not one.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._longest_stop = max((len(s) for s in self._stop), default=0)
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self.text = ""  # decoded so far (stop string removed once found)
        self._sent = 0  # chars of self.text released to the client
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))

    def add(self, token_id: int) -> str:
        """Add one generated id; returns the text newly safe to send (possibly empty)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        new_text = self._decode(self.ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            scan_from = max(0, len(self.text) - self._longest_stop + 1)
            self.text += new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self.ids)
            self._check_stop(scan_from)
        return self._release()

    def finish(self) -> str:
        """Generation ended: settle the final text exactly as decoding all ids gives it; returns the unsent rest."""
        if not self.stopped:
            self.text = self._decode(self.ids)
            self._check_stop(0)
        rest = self.text[self._sent :]
        self._sent = len(self.text)
        return rest

    def _check_stop(self, scan_from: int) -> None:
        hits = [i for i in (self.text.find(s, scan_from) for s in self._stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True

    def _release(self) -> str:
        end = len(self.text)
        if not self.stopped:
            end -= self._partial_stop_suffix()
        end = max(end, self._sent)
        out = self.text[self._sent : end]
        self._sent = end
        return out

    def _partial_stop_suffix(self) -> int:
        """Length of the longest end of the text that is a proper prefix of some stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best


@lru_cache(maxsize=4)
def _byte_decoder() -> dict[str, int]:
    # The GPT-2 byte-to-unicode table that byte-level BPE tokenizers use to spell raw bytes as printable chars.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class TokenText:
    """The display text and UTF-8 bytes of single tokens (for OpenAI-shaped logprobs), cached per id."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_level = type(decoder).__name__ == "ByteLevel"
        self._special = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", []))

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is not None:
            return hit
        text = str(self._tok.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False))
        raw = text.encode("utf-8")
        if self._byte_level and token_id not in self._special:
            piece = self._tok.convert_ids_to_tokens(token_id)
            table = _byte_decoder()
            if isinstance(piece, str) and all(ch in table for ch in piece):
                raw = bytes(table[ch] for ch in piece)
        if len(self._cache) < 200_000:
            self._cache[token_id] = (text, list(raw))
        return text, list(raw)
