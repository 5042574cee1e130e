"""The generation engine: one background thread owns the model and decodes all live requests as one batch.

Continuous batching: each step, requests that arrived since the last step are prefilled together and join the
running batch; then one decode step feeds every row its last token. Rows leave the batch the step they finish or
their client goes away, so a long request never holds up short ones and new requests wait at most one step.

The forward passes belong to a runner: the fast runner (`llama_runner.py`) for Llama-family models on the CPU, which
is batch invariant and reuses a finished request's cache for the next prompt that extends it, or the Hugging Face
forward (`hf_runner.py`) for everything else. Either way a request's token ids and logprobs do not depend on which
other requests shared its steps (bit for bit with the fast runner on the CPUs tested, to about 1e-5 otherwise;
tests/test_serving.py checks token for token).

Drafts (fast runner): while a step has fewer rows than the products compute for the same price (drafts.py), each
greedy row also feeds a guess at the tokens after its next one, taken from its own earlier tokens, and keeps the run
of the guess that greedy decoding confirms: several tokens for one read of the weights. Rows never depend on their
batch, so every token and logprob is the one a step of one token gives; sampled rows are never drafted.

New weights (`load_state_dict`, `load_weights_from_dir`) are applied between batches: admission pauses, the rows in
flight finish on the old weights, the weights are swapped, admission resumes. Every output carries the
`model_version` that produced all of its tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import logging
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .detok import TextTracker
from .drafts import DRAFT_ROWS, LONGEST_DRAFT, lookup
from .drafts import enabled as drafts_enabled
from .handoff import LoopPost
from .linear import Precision
from .llama_runner import LlamaRunner
from .model_store import DEFAULT_MODEL, LoadedModel, chat_prompt_ids, load_model
from .outputs import Completion, Delta, EngineError, RequestState, Sink, merge_deltas
from .runners import make_runner
from .sampling import Choice, SamplingParams, choose, make_generator
from .threads import ThreadPolicy
from .weights import check_state_dict, read_weights_dir

log = logging.getLogger(__name__)


class Engine:
    """Serves one causal LM to many concurrent callers; see the module docstring for the batching scheme."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        max_batch_size: int = 16,
        model_version: str = "base",
        threads: int | None = None,
        precision: Precision = "float32",
        fast: bool | None = None,
        prefix_cache_mb: int | None = None,
        drafts: bool | None = None,
    ) -> None:
        """`threads` fixes the CPU thread count (default: follow the load, see threads.py); `precision` and `fast`
        choose the runner (see make_runner); `prefix_cache_mb` bounds the fast runner's reuse of finished requests;
        `drafts` whether greedy rows check guesses at their next tokens in the same step (drafts.py; default
        $AGL_DRAFTS, on)."""
        self.loaded = loaded
        self.name = loaded.name
        self.tokenizer = loaded.tokenizer
        self.context_length = loaded.context_length
        self.max_batch_size = max_batch_size
        self._model = loaded.model
        self._device = next(self._model.parameters()).device
        self._version = model_version
        self._threads = ThreadPolicy(threads)
        self._runner = make_runner(self._model, precision, fast=fast, cache_mb=prefix_cache_mb)
        self._draft = drafts_enabled(drafts) and isinstance(self._runner, LlamaRunner)
        # What the products compute in: the fast runner's precision, else the dtype the model was loaded in.
        self.precision: str = precision if isinstance(self._runner, LlamaRunner) else str(loaded.model.dtype)[6:]
        # The engine thread decodes with its own tokenizer copy: HF fast tokenizers can fail with "Already
        # borrowed" when one thread encodes while another decodes.
        self._detok_tokenizer = copy.deepcopy(loaded.tokenizer)
        self._cv = threading.Condition()
        self._pending: deque[RequestState] = deque()
        self._swaps: deque[tuple[Callable[[], None], str, concurrent.futures.Future[None]]] = deque()
        self._rows: list[RequestState] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        # One hand-over per event loop that streams from this engine (see handoff.py); loops come and go.
        self._posts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPost] = weakref.WeakKeyDictionary()
        # A step's deltas, sent together once every row has its token (so one loop wake-up carries them all).
        self._outbox: list[tuple[Sink, Delta]] = []
        self._holding: set[LoopPost] | None = None  # while sending a step's deltas: the loops to wake after
        self.counters = {"requests": 0, "tokens": 0, "steps": 0, "row_steps": 0, "draft_tokens": 0,
                         "confirmed_draft_tokens": 0}

    @classmethod
    def from_model(
        cls,
        model: str = DEFAULT_MODEL,
        *,
        device: str | None = None,
        dtype: Any = None,
        max_batch_size: int = 16,
        threads: int | None = None,
        precision: Precision = "float32",
        fast: bool | None = None,
        prefix_cache_mb: int | None = None,
    ) -> Engine:
        """Load `model` (a known name or a local HF directory) and wrap it; call `start()` before use."""
        loaded = load_model(model, device=device, dtype=dtype)
        return cls(
            loaded, max_batch_size=max_batch_size, threads=threads, precision=precision, fast=fast,
            prefix_cache_mb=prefix_cache_mb,
        )

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> Engine:
        """Start the engine thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agl-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def model_version(self) -> str:
        return self._version

    @property
    def runner(self) -> str:
        return "fast" if isinstance(self._runner, LlamaRunner) else "hf"

    @property
    def threads(self) -> int:
        """The CPU threads the engine computes with now."""
        return self._threads.threads

    def stats(self) -> dict[str, Any]:
        return {
            "running": len(self._rows), "waiting": len(self._pending), "model_version": self._version,
            "runner": self.runner, "precision": self.precision, "threads": self._threads.threads,
            **self.counters, **self._runner.counters,
        }

    # ---- requests --------------------------------------------------------------------------------------------

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """Prompt ids for chat `messages` under the model's chat template, ready for the assistant's reply."""
        return chat_prompt_ids(self.tokenizer, messages)

    def max_new_tokens(self, prompt_len: int, params: SamplingParams) -> int:
        """How many tokens a request may generate; raises ValueError (a client mistake) when none fit."""
        room = self.context_length - prompt_len
        if room < 1:
            raise ValueError(
                f"the prompt is {prompt_len} tokens but this model's context is {self.context_length} tokens; "
                "shorten the messages"
            )
        if params.max_tokens is not None and params.max_tokens > room:
            raise ValueError(
                f"max_tokens is {params.max_tokens} but only {room} tokens fit after the {prompt_len}-token prompt "
                f"in this model's {self.context_length}-token context; lower max_tokens or shorten the messages"
            )
        return params.max_tokens if params.max_tokens is not None else room

    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink) -> RequestState:
        """Queue a request; `sink` receives its Deltas (or an exception) from the engine thread."""
        params.validate()
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        vocab = int(getattr(self._model.config, "vocab_size", 0) or len(self.tokenizer))
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt token ids must be between 0 and {vocab - 1}")
        max_new = self.max_new_tokens(len(prompt_ids), params)
        req = RequestState(
            prompt=list(prompt_ids),
            params=params,
            max_new=max_new,
            sink=sink,
            generator=make_generator(params.seed, self._device),
            tracker=TextTracker(self._detok_tokenizer, params.stop),
        )
        with self._cv:
            if self._stopping:
                raise EngineError("the engine is stopped")
            self._pending.append(req)
            self.counters["requests"] += 1
            self._cv.notify_all()
        return req

    def cancel(self, req: RequestState) -> None:
        """Stop generating for `req` (its client went away); other requests are unaffected."""
        req.cancelled = True

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[Delta]:
        """Queue a generation now and return an iterator over its Deltas; closing the iterator cancels it.

        Call from a coroutine (it binds to the running event loop). Bad parameters raise ValueError right here,
        before anything is queued. Deltas that piled up while the consumer was busy come merged into one.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
        holder: list[RequestState] = []
        with self._cv:
            post = self._posts.get(loop)
            if post is None:
                post = self._posts[loop] = LoopPost(loop)

        def sink(item: Delta | BaseException) -> None:  # called on the engine thread only
            try:
                if self._holding is None:
                    post.post(queue.put_nowait, item)
                else:
                    post.put(queue.put_nowait, item)
                    self._holding.add(post)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                holder[0].cancelled = True

        holder.append(self.submit(prompt_ids, params, sink))
        return self._iterate(holder[0], queue)

    async def _iterate(self, req: RequestState, queue: asyncio.Queue[Delta | BaseException]) -> AsyncIterator[Delta]:
        finished = False
        try:
            while not finished:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                for item in items:
                    if isinstance(item, BaseException):
                        raise EngineError(f"generation failed: {item}") from item
                merged = merge_deltas([i for i in items if isinstance(i, Delta)])
                finished = merged.finish_reason is not None
                yield merged
        finally:
            if not finished:
                self.cancel(req)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        out = Completion(prompt_token_ids=list(prompt_ids))
        async for delta in self.stream(prompt_ids, params):
            out.extend(delta)
        return out

    def generate_sync(self, prompt_ids: list[int], params: SamplingParams, timeout_s: float | None = None) -> Completion:
        """Blocking generation for callers outside any event loop (scripts, the trainer)."""
        out = Completion(prompt_token_ids=list(prompt_ids))
        done = threading.Event()
        error: list[BaseException] = []

        def sink(item: Delta | BaseException) -> None:
            if isinstance(item, BaseException):
                error.append(item)
                done.set()
                return
            out.extend(item)
            if item.finish_reason is not None:
                done.set()

        req = self.submit(prompt_ids, params, sink)
        if not done.wait(timeout_s):
            self.cancel(req)
            raise TimeoutError(f"generation did not finish within {timeout_s} s")
        if error:
            raise EngineError(f"generation failed: {error[0]}") from error[0]
        return out

    # ---- weights ---------------------------------------------------------------------------------------------

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: str, timeout_s: float | None = None) -> None:
        """Serve `state_dict` as `version` from the next batch on; blocks until swapped.

        Requests in flight finish on the old weights first (admission pauses meanwhile). Tensors are copied, so the
        caller may keep training its own. Keys and shapes are checked before anything pauses.
        """
        check_state_dict(self._model, state_dict)

        def apply() -> None:
            self._model.load_state_dict(dict(state_dict), strict=False)

        self._swap(apply, version, timeout_s)

    def load_weights_from_dir(self, path: str | Path, version: str, timeout_s: float | None = None) -> None:
        """Like load_state_dict, from a Hugging Face checkpoint directory (safetensors or pytorch_model.bin)."""
        self.load_state_dict(read_weights_dir(Path(path)), version, timeout_s)

    def _swap(self, apply: Callable[[], None], version: str, timeout_s: float | None) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError("load weights from another thread than the engine's")
        if not version or not isinstance(version, str):
            raise ValueError("version must be a non-empty string")
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._cv:
            self._swaps.append((apply, version, fut))
            self._cv.notify_all()
        fut.result(timeout_s)

    # ---- the engine thread -----------------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            if self._device.type == "cpu":
                self._threads.apply()
            try:
                self._runner.refresh()  # on this thread, which computes with what it packs
            except Exception:
                log.exception("the model could not be prepared")
                with self._cv:
                    self._stopping = True
            while not self._stopping:
                admit, swap = self._next_work()
                if self._stopping:
                    break
                if self._device.type == "cpu":
                    self._threads.apply()
                try:
                    if swap is not None:
                        self._apply_swap(*swap)
                        continue
                    if admit:
                        self._prefill(admit)
                    if self._rows:
                        self._decode_step()
                except Exception as exc:  # the model itself failed: fail what is in flight, keep serving
                    log.exception("engine step failed")
                    self._fail_rows(exc)
        self._fail_rows(EngineError("the engine stopped"))
        with self._cv:
            pending, self._pending = list(self._pending), deque()
            swaps, self._swaps = list(self._swaps), deque()
        for req in pending:
            req.sink(EngineError("the engine stopped"))
        for _, _, fut in swaps:
            fut.set_exception(EngineError("the engine stopped"))

    def _next_work(self) -> tuple[list[RequestState], tuple[Callable[[], None], str, Any] | None]:
        with self._cv:
            while True:
                if self._stopping:
                    return [], None
                if self._swaps:
                    # Admission pauses until the batch drains, so no output mixes two model versions.
                    if not self._rows:
                        return [], self._swaps.popleft()
                    return [], None
                admit: list[RequestState] = []
                while self._pending and len(self._rows) + len(admit) < self.max_batch_size:
                    req = self._pending.popleft()
                    if not req.cancelled:
                        admit.append(req)
                if admit or self._rows:
                    return admit, None
                self._cv.wait()

    def _apply_swap(self, apply: Callable[[], None], version: str, fut: concurrent.futures.Future[None]) -> None:
        try:
            apply()
        except Exception as exc:
            fut.set_exception(exc)
            return
        finally:
            self._runner.refresh()  # whatever the model holds now, the runner computes with it
        self._version = version
        log.info("now serving model version %s", version)
        fut.set_result(None)

    def _prefill(self, admit: list[RequestState]) -> None:
        for req in admit:
            req.version = self._version
        try:
            seqs, logits = self._runner.prefill([req.prompt for req in admit])
            choices = choose(logits, [r.params for r in admit], [r.generator for r in admit])
        except Exception as exc:
            log.exception("prefill failed")
            for req in admit:
                req.sink(exc)
            return
        done = []
        try:
            for req, seq, choice in zip(admit, seqs, choices, strict=True):
                req.seq = seq
                if self._accept(req, choice):
                    done.append(seq)
                else:
                    self._rows.append(req)
        finally:
            self._send()
        if done:
            self._runner.release(done)

    def _decode_step(self) -> None:
        if any(r.cancelled for r in self._rows):
            self._runner.release([r.seq for r in self._rows if r.cancelled])
            self._rows = [r for r in self._rows if not r.cancelled]
            if not self._rows:
                return
        rows = self._rows
        drafts = self._drafts(rows)
        if drafts is None:
            logits = self._runner.decode([r.seq for r in rows], [r.last for r in rows])
            per_row = [[c] for c in choose(logits, [r.params for r in rows], [r.generator for r in rows])]
        else:
            lengths = [r.seq.length for r in rows]
            logits = self._runner.decode([r.seq for r in rows], [r.last for r in rows], drafts)
            per_row = self._confirmed(rows, drafts, logits)
        self.counters["steps"] += 1
        self.counters["row_steps"] += len(rows)
        try:
            # (finished, choices taken): a cancelled row takes none, and keeps the token it was fed
            outcomes = [(True, 1) if r.cancelled else self._accept_run(r, cs) for r, cs in zip(rows, per_row, strict=True)]
        finally:
            self._send()
        if drafts is not None:
            for r, n, (_, taken) in zip(rows, lengths, outcomes, strict=True):
                # The fed tokens are kept up to the last one whose successor was taken: a draft's wrong guesses
                # and whatever followed them in the cache are overwritten by the next step.
                r.seq.truncate(n + taken)
        finished = [f for f, _ in outcomes]
        if any(finished):
            self._runner.release([r.seq for r, f in zip(rows, finished, strict=True) if f])
            self._rows = [r for r, f in zip(rows, finished, strict=True) if not f]

    def _drafts(self, rows: list[RequestState]) -> list[list[int]] | None:
        """Each greedy row's guess at the tokens after its next one (drafts.py), within the rows a step computes
        for the price of one; None where no row has one."""
        room = DRAFT_ROWS - len(rows)
        if not self._draft or room <= 0:
            return None
        drafts: list[list[int]] = []
        for r in rows:
            limit = min(room, LONGEST_DRAFT, r.max_new - r.generated - 1)
            draft = lookup([*r.seq.tokens, r.last], limit) if r.params.greedy and limit > 0 else []
            room -= len(draft)
            drafts.append(draft)
        return drafts if any(drafts) else None

    def _confirmed(self, rows: list[RequestState], drafts: list[list[int]], logits: torch.Tensor) -> list[list[Choice]]:
        """Each row's choices after a step that checked drafts: its next token and, while greedy decoding picks
        the draft's token, the token after each confirmed one. Chosen from the same rows of logits one token per
        step would have given (a row's result does not depend on its batch), so the same tokens and logprobs."""
        picked = logits.argmax(dim=-1).tolist()
        keep: list[int] = []
        counts: list[int] = []
        start = 0
        for draft in drafts:
            confirmed = 0
            while confirmed < len(draft) and picked[start + confirmed] == draft[confirmed]:
                confirmed += 1
            keep += range(start, start + confirmed + 1)
            counts.append(confirmed + 1)
            start += 1 + len(draft)
        self.counters["draft_tokens"] += sum(len(d) for d in drafts)
        self.counters["confirmed_draft_tokens"] += len(keep) - len(rows)
        runs = [r for r, count in zip(rows, counts, strict=True) for _ in range(count)]
        choices = choose(logits[keep], [r.params for r in runs], [r.generator for r in runs])
        out: list[list[Choice]] = []
        for count in counts:
            out.append(choices[:count])
            choices = choices[count:]
        return out

    def _accept_run(self, req: RequestState, choices: list[Choice]) -> tuple[bool, int]:
        """Accept a row's choices of one step in order, up to the one that finishes the request (those after it
        were computed past its end); (whether it finished, how many were taken)."""
        for taken, choice in enumerate(choices, start=1):
            if self._accept(req, choice):
                return True, taken
        return False, len(choices)

    def _accept(self, req: RequestState, choice: Choice) -> bool:
        """Record a chosen token and send it on; returns True when the request is finished."""
        req.last = choice.token_id
        req.generated += 1
        self.counters["tokens"] += 1
        is_stop_token = choice.token_id in self.loaded.stop_token_ids and not req.params.ignore_eos
        text = "" if is_stop_token else req.tracker.add(choice.token_id)
        finish: str | None = None
        if is_stop_token or req.tracker.stopped:
            finish = "stop"
        elif req.generated >= req.max_new:
            finish = "length"
        if finish is not None:
            text += req.tracker.finish()
        self._outbox.append((req.sink, Delta([choice.token_id], [choice], text, finish, req.version)))
        return finish is not None

    def _send(self) -> None:
        outbox, self._outbox = self._outbox, []
        self._holding = set()
        try:
            for sink, delta in outbox:
                sink(delta)
        finally:
            held, self._holding = self._holding, None
            for post in held:
                # A loop that closed meanwhile raises; its streams are cancelled as they next send.
                with contextlib.suppress(RuntimeError):
                    post.wake()

    def _fail_rows(self, exc: BaseException) -> None:
        rows, self._rows = self._rows, []
        self._runner.clear()
        for req in rows:
            req.sink(exc)
