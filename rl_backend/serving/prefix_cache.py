"""Each sequence's keys and values, and the cache that hands them to the next request starting the same way.

A sequence owns one buffer for its keys and values, [layers, 2, kv_heads, capacity, head_dim], filled for its first
`length` positions, with `tokens` the ids those positions hold. When a request ends, its buffers go to the prefix cache
instead of being freed. A new request takes the entry that shares the longest prefix with its prompt and computes
only the rest. An agent's next turn extends its previous prompt and reply, so it takes the entry over whole (no copy),
while a prompt that shares only a start with an entry (the same system prompt, the same task under another variant)
gets a copy of that start and leaves the entry for others. Entries are evicted least recently used past the byte
budget, and dropped when the weights change.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

# A longer prompt takes an entry over when at most this many of the entry's positions would be overwritten: the tail
# where a reply's sampled tokens and their re-encoding in the next prompt differ (a stop string cut off, another
# split). A prompt no longer than the entry is a sibling (the same start, another reply to come): it gets a copy.
_TAKEOVER_SLACK = 16
_ALIGN = 16
_MIN_NEW = 4


@dataclass(eq=False)
class SeqKV:
    """One sequence's cache: keys and values [layers, 2, kv_heads, capacity, head_dim], the first `length` filled."""

    kv: torch.Tensor
    tokens: list[int] = field(default_factory=list)

    @property
    def k(self) -> torch.Tensor:
        return self.kv[:, 0]

    @property
    def v(self) -> torch.Tensor:
        return self.kv[:, 1]

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def capacity(self) -> int:
        return int(self.kv.shape[3])

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    @classmethod
    def empty(cls, shape: tuple[int, int, int], capacity: int, dtype: torch.dtype, device: torch.device) -> SeqKV:
        layers, heads, dim = shape
        return cls(torch.empty((layers, 2, heads, capacity, dim), dtype=dtype, device=device))

    def reserve(self, n: int) -> None:
        """Make room for `n` positions, keeping what is filled (grows by a quarter to amortize the copies)."""
        if n <= self.capacity:
            return
        cap = n + max(64, n // 4)
        kv = self.kv.new_empty((*self.kv.shape[:3], cap, self.kv.shape[4]))
        kv[:, :, :, : self.length] = self.kv[:, :, :, : self.length]
        self.kv = kv

    def truncate(self, n: int) -> None:
        del self.tokens[n:]


def common_prefix(a: list[int], b: list[int]) -> int:
    """The number of leading ids `a` and `b` share (list slices compare in C; a bisection finds the first mismatch)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    """Finished sequences' caches, least recently used first, within `budget_bytes`."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, budget_bytes)
        self._entries: OrderedDict[int, SeqKV] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def take(self, prompt: list[int], new: SeqKV) -> SeqKV:
        """A cache for `prompt` whose first `length` positions are already computed (a multiple of 16, and at least
        four positions short of the prompt).

        `new` is an empty sequence of the right shape, returned (with a copied prefix, or none) when no entry is taken
        over whole.
        """
        # The last position is always computed: its logits give the first token. Resuming at a multiple of 16 with
        # at least four new positions (and llama_runner._attend's padding) gives each new position the same bits as
        # a prefill of the whole prompt, so a reused prompt computes exactly what a fresh one does.
        limit = len(prompt) - _MIN_NEW
        best, best_len = None, 0
        for key, entry in self._entries.items():
            n = min(common_prefix(entry.tokens, prompt), limit)
            n -= n % _ALIGN
            if n > best_len:
                best, best_len = key, n
        if best is None:
            return new
        entry = self._entries[best]
        self.hits += 1
        self.reused_tokens += best_len
        if len(prompt) > entry.length and entry.length - best_len <= _TAKEOVER_SLACK:
            self._remove(best)
            entry.truncate(best_len)
            return entry
        self._entries.move_to_end(best)
        new.reserve(max(len(prompt), best_len))
        new.kv[:, :, :, :best_len] = entry.kv[:, :, :, :best_len]
        new.tokens = prompt[:best_len]
        return new

    def put(self, seq: SeqKV) -> None:
        """Keep a finished sequence's cache; entries it extends are dropped (it answers every prompt they would)."""
        if seq.length == 0 or seq.nbytes > self.budget_bytes:
            return
        for key in [k for k, e in self._entries.items() if e.length <= seq.length and seq.tokens[: e.length] == e.tokens]:
            self._remove(key)
        self._entries[id(seq)] = seq
        self._bytes += seq.nbytes
        while self._bytes > self.budget_bytes and self._entries:
            self._remove(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _remove(self, key: int) -> None:
        self._bytes -= self._entries.pop(key).nbytes
