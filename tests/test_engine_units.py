"""The engine's bookkeeping on its own: the prefix cache's choices (take over, copy, evict) and the thread policy
(every usable core while others leave them idle, fewer when other processes compute, fixed when told)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rl_backend.serving import threads as threads_mod  # noqa: E402
from rl_backend.serving.prefix_cache import PrefixCache, SeqKV, common_prefix  # noqa: E402
from rl_backend.serving.threads import ThreadPolicy, fixed_threads  # noqa: E402

SHAPE = (2, 1, 4)  # layers, kv heads, head dim


def _seq(tokens: list[int]) -> SeqKV:
    seq = SeqKV.empty(SHAPE, len(tokens), torch.float32, torch.device("cpu"))
    for pos, tok in enumerate(tokens):  # each position's keys and values spell its token, to check what is copied
        seq.k[:, :, pos] = tok
        seq.v[:, :, pos] = -tok
    seq.tokens = list(tokens)
    return seq


def _empty() -> SeqKV:
    return SeqKV.empty(SHAPE, 8, torch.float32, torch.device("cpu"))


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [1, 9, 3]) == 1
    assert common_prefix(list(range(1000)), [*range(777), -1]) == 777
    assert common_prefix([], [1]) == 0


def test_a_next_turn_takes_the_entry_over_and_a_sibling_gets_a_copy() -> None:
    cache = PrefixCache(1 << 20)
    turn1 = list(range(100, 150))  # prompt + reply of a first turn: 50 positions
    cache.put(_seq(turn1))

    # A sibling (the same 40-token prompt, its own reply to come) copies an aligned start and leaves the entry.
    sibling = turn1[:40]
    got = cache.take(sibling, _empty())
    assert got.length == 32 and got.tokens == sibling[:32] and len(cache) == 1
    assert torch.equal(got.k[0, 0, :32, 0], torch.tensor(sibling[:32], dtype=torch.float32))

    # The next turn extends the whole entry: it takes the buffers over (no copy) and the entry leaves the cache.
    turn2 = turn1 + list(range(500, 530))
    entry_kv = cache._entries[next(iter(cache._entries))].kv
    got = cache.take(turn2, _empty())
    assert got.kv is entry_kv and got.length == 48 and len(cache) == 0
    assert cache.hits == 2 and cache.reused_tokens == 32 + 48

    # Reuse stops four positions short of the prompt's end, at a multiple of 16; nothing shorter than 16 is reused.
    cache.put(_seq(turn1))
    assert cache.take(turn1[:20], _empty()).length == 16
    assert cache.take(turn1[:19], _empty()).length == 0
    assert cache.take([7, *turn1], _empty()).length == 0  # a different first token shares nothing


def test_finished_sequences_replace_what_they_extend_and_the_budget_evicts_the_oldest() -> None:
    one = _seq(list(range(64)))
    cache = PrefixCache(3 * one.nbytes)
    cache.put(_seq(list(range(32))))
    cache.put(one)  # extends the first: the first is dropped
    assert len(cache) == 1
    others = [_seq([1000 * i, *range(63)]) for i in (1, 2, 3)]
    for seq in others:
        cache.put(seq)
    assert len(cache) == 3 and cache.nbytes <= 3 * one.nbytes
    assert cache.take([*range(64), 99], _empty()).length == 0  # the oldest (`one`) was evicted
    assert cache.take([3000, *range(63), 99], _empty()).length == 48
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0
    PrefixCache(0).put(one)  # a zero budget keeps nothing


def test_threads_follow_what_other_processes_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(threads_mod.THREADS_ENV, raising=False)
    monkeypatch.setattr(threads_mod, "usable_cores", lambda: [0, 1])
    clock = {"t": 0.0, "busy": 0, "total": 0, "own": 0}
    monkeypatch.setattr(threads_mod, "_busy_ticks", lambda cores: (clock["busy"], clock["total"]))
    monkeypatch.setattr(threads_mod, "_own_ticks", lambda: clock["own"])
    monkeypatch.setattr(threads_mod.time, "monotonic", lambda: clock["t"])
    applied: list[int] = []
    monkeypatch.setattr(threads_mod.torch, "set_num_threads", applied.append)

    def window(busy: int, own: int) -> int:  # half a second on two cores: 100 ticks at 100 Hz
        clock["t"] += 0.5
        clock["busy"] += busy
        clock["total"] += 100
        clock["own"] += own
        return policy.apply()

    policy = ThreadPolicy()
    assert policy.adaptive and policy.apply() == 2  # every usable core to start with
    assert window(busy=100, own=100) == 2  # only this process computes
    assert window(busy=100, own=50) == 1  # another process keeps a core busy
    assert window(busy=95, own=45) == 1
    assert window(busy=60, own=50) == 2  # it is done
    assert window(busy=80, own=20) == 1  # 1.2 cores busy elsewhere: one thread left
    assert applied == [2, 1, 2, 1]  # set only when the choice changes
    assert policy.changes == 3


def test_a_fixed_thread_count_wins_and_a_bad_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(threads_mod.THREADS_ENV, "3")
    assert fixed_threads() == 3 and not ThreadPolicy().adaptive and ThreadPolicy().threads == 3
    assert ThreadPolicy(1).threads == 1
    monkeypatch.setenv(threads_mod.THREADS_ENV, "auto")
    assert fixed_threads() is None
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(threads_mod.THREADS_ENV, bad)
        with pytest.raises(ValueError, match=threads_mod.THREADS_ENV):
            fixed_threads()
    with pytest.raises(ValueError, match="at least 1"):
        ThreadPolicy(0)


def test_the_engine_thread_count_leaves_other_threads_alone() -> None:
    """A trainer in the same process keeps its own thread count when the engine's thread sets another."""
    before = torch.get_num_threads()
    seen: dict[str, Any] = {}

    def engine_thread() -> None:
        ThreadPolicy(1 if before > 1 else 2).apply()
        seen["engine"] = torch.get_num_threads()

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert seen["engine"] != before and torch.get_num_threads() == before


def test_proc_stat_is_read_where_it_exists() -> None:
    cores = threads_mod.usable_cores()
    assert cores
    sample = threads_mod._busy_ticks(cores)
    if threads_mod._PROC_STAT.exists():
        assert sample is not None and 0 <= sample[0] <= sample[1]
        assert (threads_mod._own_ticks() or 0) >= 0
