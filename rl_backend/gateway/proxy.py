"""One proxied call, end to end: upstream request, response or stream passed on, and exactly one call record.

`ProxyCall` is the ASGI response for a call that passed auth and validation. It runs the upstream exchange while
watching for the agent to hang up; when it does, the upstream request is cancelled (its connection closed) and the
record says so. Every run writes one record, failures included. The record is committed before the agent gets the
response's last byte (the body, or a stream's terminal event), so a call the agent saw finish is in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope, Send

from rl_backend.gateway.budget import REFUSAL_CODE, REFUSAL_STATUS, SpendLimit, WorstCase, worst_case_tokens
from rl_backend.gateway.errors import error_body, upstream_error_message
from rl_backend.gateway.exchange import Exchange, ImpossibleUsage
from rl_backend.gateway.finished_call import Ending, build_record
from rl_backend.gateway.h1client import DeadlinePassed, HTTPError, ReadTimeout
from rl_backend.gateway.jsonfast import dumps, loads
from rl_backend.gateway.oversize import KEEP_BYTES, MAX_EVENT_BYTES, Tail, model_in
from rl_backend.gateway.pricing import PriceTable
from rl_backend.gateway.sse import EventTooLarge, SSEDecoder, SSEEvent
from rl_backend.gateway.transport import UpstreamResponse
from rl_backend.gateway.upstream import UpstreamClient, UpstreamUnavailable, close_quietly
from rl_backend.gateway.writer import RecordWriter
from rl_backend.store.records import CallRecord

log = logging.getLogger(__name__)

# Call ids: a random per-process prefix and a counter (32 hex digits like a uuid4, unique across processes sharing a
# store, and without a system call per call).
_ID_PREFIX = os.urandom(10).hex()
_ID_COUNTER = itertools.count(1)
ERROR_BODY_BYTES = 64 << 10  # of an upstream's error answer, what the agent and the record get
CLIENT_CLOSED = 499  # nginx's status for "the client closed the request"; the agent never got a full answer
_PASS_HEADERS = ("retry-after", "retry-after-ms", "x-request-id", "request-id")
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass
class GatewayState:
    """Mutable state shared by the calls of one gateway; touched only on its event loop (reads from anywhere)."""

    paused: bool = False
    in_flight: int = 0
    model_version: str | None = None
    calls_started: int = 0


@dataclass
class Services:
    client: UpstreamClient
    writer: RecordWriter
    prices: PriceTable
    state: GatewayState
    durable_before_reply: bool = True
    spend: SpendLimit | None = None  # the hard ceiling, when the run has a budget in USD
    keep_bytes: int = KEEP_BYTES  # of an answer, what a record keeps (oversize.py)
    _settled: asyncio.Event | None = field(default=None, repr=False)  # set (and replaced) when a reservation ends

    async def reservation_settled(self) -> None:
        """Wait until some call's reservation against the budget is settled (on the gateway's loop)."""
        if self._settled is None:
            self._settled = asyncio.Event()
        await self._settled.wait()

    def settled(self) -> None:
        event, self._settled = self._settled, None
        if event is not None:
            event.set()


class ProxyCall:
    """The ASGI response for one admitted call; it owns one unit of `GatewayState.in_flight` and releases it."""

    def __init__(
        self,
        services: Services,
        exchange: Exchange,
        *,
        rollout_id: str,
        request_model: str | None,
        agent_headers: dict[str, str],
        secrets: tuple[str, ...],
        started_at: float,
        t0: float,
    ) -> None:
        self.services = services
        self.exchange = exchange
        self.rollout_id = rollout_id
        self.request_model = request_model
        self.agent_headers = agent_headers
        self.secrets = tuple(s for s in secrets if s)
        self.call_id = f"call-{_ID_PREFIX}{next(_ID_COUNTER):012x}"
        self.started_at = started_at  # when the request arrived (time.time)
        self.t0 = t0  # the same instant on perf_counter, for latency and ttft
        self.ttft_s: float | None = None
        self.status: int | None = None
        self.error: str | None = None
        self.failure_body: dict[str, Any] | None = None
        self.events_sent = 0
        self.response_started = False
        self.response_done = False
        self.client_gone = False
        self.recorded = False
        self.running = False
        self.answered = False  # the upstream began a 2xx answer
        self.received_bytes = 0  # of the answer's body
        self.reserved_usd: float | None = None  # held against the budget until the call is recorded

    # -- ASGI -----------------------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The gateway counted this call in flight when it admitted it (before reading its body): see Gateway._proxy.
        state = self.services.state
        state.calls_started += 1
        task = asyncio.current_task()
        assert task is not None
        self.running = True
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive, task))
        try:
            try:
                await self._run(send)
            except asyncio.CancelledError:
                if not self.client_gone:
                    raise  # the server is stopping
                task.uncancel()
            except Exception as exc:  # a gateway bug: the agent gets a 500 in its API's shape, the call is recorded
                self.running = False
                log.error("gateway: call %s failed inside the gateway", self.call_id, exc_info=exc)
                self.error = self.error or f"gateway_error: {type(exc).__name__}: {exc}"
                self.status = 500
                if not self.response_started:
                    await self._send_json(send, 500, error_body(500, f"gateway error: {exc}", self.exchange.dialect))
                elif not self.response_done:
                    await self._send_events(send, [self.exchange.error_event(f"gateway error: {exc}")], last=True)
        finally:
            self.running = False
            watcher.cancel()
            state.in_flight -= 1
            if self.client_gone:
                self.status = CLIENT_CLOSED
                where = f"after {self.events_sent} stream events" if self.response_started else "before any answer"
                self.error = f"client_disconnected: the agent closed the connection {where}"
            elif not self.recorded and not self.response_done:  # cancelled from outside: the server is stopping
                self.status = 503
                self.error = self.error or "cancelled: the gateway stopped before the call finished"
            if not self.recorded:
                self.recorded = True
                try:
                    self.services.writer.submit(self._record(), self.secrets)
                except Exception:
                    log.exception("gateway: could not build the record of call %s", self.call_id)
            if self.reserved_usd is not None and self.services.spend is not None:
                # No record could be built: the reservation is charged whole if the upstream answered, never lost.
                reserved, self.reserved_usd = self.reserved_usd, None
                self.services.spend.settle(reserved, reserved if self.answered else 0.0)
                self.services.settled()

    async def _watch_disconnect(self, receive: Receive, task: asyncio.Task[Any]) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                # Our own last send also ends the cycle (the server then reports a disconnect): not the agent leaving.
                if not self.response_done and self.running:
                    self.client_gone = True
                    task.cancel()
                return

    # -- the exchange ---------------------------------------------------------------------------------------------

    async def _run(self, send: Send) -> None:
        ex = self.exchange
        request = ex.upstream_body()
        body = dumps(request)
        refusal = await self._reserve(request, len(body))
        if refusal is not None:
            await self._fail(send, REFUSAL_STATUS, f"{REFUSAL_CODE}: {refusal}", refusal, code=REFUSAL_CODE)
            return
        try:
            opened = await self.services.client.open(ex.route, ex.path, body, ex.upstream_headers(self.agent_headers))
        except UpstreamUnavailable as exc:
            await self._fail(send, exc.status, f"upstream_unavailable: {exc.message}", exc.message)
            return
        response = opened.response
        self.answered = 200 <= response.status_code < 300
        try:
            if not 200 <= response.status_code < 300:
                await self._pass_error(send, response)
            elif ex.stream:
                await self._stream(send, response)
            else:
                await self._whole(send, response)
        finally:
            close_quietly(response)

    async def _reserve(self, request: dict[str, Any], body_bytes: int) -> str | None:
        """Hold this call's worst case against the budget, waiting while other calls' reservations are in flight;
        the refusal's message when the budget could not pay it even with nothing in flight."""
        spend = self.services.spend
        if spend is None:
            return None
        ex = self.exchange
        input_tokens, output_tokens, stated = worst_case_tokens(ex.path, request, body_bytes)
        usd = self.services.prices.most(ex.route.upstream, ex.route.model, input_tokens, output_tokens)
        if usd is None:  # the gateway refuses unpriced models under a budget before this point; never guess
            return f"model {ex.route.upstream.name}/{ex.route.model} has no price, so agl cannot count it"
        if usd == 0:
            return None  # free
        while not spend.reserve(usd):
            if not spend.fits_alone(usd):
                return spend.refuse(self.rollout_id, WorstCase(input_tokens, output_tokens, stated, usd))
            await self.services.reservation_settled()
        self.reserved_usd = usd
        return None

    def _settle(self, record: CallRecord) -> None:
        """Charge the budget for this call and release the rest of its reservation. A cost that cannot be known
        although the upstream answered (usage missing, impossible, or cut off) is charged the whole reservation."""
        spend = self.services.spend
        if spend is None:
            return
        reserved, self.reserved_usd = self.reserved_usd, None
        if reserved is None:
            spend.charge(record.cost_usd)
            return
        known = record.cost_usd is not None and record.input_tokens is not None and record.output_tokens is not None
        cost = record.cost_usd if known and record.cost_usd is not None else reserved if self.answered else 0.0
        spend.settle(reserved, cost)
        self.services.settled()

    async def _read_upto(self, response: UpstreamResponse, limit: int) -> tuple[list[bytes], AsyncIterator[bytes] | None]:
        """The body's chunks until it ends (then None) or passes `limit` bytes (then the iterator of the rest)."""
        chunks = response.aiter_bytes()
        parts: list[bytes] = []
        async for chunk in chunks:
            parts.append(chunk)
            self.received_bytes += len(chunk)
            if self.received_bytes > limit:
                return parts, chunks
        return parts, None

    async def _pass_error(self, send: Send, response: UpstreamResponse) -> None:
        """An upstream error status after retries: the agent gets it as the upstream said it (its first
        ERROR_BODY_BYTES: an error needs no more)."""
        try:
            parts, _ = await self._read_upto(response, ERROR_BODY_BYTES)
        except HTTPError as exc:
            await self._fail(send, 502, f"upstream_stream_broken: {exc}", f"upstream error body unreadable: {exc}")
            return
        raw = b"".join(parts)[:ERROR_BODY_BYTES]
        self.status = response.status_code
        self.error = f"upstream_http_{response.status_code}: {upstream_error_message(raw)}"
        try:
            parsed = loads(raw)
            self.failure_body = parsed if isinstance(parsed, dict) else None
        except ValueError:
            self.failure_body = None
        content, ctype = self.exchange.error_from_upstream(
            response.status_code, raw, response.headers.get("content-type", "application/json")
        )
        headers = {k: response.headers[k] for k in _PASS_HEADERS if k in response.headers}
        await self._commit()
        await self._send_whole(send, response.status_code, content, ctype, headers)

    async def _whole(self, send: Send, response: UpstreamResponse) -> None:
        try:
            parts, rest = await self._read_upto(response, self.services.keep_bytes)
        except ReadTimeout as exc:
            reason = self._timed_out(exc)
            await self._fail(send, 504, f"upstream_timeout: {reason}", f"upstream timed out: {reason}")
            return
        except HTTPError as exc:
            await self._fail(send, 502, f"upstream_stream_broken: {exc}", f"upstream connection broke: {exc}")
            return
        if rest is not None:
            await self._pass_through(send, response, parts, rest)
            return
        raw = parts[0] if len(parts) == 1 else b"".join(parts)
        try:
            parsed = loads(raw)
            data = self.exchange.process_response(parsed)
        except ImpossibleUsage as exc:
            self.failure_body = parsed if isinstance(parsed, dict) else None
            await self._fail(send, 502, f"upstream_impossible_usage: {exc}", _impossible(exc))
            return
        except ValueError as exc:
            snippet = raw[:200].decode("utf-8", "replace")
            await self._fail(send, 502, f"upstream_malformed: {exc}: {snippet!r}", f"upstream sent a malformed answer: {exc}")
            return
        self.status = response.status_code
        payload = dumps(data)
        await self._commit()
        await self._send_whole(send, response.status_code, payload, "application/json", {})

    async def _pass_through(self, send: Send, response: UpstreamResponse, parts: list[bytes],
                            rest: AsyncIterator[bytes]) -> None:
        """A whole answer too big to hold (see oversize.py): the agent gets the upstream's bytes as they come, the
        record its first `keep_bytes`, the usage its last bytes carry, and a note of what it kept."""
        ex, limit = self.exchange, self.services.keep_bytes
        if not ex.passes_through:
            message = f"the upstream's answer is over {limit} bytes, more than agl reads to translate it for this API"
            await self._fail(send, 502, f"upstream_too_large: {message}", message)
            return
        tail = Tail()
        for part in parts:
            tail.add(part)
        head = b"".join(parts)
        parts.clear()
        headers = [(b"content-type", response.headers.get("content-type", "application/json").encode("latin-1"))]
        await send({"type": "http.response.start", "status": response.status_code, "headers": self._headers(headers)})
        self.response_started = True
        await send({"type": "http.response.body", "body": head, "more_body": True})
        if len(head) > limit:
            head = head[:limit]
        pending = b""  # held back: the record is committed before the agent gets the last byte
        try:
            async for chunk in rest:
                self.received_bytes += len(chunk)
                tail.add(chunk)
                if pending:
                    await send({"type": "http.response.body", "body": pending, "more_body": True})
                pending = chunk
        except ReadTimeout as exc:
            self.error = f"upstream_timeout: {self._timed_out(exc)}"
        except HTTPError as exc:
            self.error = f"upstream_stream_broken: {type(exc).__name__}: {exc}"
        self.status = 502 if self.error else response.status_code
        ex.stop_keeping(limit)
        ex.outcome.response = {"head": head.decode("utf-8", "replace")}
        ex.outcome.upstream_model = model_in(head)
        try:
            ex.outcome.usage = ex.usage_of(tail.usage())
        except ImpossibleUsage as exc:
            self.error = self.error or f"upstream_impossible_usage: {exc}"
        await self._commit()
        self.response_done = True
        await send({"type": "http.response.body", "body": pending, "more_body": False})

    async def _stream(self, send: Send, response: UpstreamResponse) -> None:
        ex = self.exchange
        self.status = response.status_code
        await send({"type": "http.response.start", "status": response.status_code, "headers": self._headers(_SSE_HEADERS)})
        self.response_started = True
        decoder = SSEDecoder(MAX_EVENT_BYTES)
        chunks = response.aiter_bytes()
        limit = self.services.keep_bytes
        try:
            async for chunk in chunks:
                self.received_bytes += len(chunk)
                if self.received_bytes > limit and ex.keep_limit is None:
                    ex.stop_keeping(limit)
                out: list[bytes] = []
                for event in decoder.feed(chunk):
                    if await self._forward(send, event, out):
                        await self._drain(chunks)
                        return
                if out:
                    await self._send_events(send, out)
            out = []
            for event in decoder.flush():
                if await self._forward(send, event, out):
                    return
            if out:
                await self._send_events(send, out)
        except ReadTimeout as exc:
            await self._break_stream(send, f"upstream_timeout: {self._timed_out(exc)}")
            return
        except HTTPError as exc:
            await self._break_stream(send, f"upstream_stream_broken: {type(exc).__name__}: {exc}")
            return
        except ImpossibleUsage as exc:
            await self._break_stream(send, f"upstream_impossible_usage: {exc}", message=_impossible(exc))
            return
        except EventTooLarge as exc:
            await self._break_stream(send, f"upstream_too_large: {exc}")
            return
        except ValueError as exc:
            await self._break_stream(send, f"upstream_malformed: a stream event was not valid JSON ({exc})")
            return
        tail = ex.finish_stream()
        if not ex.stream_complete():
            await self._break_stream(send, "upstream_stream_incomplete: the upstream ended the stream early", tail)
            return
        await self._commit()
        await self._send_events(send, tail, last=True)

    def _timed_out(self, exc: ReadTimeout) -> str:
        upstream = self.exchange.route.upstream
        if isinstance(exc, DeadlinePassed):
            return f"the answer had not ended within the upstream's timeout_s of {upstream.timeout_s:g} s"
        return f"the upstream sent nothing for {upstream.idle_timeout_s or upstream.timeout_s:g} s mid-answer"

    async def _forward(self, send: Send, event: SSEEvent, out: list[bytes]) -> bool:
        """Collect one event's bytes into `out`; at the terminal event, commit and send everything: True."""
        ex = self.exchange
        terminal = ex.is_terminal(event)
        out += ex.process_event(event)
        if ex.output_started and self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self.t0
        if terminal:
            await self._commit()
            await self._send_events(send, out, last=True)
            return True
        return False

    async def _drain(self, chunks: AsyncIterator[bytes]) -> None:
        """Read what follows the terminal event so the upstream connection can be reused; never wait long."""
        with contextlib.suppress(HTTPError, TimeoutError):
            async with asyncio.timeout(1.0):
                async for _ in chunks:
                    pass

    async def _break_stream(self, send: Send, error: str, tail: list[bytes] | None = None, *,
                            message: str | None = None) -> None:
        self.error = error
        self.status = 502
        shown = message or f"upstream failed mid-stream: {error.split(': ', 1)[-1]}"
        await self._commit()
        await self._send_events(send, [*(tail or []), self.exchange.error_event(shown)], last=True)

    async def _fail(self, send: Send, status: int, error: str, message: str, *, code: str | None = None) -> None:
        self.status = status
        self.error = error
        await self._commit()
        await self._send_json(send, status, error_body(status, message, self.exchange.dialect, code=code))

    # -- sending --------------------------------------------------------------------------------------------------

    def _headers(self, base: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        # The call's id lets an agent (or a test) find its record.
        return [*base, (b"x-agl-call-id", self.call_id.encode())]

    async def _send_events(self, send: Send, events: list[bytes], *, last: bool = False) -> None:
        """Events that arrived together go out in one write; the last one closes the response."""
        if last:
            self.response_done = True
        self.events_sent += len(events)
        body = events[0] if len(events) == 1 else b"".join(events)
        if body or last:
            await send({"type": "http.response.body", "body": body, "more_body": not last})

    async def _send_whole(self, send: Send, status: int, body: bytes, ctype: str, headers: dict[str, str]) -> None:
        raw_headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]
        raw_headers += [(k.encode(), v.encode()) for k, v in headers.items()]
        self.response_done = True
        self.response_started = True
        await send({"type": "http.response.start", "status": status, "headers": self._headers(raw_headers)})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _send_json(self, send: Send, status: int, payload: dict[str, Any]) -> None:
        await self._send_whole(send, status, dumps(payload), "application/json", {})

    # -- the record -----------------------------------------------------------------------------------------------

    async def _commit(self) -> None:
        """Write the record; with durable_before_reply, wait for its commit before the agent's last byte."""
        if self.recorded:
            return
        self.recorded = True
        record = self._record()
        if not self.services.durable_before_reply:
            self.services.writer.submit(record, self.secrets)
            return
        # If the store fails, the agent still gets its answer; the writer has logged why.
        with contextlib.suppress(Exception):
            await self.services.writer.write(record, self.secrets, alone=self.services.state.in_flight == 1)

    def _record(self) -> CallRecord:
        end = Ending(
            call_id=self.call_id,
            rollout_id=self.rollout_id,
            request_model=self.request_model,
            started_at=self.started_at,
            t0=self.t0,
            status=self.status,
            error=self.error,
            failure_body=self.failure_body,
            ttft_s=self.ttft_s,
            model_version=self.services.state.model_version,
            answered=self.answered,
            received_bytes=self.received_bytes,
        )
        record = build_record(self.exchange, end, self.services.prices)
        self._settle(record)  # built once per call (`recorded` guards it), so settled once
        return record


def _impossible(exc: ImpossibleUsage) -> str:
    return (f"the upstream reported token usage that cannot be true ({exc}); agl does not count it as money, so "
            "the call failed")
