"""The exporter's OTLP/HTTP trace receiver (`POST /v1/traces`), bounded for a port others can reach.

`pdexporter run --passive` sizes production prefills from the engine's request spans (vLLM:
`--otlp-traces-endpoint`, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`). The receiver
listens on its own port (`--traces-listen`, default 18743 with `--passive`, off otherwise), so that
a NetworkPolicy or firewall can open it to the engine alone while Prometheus scrapes /metrics on
the other one. docs/security.md is the exposure model; what each request goes through, in order,
each refusal answered as an OTLP collector answers it and counted in
`pdexporter_trace_rejections_total{reason}` (`metrics.REJECT_REASONS`):

1. the bearer token (`--traces-token-file`), when one is set: 401 `unauthorized`;
2. the request rate (`ReceiverLimits.requests_per_s`, a token bucket): 429 `rate-limited`, with
   `Retry-After` (the OpenTelemetry SDK and the collector retry on it);
3. at most `max_concurrent` bodies read and decoded at once, `max_waiting` more waiting up to
   `wait_s`: beyond, 429 `busy`. A waiting request has not been read: it costs a socket buffer;
4. the body as sent (`max_wire_bytes`: `Content-Length` checked first, then counted as it
   streams in): 413 `too-large`; read within `body_timeout_s` from taking its slot, else 408
   `slow-body` (a slow upload held a slot for ever: two made real exports get 429 `busy`);
5. `Content-Type` application/x-protobuf (415 `unsupported-media-type`) and `Content-Encoding`
   gzip, deflate or none (415), decompressed as it streams, stopping at `max_decoded_bytes` (413
   `too-large`: a 9 MB gzip bomb never becomes 2 GB); every byte inflated is paid from a budget
   of `decoded_bytes_per_s` (429 `rate-limited` once spent: a stream of bombs each just under the
   limit took 32 CPU-seconds in 31 s); a corrupt or truncated stream is 400 `bad-encoding`, not
   read as an empty export;
6. the protobuf, parsed (protobuf's C parser, in a worker thread: /metrics keeps answering) and
   its spans counted before any becomes Python: more than `max_spans_per_export` is 413
   `too-large`, more than the spans' rate (`spans_per_s`) allows 429 `rate-limited`, nothing of
   the export kept; then decoded as the engine's spans (`client.traces.traces_of` with its
   adapter, in the worker thread): 400 `bad-body` for what is not an export or holds a number that
   is not finite or out of range (one line naming the attribute; +inf prompt tokens was a 500 and
   a traceback); before the engine has said who it is, 503 `engine-unknown` with `Retry-After`.

Then the spans go to the sink (passive mode's intake, which judges each span's timestamps:
`passive_live.TraceIntake`). aiohttp's own decompression is off for this server
(`start_server(..., auto_decompress=False)`): it inflates a whole chunk before any size check.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import math
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from pdexporter.exporter.metrics import REQUEST_TRACES, TRACE_EXPORTS, TRACE_REJECTIONS

if TYPE_CHECKING:
    from pdexporter.client.traces import RequestTrace

__all__ = [
    "DEFAULT_TRACES_PORT",
    "RECEIVER_SERIES",
    "BoundedInflater",
    "ReceiverLimits",
    "TokenBucket",
    "TooLarge",
    "bearer_ok",
    "traces_app",
]

DEFAULT_TRACES_PORT = 18743
RECEIVER_SERIES = (
    REQUEST_TRACES,
    TRACE_EXPORTS,
    TRACE_REJECTIONS,
)  # what the receiver's own GET /metrics shows
MIB = 1024 * 1024
_STATUS = {
    "unauthorized": 401,
    "rate-limited": 429,
    "busy": 429,
    "too-large": 413,
    "unsupported-media-type": 415,
    "bad-encoding": 400,
    "bad-body": 400,
    "engine-unknown": 503,
    "slow-body": 408,
}


@dataclass(frozen=True)
class ReceiverLimits:
    """What one receiver accepts (module docs). The defaults hold a busy vLLM's exports with room:
    its BatchSpanProcessor sends at most 512 spans (~0.8 MB of protobuf) every 5 s."""

    max_wire_bytes: int = 4 * MIB  # the body as sent (compressed or not)
    max_decoded_bytes: int = 8 * MIB  # after decompression
    max_concurrent: int = 2  # bodies read and decoded at once
    max_waiting: int = 8  # requests queued behind them (not read yet)
    wait_s: float = 5.0  # longest wait in that queue
    requests_per_s: float = 50.0
    request_burst: int = 100
    spans_per_s: float = 1000.0  # vLLM finishes far fewer requests a second
    span_burst: int = 10_000
    read_chunk_bytes: int = 64 * 1024
    # reading one body, from taking its slot: shorter than `wait_s`, so an export waiting behind two
    # slow uploads gets a slot (4 MiB in 3 s is 1.4 MB/s; a vLLM export is ~0.8 MB, on the pod network)
    body_timeout_s: float = 3.0
    decoded_bytes_per_s: float = 16 * MIB  # inflating: ~100x what a busy vLLM sends
    decoded_bytes_burst: int = 32 * MIB
    max_spans_per_export: int = 20_000  # a vLLM export holds at most 512


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved; `take(n)` spends n if there are n."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.t = clock()

    def take(self, n: float = 1.0) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if n > self.tokens:
            return False
        self.tokens -= n
        return True

    def wait_s(self, n: float = 1.0) -> float:
        """Seconds until `n` tokens are there (for Retry-After)."""
        return max(0.0, (n - self.tokens) / self.rate) if self.rate > 0 else math.inf


class TooLarge(Exception):
    """A body past its limit."""


class OverBudget(Exception):
    """More bytes inflated than the receiver's decode budget allows now."""


class BoundedInflater:
    """Streaming gzip/deflate (or identity) decoding that never holds more than `limit` bytes of
    output: each call inflates at most what is left of the limit, plus one byte to notice an excess.
    `ValueError`: not valid data (or truncated, at `finish`); `TooLarge`: past the limit."""

    def __init__(self, encoding: str, limit: int, budget: TokenBucket | None = None) -> None:
        self.encoding, self.limit, self.budget = encoding, limit, budget
        self.size = 0
        self.parts: list[bytes] = []
        self._d = self._new() if encoding != "identity" else None

    def _new(self) -> zlib._Decompress:
        # gzip: the gzip header (wbits 16 + 15); deflate: HTTP's "deflate" is zlib-wrapped (RFC 9110)
        return zlib.decompressobj(31 if self.encoding == "gzip" else 15)

    def _keep(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise TooLarge(f"more than {self.limit} bytes once decompressed")
        if self.budget is not None and data and not self.budget.take(len(data)):
            raise OverBudget("too many bytes to decode a second")
        if data:
            self.parts.append(data)

    def feed(self, chunk: bytes) -> None:
        if self._d is None:
            self._keep(chunk)
            return
        data = chunk
        while data:
            try:
                out = self._d.decompress(data, self.limit - self.size + 1)
            except zlib.error as exc:
                raise ValueError(f"not valid {self.encoding} data ({exc})") from None
            self._keep(out)
            if self._d.eof:  # a gzip body may hold several members, one after the other
                data = self._d.unused_data
                if data and self.encoding == "gzip":
                    self._d = self._new()
                    continue
                if data.strip(b"\0"):
                    raise ValueError(f"bytes after the end of the {self.encoding} stream")
                return
            data = self._d.unconsumed_tail

    def finish(self) -> bytes:
        if self._d is not None and not self._d.eof:
            raise ValueError(f"truncated {self.encoding} data")
        return b"".join(self.parts)


def bearer_ok(request: web.Request, token: str | None) -> bool:
    """No token set, or the request carries `Authorization: Bearer <token>` (compared in constant time)."""
    if token is None:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


class _Receiver:
    """One receiver's state (its budgets, its slots) and its two handlers; `traces_app` wires them."""

    def __init__(self, sink: Callable[[list[RequestTrace]], None], on_result: Callable[[str | None], None],
                 engine: str | Callable[[], str | None] | None, token: str | None, limits: ReceiverLimits,
                 clock: Callable[[], float], registry: CollectorRegistry | None) -> None:
        self.sink, self.on_result, self.engine, self.token, self.limits = sink, on_result, engine, token, limits
        self.registry = registry
        self.requests = TokenBucket(limits.requests_per_s, limits.request_burst, clock)
        self.spans = TokenBucket(limits.spans_per_s, limits.span_burst, clock)
        self.inflating = TokenBucket(limits.decoded_bytes_per_s, limits.decoded_bytes_burst, clock)
        self.slots = asyncio.Semaphore(limits.max_concurrent)
        self.waiting = 0

    def refuse(self, reason: str, text: str, retry_after_s: float | None = None) -> web.Response:
        self.on_result(reason)
        headers = {} if retry_after_s is None else {"Retry-After": str(max(1, math.ceil(retry_after_s)))}
        if reason == "unauthorized":
            headers["WWW-Authenticate"] = "Bearer"
        return web.Response(status=_STATUS[reason], text=f"{text}\n", headers=headers)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[bool]:
        """A body slot (True), or False when the queue is full or the wait ran out."""
        if self.slots.locked():
            if self.waiting >= self.limits.max_waiting:
                yield False
                return
            self.waiting += 1
            try:
                async with asyncio.timeout(self.limits.wait_s):
                    await self.slots.acquire()
            except TimeoutError:
                yield False
                return
            finally:
                self.waiting -= 1
        else:
            await self.slots.acquire()
        try:
            yield True
        finally:
            self.slots.release()

    async def read_body(self, request: web.Request, inflater: BoundedInflater) -> bytes:
        wire = 0
        async for chunk in request.content.iter_chunked(self.limits.read_chunk_bytes):
            wire += len(chunk)
            if wire > self.limits.max_wire_bytes:
                raise TooLarge(f"body larger than {self.limits.max_wire_bytes} bytes")
            inflater.feed(chunk)
        return inflater.finish()

    async def read_bounded(self, request: web.Request, encoding: str) -> bytes | web.Response:
        """The body, inflated, within its time, size and decode budget; else the refusal."""
        limits = self.limits
        try:
            async with asyncio.timeout(limits.body_timeout_s):
                return await self.read_body(request, BoundedInflater(encoding, limits.max_decoded_bytes,
                                                                     self.inflating))
        except TimeoutError:
            return self.refuse("slow-body", f"the body was not read within {limits.body_timeout_s:g} s")
        except TooLarge as exc:
            return self.refuse("too-large", str(exc))
        except OverBudget as exc:
            return self.refuse("rate-limited", str(exc), self.inflating.wait_s(limits.read_chunk_bytes))
        except ValueError as exc:
            return self.refuse("bad-encoding", str(exc))

    async def decode(self, body: bytes, kind: str) -> list[RequestTrace] | web.Response:
        """The export's request spans, its spans counted and paid for before any is decoded."""
        from pdexporter.client.traces import TraceDecodeError, count_spans, parse_export, traces_of

        try:
            message = await asyncio.to_thread(parse_export, body)
        except TraceDecodeError as exc:
            return self.refuse("bad-body", str(exc))
        count = count_spans(message)
        if count > self.limits.max_spans_per_export:
            return self.refuse("too-large", f"{count} spans in one export, at most {self.limits.max_spans_per_export}")
        if count and not self.spans.take(count):
            return self.refuse("rate-limited", f"more than {self.limits.spans_per_s:g} spans a second",
                               self.spans.wait_s(count))
        try:
            return await asyncio.to_thread(traces_of, message, engine=kind)
        except TraceDecodeError as exc:
            return self.refuse("bad-body", str(exc))

    def admission(self, request: web.Request) -> tuple[str, str] | web.Response:
        """What is checked before the body is read (who sends, how often, what it says it holds):
        the body's encoding and the engine whose spans these are, or the refusal."""
        from pdexporter.client.traces import PROTOBUF

        if not bearer_ok(request, self.token):
            return self.refuse("unauthorized", "a bearer token is required (Authorization: Bearer ...)")
        if not self.requests.take():
            return self.refuse("rate-limited", "too many export requests", self.requests.wait_s())
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != PROTOBUF:
            return self.refuse(
                "unsupported-media-type",
                f"expected Content-Type {PROTOBUF} (OTLP/HTTP protobuf), got {content_type or 'none'}",
            )
        encoding = request.headers.get("Content-Encoding", "").strip().lower() or "identity"
        if encoding not in ("identity", "gzip", "deflate"):
            return self.refuse(
                "unsupported-media-type", f"Content-Encoding {encoding!r}: expected gzip, deflate or none"
            )
        limit = self.limits.max_wire_bytes
        if request.content_length is not None and request.content_length > limit:
            return self.refuse("too-large", f"body of {request.content_length} bytes, at most {limit}")
        kind = self.engine() if callable(self.engine) else self.engine  # its adapter decodes the spans
        if kind is None:
            return self.refuse("engine-unknown", "the engine has not said who it is yet: retry", 1.0)
        return encoding, kind

    async def traces(self, request: web.Request) -> web.StreamResponse:
        from pdexporter.client.traces import PROTOBUF

        admitted = self.admission(request)
        if isinstance(admitted, web.Response):
            return admitted
        encoding, kind = admitted
        async with self.slot() as free:
            if not free:
                return self.refuse("busy", "too many exports at once", self.limits.wait_s)
            body = await self.read_bounded(request, encoding)
            if isinstance(body, web.Response):
                return body
            decoded = await self.decode(body, kind)
            if isinstance(decoded, web.Response):
                return decoded
        self.on_result(None)
        self.sink(decoded)
        return web.Response(body=b"", content_type=PROTOBUF)  # an empty ExportTraceServiceResponse: all taken

    async def counters(self, request: web.Request) -> web.StreamResponse:
        if not bearer_ok(request, self.token):
            return web.Response(
                status=401, text="a bearer token is required\n", headers={"WWW-Authenticate": "Bearer"}
            )
        assert self.registry is not None
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(
            body=encoder(self.registry.restricted_registry(RECEIVER_SERIES)),
            headers={"Content-Type": content_type},
        )


def traces_app(
    sink: Callable[[list[RequestTrace]], None],
    *,
    on_result: Callable[[str | None], None] = lambda reason: None,
    engine: str | Callable[[], str | None] | None = None,
    token: str | None = None,
    limits: ReceiverLimits = ReceiverLimits(),
    clock: Callable[[], float] = time.monotonic,
    registry: CollectorRegistry | None = None,
) -> web.Application:
    """The receiver as an aiohttp application (module docs). `on_result(None)` for every export
    taken, `on_result(reason)` for every refusal. With `registry`, `GET /metrics` serves the
    receiver's own series from it (`RECEIVER_SERIES`: spans and exports counted, nothing else), so
    a check (`doctor --traces`) can see spans arrive at the address an engine sends them to."""
    receiver = _Receiver(sink, on_result, engine, token, limits, clock, registry)
    app = web.Application(client_max_size=limits.max_wire_bytes)
    app.router.add_post("/v1/traces", receiver.traces)
    if registry is not None:
        app.router.add_get("/metrics", receiver.counters)
    return app
