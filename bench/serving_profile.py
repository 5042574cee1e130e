"""Where one decode step of the embedded engine goes, at a full batch: the serving benchmark's profile.

`profile_engine` runs inside the benchmark's agl worker process, on its engine. It submits the batch's requests
straight to the engine (no HTTP), times every decode step that runs with the whole batch, and splits the engine
thread's time into:
- matmuls: the packed linear products of the layers (q/k/v, output, gate/up, down), and apart from them the
  vocabulary head's (its weight alone is a fifth of the model: read whole every step, whatever the batch);
- attention: storing each row's new key and value and attending its query over its own cache;
- other model ops: embeddings, RMS norms, rotary embeddings, residual additions, the SiLU gate;
- sampling: log-softmax, argmax/sampling and the chosen logprobs (`choose`);
- detokenization: the incremental text of each new token (`TextTracker`);
- engine bookkeeping: the rest of the step (accepting tokens, handing deltas to their streams).
The HTTP side and the event loop are measured by difference: the benchmark's client times the same batch through
the server (`http_step_ms`: wall time per decode step, the server's step count read before and after), and what
the direct run does not spend is what serving it over HTTP costs (SSE framing, JSON, the event loop, the client,
and their contention with the compute threads for the same cores).

The timers wrap functions for the duration of one call and are removed after; nothing here changes what the engine
computes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PARTS = (
    "matmuls (layers)", "matmul (vocabulary head)", "attention", "other model ops", "sampling", "detokenization",
    "engine bookkeeping", "HTTP and event loop",
)


class _Clock:
    """Sums the time spent inside wrapped functions while a full-batch decode step runs (engine thread only)."""

    def __init__(self) -> None:
        self.on = False
        self.totals: dict[str, float] = {}
        # Held for a whole step: the last token's sink wakes the caller inside the step, before its time is added.
        self.lock = threading.Lock()

    def wrap(self, owner: Any, name: str, part: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return original(*args, **kwargs)
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.totals[part] = self.totals.get(part, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)


@contextmanager
def _timers(engine: Any, batch: int, clock: _Clock) -> Iterator[None]:
    from rl_backend.serving import detok, linear
    from rl_backend.serving import engine as engine_module

    runner = engine._runner
    undo = [
        clock.wrap(linear.PackedLinear, "__call__", "matmuls"),
        clock.wrap(runner, "_decode_attention", "attention"),
        clock.wrap(runner, "decode", "model"),
        clock.wrap(runner, "_head", "head"),
        clock.wrap(engine_module, "choose", "sampling"),
        clock.wrap(detok.TextTracker, "add", "detokenization"),
        clock.wrap(detok.TextTracker, "finish", "detokenization"),
    ]
    original_step = engine._decode_step

    def step() -> None:
        with clock.lock:
            clock.on = len(engine._rows) == batch
            start = time.perf_counter()
            try:
                original_step()
            finally:
                if clock.on:
                    clock.totals["step"] = clock.totals.get("step", 0.0) + time.perf_counter() - start
                    clock.totals["steps"] = clock.totals.get("steps", 0.0) + 1
                clock.on = False

    engine._decode_step = step
    try:
        yield
    finally:
        del engine._decode_step
        for u in reversed(undo):
            u()


def profile_engine(engine: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """Decode `prompts` together, straight on `engine`; milliseconds per full-batch decode step, by part."""
    from rl_backend.serving.sampling import SamplingParams

    if getattr(engine._runner, "_decode_attention", None) is None:
        return {"error": "the profile needs the fast runner"}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    clock = _Clock()
    done = threading.Semaphore(0)
    with _timers(engine, len(prompts), clock):
        steps_before = engine.counters["steps"]
        start = time.perf_counter()
        def sink(item: Any) -> None:
            if isinstance(item, BaseException) or item.finish_reason is not None:
                done.release()

        for p in prompts:
            engine.submit(p, params, sink)
        for _ in prompts:
            done.acquire()
        wall = time.perf_counter() - start
        with clock.lock:
            steps = engine.counters["steps"] - steps_before
            t = dict(clock.totals)
    n = max(1.0, t.get("steps", 0.0))
    ms = {k: 1000 * v / n for k, v in t.items() if k != "steps"}
    matmul, attention, model = ms.get("matmuls", 0.0), ms.get("attention", 0.0), ms.get("model", 0.0)
    head = ms.get("head", 0.0)
    parts = {
        "matmuls (layers)": matmul - head, "matmul (vocabulary head)": head, "attention": attention,
        "other model ops": model - matmul - attention,
        "sampling": ms.get("sampling", 0.0), "detokenization": ms.get("detokenization", 0.0),
    }
    parts["engine bookkeeping"] = ms.get("step", 0.0) - sum(parts.values())
    return {
        "rows": len(prompts), "full_batch_steps": int(n), "step_ms": round(ms.get("step", 0.0), 3),
        "direct_ms_per_step": round(1000 * wall / max(1, steps), 3),
        "parts_ms": {k: round(v, 3) for k, v in parts.items()},
    }


def with_http(profile: dict[str, Any], http_ms_per_step: float) -> dict[str, Any]:
    """Add the HTTP and event-loop share (by difference) and each part's share of the step as served."""
    out = dict(profile)
    parts = dict(profile["parts_ms"])
    parts["HTTP and event loop"] = max(0.0, http_ms_per_step - profile["direct_ms_per_step"])
    # What the direct run spent outside full-batch steps (prefill, steps with fewer rows) is no part of either.
    total = sum(parts.values())
    out["http_ms_per_step"] = round(http_ms_per_step, 3)
    out["parts_ms"] = {k: round(v, 3) for k, v in parts.items()}
    out["shares"] = {k: round(v / total, 3) for k, v in parts.items()} if total > 0 else {}
    return out


def format_profile(profile: dict[str, Any]) -> str:
    lines = [f"one decode step at {profile['rows']} sequences (mean of {profile['full_batch_steps']} steps): "
             f"{profile['step_ms']:.2f} ms in the engine, {profile.get('http_ms_per_step', 0.0):.2f} ms per step "
             "as served over HTTP"]
    for part, value in sorted(profile["parts_ms"].items(), key=lambda kv: -kv[1]):
        share = profile.get("shares", {}).get(part)
        lines.append(f"  {part:26s} {value:7.2f} ms" + (f"  {share:6.1%}" if share is not None else ""))
    return "\n".join(lines)
