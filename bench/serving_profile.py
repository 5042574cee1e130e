"""Where one decode step of the embedded engine goes, at a full batch: the serving benchmark's profile.

`profile_engine` runs inside the benchmark's agl worker process, on its engine. It submits the batch's requests
straight to the engine (no HTTP), times every decode step that runs with the whole batch, and splits the engine
thread's time into:
- matmuls: the packed linear products of the layers (q/k/v, output, gate/up, down), and apart from them the
  vocabulary head's (its weight alone is a fifth of the model: read whole every step, whatever the batch);
- attention: storing each row's new key and value and attending its query over its own cache;
- other model ops: embeddings, RMS norms, rotary embeddings, residual additions, the SiLU gate (one compiled
  operator each where the fused step runs, `scripted.fused_layers`);
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
        self.inside: set[str] = set()  # the parts being timed now
        # Held for a whole step: the last token's sink wakes the caller inside the step, before its time is added.
        self.lock = threading.Lock()

    def wrap(self, owner: Any, name: str, part: str, also: Callable[..., str | None] | None = None) -> Callable[[], None]:
        """Time `owner.name` as `part`, and also as the part `also(*args)` names, if any."""
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on or part in self.inside:  # a product inside a product is timed once
                return original(*args, **kwargs)
            start = time.perf_counter()
            self.inside.add(part)
            try:
                return original(*args, **kwargs)
            finally:
                self.inside.discard(part)
                spent = time.perf_counter() - start
                for counted in (part, also(*args) if also is not None else None):
                    if counted is not None:
                        self.totals[counted] = self.totals.get(counted, 0.0) + spent

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)


@contextmanager
def _timers(engine: Any, batch: int, clock: _Clock) -> Iterator[None]:
    from rl_backend.serving import detok, linear, scripted
    from rl_backend.serving import engine as engine_module

    runner = engine._runner
    head_weight = runner._head.packed  # before `_head` is wrapped
    undo = [
        clock.wrap(linear.PackedLinear, "__call__", "matmuls"),
        clock.wrap(runner, "_decode_attention", "attention"),
        # The fused step (scripted.fused_layers, in Python here) calls the products and the attention directly.
        clock.wrap(scripted, "packed_product", "matmuls",
                   lambda x, weight, mode: "head" if weight is head_weight else None),
        clock.wrap(scripted, "attend_step", "attention"),
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


def _direct_run(engine: Any, prompts: list[list[int]], max_tokens: int, clock: _Clock) -> tuple[float, int]:
    """Submit `prompts` together straight to the engine and wait for all: (wall seconds, decode steps)."""
    from rl_backend.serving.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    done = threading.Semaphore(0)

    def sink(item: Any) -> None:
        if isinstance(item, BaseException) or item.finish_reason is not None:
            done.release()

    steps_before = engine.counters["steps"]
    start = time.perf_counter()
    for p in prompts:
        engine.submit(p, params, sink)
    for _ in prompts:
        done.acquire()
    wall = time.perf_counter() - start
    with clock.lock:
        return wall, engine.counters["steps"] - steps_before


def profile_engine(engine: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """Decode `prompts` together, straight on `engine`; milliseconds per full-batch decode step, by part.

    The parts are timed on the Python decode step (a scripted step is one call, with nothing inside to time);
    where the engine serves scripted steps, a second run times those whole (`scripted_step_ms`), and that run's
    wall time per step is what serving over HTTP is compared with."""
    runner = engine._runner
    if getattr(runner, "_decode_attention", None) is None:
        return {"error": "the profile needs the fast runner"}
    was_scripted = runner.scripted
    scripted = was_scripted and runner._compiled_step() is not None
    clock = _Clock()
    runner.scripted = False
    try:
        with _timers(engine, len(prompts), clock):
            wall, steps = _direct_run(engine, prompts, max_tokens, clock)
            with clock.lock:
                t = dict(clock.totals)
    finally:
        runner.scripted = was_scripted
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
    out: dict[str, Any] = {
        "rows": len(prompts), "full_batch_steps": int(n), "step_ms": round(ms.get("step", 0.0), 3),
        "direct_ms_per_step": round(1000 * wall / max(1, steps), 3), "scripted": scripted,
        "parts_ms": {k: round(v, 3) for k, v in parts.items()},
    }
    if scripted:
        whole = _Clock()
        with _timers(engine, len(prompts), whole):
            wall, steps = _direct_run(engine, prompts, max_tokens, whole)
            with whole.lock:
                t = dict(whole.totals)
        out["scripted_step_ms"] = round(1000 * t.get("step", 0.0) / max(1.0, t.get("steps", 0.0)), 3)
        out["python_direct_ms_per_step"] = out["direct_ms_per_step"]
        out["direct_ms_per_step"] = round(1000 * wall / max(1, steps), 3)
    return out


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
             f"{profile['step_ms']:.2f} ms in the engine's Python step, {profile.get('http_ms_per_step', 0.0):.2f} "
             "ms per step as served over HTTP"]
    if "scripted_step_ms" in profile:
        lines.append(f"  the scripted step served: {profile['scripted_step_ms']:.2f} ms in the engine "
                     "(the parts below are the Python step's)")
    for part, value in sorted(profile["parts_ms"].items(), key=lambda kv: -kv[1]):
        share = profile.get("shares", {}).get(part)
        lines.append(f"  {part:26s} {value:7.2f} ms" + (f"  {share:6.1%}" if share is not None else ""))
    return "\n".join(lines)
