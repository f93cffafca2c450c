"""HTTP client for an OpenAI-compatible engine (vLLM, SGLang, or pdexporter's embedded one).

The aiohttp session is injectable (tests hand in their own connector), and the clock is a
parameter so a stream's timestamps come from whatever clock the measurement uses.

Timing rules learnt on a real vLLM (docs/vllm-facts.md):
- one `perf_counter_ns` stamp per network read, taken before any parsing, given to every event
  that read completed. On http:// targets streams are read on a plain socket that takes the
  kernel's receive time of the read (`client.kstamp`, `rx_stamps=True`, the default); where the
  kernel refuses the option, for https, or with `rx_stamps=False`, aiohttp reads them and the
  stamp is `arrival_clock` (which may be a selector's wake-up time, see there). Each stream
  records which clock its stamps came from (`TokenStream.stamp_clock`);
- request bodies are encoded by `encode_body` *before* a measured window opens; `stream_into`
  only sends bytes;
- retries only where repeating is harmless: GETs (tenacity), and stream starts outside a window
  that failed before a single byte came back. A request inside a window is never retried.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from pdexporter._internal.bounds import MAX_SECONDS
from pdexporter._internal.durations import parse_duration
from pdexporter._internal.redact import API_KEY_ENV_VARS, remember_secret
from pdexporter._internal.secretfile import read_secret_file, secret_text
from pdexporter._internal.text import body_reason
from pdexporter._internal.urls import check_http_url
from pdexporter.client.http1 import request_bytes
from pdexporter.client.kstamp import RxTransport, Target
from pdexporter.client.metrics import MetricRules, MetricsSnapshot, parse_exposition
from pdexporter.client.sse import SSEEvent, SSEParser, StreamDecoder, http_error
from pdexporter.client.stream import StampClock, TokenStream
from pdexporter.errors import (
    ConfigError,
    EngineError,
    EngineHTTPError,
    EngineRefused,
    EngineTimeout,
    EngineUnreachable,
    SSEProtocolError,
)

__all__ = [
    "API_KEY_ENV_VARS", "CHAT_PATH", "COMPLETIONS_PATH", "ClientTimeouts", "Clock", "EngineClient", "EventTap",
    "chat_request", "completion_request", "encode_body", "read_timeout_seconds", "resolve_api_key",
]

# Stream starts outside a window that failed before any event came back: retried after these.
RETRY_FIRST_DELAY_S, RETRY_MAX_DELAY_S = 0.25, 4.0
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"

Clock = Callable[[], int]
# Sees every SSE event a stream received: (stream, event, its stamp, tokens it carried). For
# diagnostics and benchmarks (the embedded engine's send stamps ride in `SSEEvent.comment`).
EventTap = Callable[[TokenStream, SSEEvent, int, int], None]


def resolve_api_key(api_key_file: str | os.PathLike[str] | None = None) -> str | None:
    """Bearer token: from a file if given (Kubernetes secrets), else the first env var set; one
    line of text either way (`_internal.secretfile`: bounded, a final line break dropped)."""
    if api_key_file is not None:
        return read_secret_file(api_key_file, "--api-key-file")
    for name in API_KEY_ENV_VARS:
        if os.environ.get(name, "").strip():
            return secret_text(os.environ[name], f"${name}")
    return None


def _streaming_body(model: str, max_tokens: int, ignore_eos: bool, continuous_usage: bool,
                    **payload: Any) -> dict[str, Any]:
    """Greedy, streaming, usage on every event: what every measured request asks for."""
    return {
        "model": model,
        **payload,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": continuous_usage},
    }


def completion_request(
    model: str,
    prompt: Sequence[int] | str,
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    continuous_usage: bool = True,
) -> dict[str, Any]:
    """A `/v1/completions` body; token-id prompts give exactly len(prompt) tokens."""
    return _streaming_body(model, max_tokens, ignore_eos, continuous_usage,
                           prompt=prompt if isinstance(prompt, str) else list(prompt))


def chat_request(
    model: str,
    messages: Sequence[dict[str, str]],
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    continuous_usage: bool = True,
) -> dict[str, Any]:
    """A `/v1/chat/completions` body (the seed's request shape)."""
    return _streaming_body(model, max_tokens, ignore_eos, continuous_usage, messages=list(messages))


def encode_body(body: dict[str, Any]) -> bytes:
    """JSON bytes for a request body. Call it before the window: 32K ids take milliseconds."""
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True)
class ClientTimeouts:
    connect_s: float = 10.0
    read_s: float = 300.0  # longest silence allowed inside a stream (a 32K prefill on a slow GPU)
    request_s: float = 30.0  # whole non-streaming request (health, models, metrics)


def read_timeout_seconds(text: str, option: str = "--read-timeout") -> float:
    """`ClientTimeouts.read_s` from a duration (`_internal.durations`), within (0, one week]."""
    seconds = parse_duration(text, option)
    if not 0 < seconds <= MAX_SECONDS:
        raise ConfigError(f"{option} {text!r}: must be > 0 and at most {MAX_SECONDS:g} s (one week)")
    return seconds


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, EngineHTTPError):
        return exc.status >= 500 or exc.status == 429
    return isinstance(exc, (EngineUnreachable, EngineTimeout))


class EngineClient:
    """One engine endpoint. Use as `async with EngineClient(url) as client:`."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        session: aiohttp.ClientSession | None = None,
        timeouts: ClientTimeouts = ClientTimeouts(),
        clock: Clock = time.perf_counter_ns,
        retries: int = 4,
        arrival_clock: Clock | None = None,
        rx_stamps: bool = True,
        extra_headers: Mapping[str, str] | None = None,
        event_tap: EventTap | None = None,
    ) -> None:
        # A URL's user:password becomes an Authorization: Basic header (unless an API key is
        # given), and leaves the URL every message and record is made from; the password, and its
        # Basic base64, are never printed (`_internal.redact`).
        check_http_url(base_url, "--target")
        remember_secret(api_key)
        self.base_url, self._basic = _split_userinfo(base_url.rstrip("/"))
        self.api_key = api_key
        self.timeouts = timeouts
        self.clock = clock
        # Stamps a stream read; the live exporter swaps in the time its event loop's selector
        # returned, so a token's stamp does not include parsing of other streams' reads that the
        # same loop iteration handled first. Sends and everything else use `clock`.
        self.arrival_clock = arrival_clock or clock
        self.arrival_clock_name: StampClock = "read"
        self.retries = retries
        self.extra_headers = dict(extra_headers or {})
        self.event_tap = event_tap
        self._session = session
        self._owns_session = session is None
        # Kernel receive stamps: plain http:// on a connection we open ourselves (an injected
        # session is the caller's choice of transport). Whether the kernel takes the socket
        # option is asked once, on first use (`_rx_transport`).
        self.rx_stamps = rx_stamps and self.base_url.startswith("http://") and session is None
        self._rx: RxTransport | None = None

    def use_arrival_clock(self, clock: Clock, name: StampClock) -> None:
        """Stamp reads without a kernel stamp with `clock`, recorded on streams as `name`."""
        self.arrival_clock, self.arrival_clock_name = clock, name

    def _rx_transport(self) -> RxTransport | None:
        if not self.rx_stamps:
            return None
        if self._rx is None:
            self._rx = RxTransport()
        return self._rx if self._rx.kernel_stamps else None

    @property
    def stamping(self) -> str:
        """How this client stamps stream events, in one line (for logs and records)."""
        if self._rx_transport() is not None:
            return f"kernel-rx (plain socket; {self.arrival_clock_name} stamp where a read has none)"
        if not self.base_url.startswith("http://"):
            why = "https is read by aiohttp"
        elif self._owns_session is False:
            why = "the caller's aiohttp session"
        elif self._rx is not None and self._rx.refused:
            why = f"kernel stamps refused: {self._rx.refused}"
        else:
            why = "kernel stamps switched off"
        return f"{self.arrival_clock_name} (aiohttp; {why})"

    async def __aenter__(self) -> EngineClient:
        self.session  # noqa: B018 - create eagerly inside the running loop
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No connection limit: D probe streams plus an injection must never queue client-side.
            connector = aiohttp.TCPConnector(limit=0, force_close=False, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    def _headers(self, json_body: bool = False, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if json_body:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        elif self._basic:
            headers["Authorization"] = self._basic
        headers.update(self.extra_headers)
        if extra:
            headers.update(extra)
        return headers

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    async def _retrying(self, attempt: Callable[[], Any]) -> Any:
        async for state in AsyncRetrying(
            stop=stop_after_attempt(self.retries),
            wait=wait_exponential(multiplier=0.25, max=4.0),
            retry=retry_if_exception(_retryable),
            reraise=True,
        ):
            with state:
                return await attempt()
        raise AssertionError("unreachable")

    async def get_text(self, path: str, *, retry: bool = True) -> str:
        url = self.url(path)

        async def attempt() -> str:
            timeout = aiohttp.ClientTimeout(total=self.timeouts.request_s, connect=self.timeouts.connect_s)
            try:
                async with self.session.get(url, headers=self._headers(), timeout=timeout) as resp:
                    body = await resp.read()
                    if resp.status >= 400:
                        raise http_error(url, resp.status, body)
                    return body.decode("utf-8", "replace")
            except _TRANSPORT_ERRORS as exc:
                raise _transport_error(url, exc) from exc
            except TimeoutError as exc:
                raise EngineTimeout(f"{url}: no answer within {self.timeouts.request_s:g} s") from exc

        return await (self._retrying(attempt) if retry else attempt())

    async def health(self) -> bool:
        try:
            await self.get_text("/health", retry=False)
        except EngineError:
            return False
        return True

    async def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await self.health():
                return
            await asyncio.sleep(poll_s)
        raise EngineTimeout(f"{self.url('/health')}: engine not healthy within {timeout_s:g} s")

    async def model_entries(self, *, retry: bool = True) -> list[dict[str, Any]]:
        """The entries of `/v1/models` (id, and vLLM's `max_model_len`), one line if it is not a list."""
        text = await self.get_text("/v1/models", retry=retry)
        try:
            data = json.loads(text)["data"]
            return [dict(m) for m in data if isinstance(m, Mapping) and "id" in m]
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"{self.url('/v1/models')}: not an OpenAI model list: {body_reason(text, 120)}") from exc

    async def models(self) -> list[str]:
        return [str(m["id"]) for m in await self.model_entries()]

    async def served_model(self, model: str | None) -> tuple[str, int | None]:
        """The model to use (`model`, or the engine's first) and its max_model_len, if published."""
        entries = await self.model_entries()
        served = [str(m["id"]) for m in entries]
        if model is None:
            if not served:
                raise EngineError(f"{self.url('/v1/models')}: the engine serves no model")
            model = served[0]
        elif model not in served:
            raise ConfigError(f"--model {model!r}: the engine serves {', '.join(served) or 'nothing'}")
        length = entries[served.index(model)].get("max_model_len")
        return model, length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None

    async def resolve_model(self, model: str | None) -> str:
        return (await self.served_model(model))[0]

    async def scrape_metrics(self, rules: MetricRules, *, retry: bool = True) -> MetricsSnapshot:
        """/metrics under canonical names, read by the engine's adapter (`rules`)."""
        t_ns = self.clock()
        text = await self.get_text("/metrics", retry=retry)
        return parse_exposition(text, rules, t_ns=t_ns, source=self.url("/metrics"))

    async def post_json(self, path: str, body: bytes, *, headers: Mapping[str, str] | None = None,
                        timeout_s: float | None = None) -> tuple[dict[str, Any], int, int]:
        """POST a pre-encoded non-streaming request; (its JSON answer, sent and done stamps in ns).
        Never retried: the request may have run (a prefill instance now holds its KV)."""
        url = self.url(path)
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeouts.read_s, connect=self.timeouts.connect_s)
        t_sent = self.clock()
        try:
            async with self.session.post(url, data=body, headers=self._headers(json_body=True, extra=headers),
                                         timeout=timeout) as resp:
                raw = await resp.read()
                t_done = self.clock()
                if resp.status >= 400:
                    raise http_error(url, resp.status, raw)
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(url, exc) from exc
        except TimeoutError as exc:
            raise EngineTimeout(f"{url}: no answer within {timeout.total:g} s") from exc
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise EngineError(f"{url}: the answer is not JSON ({raw[:120]!r})") from exc
        if not isinstance(data, dict):
            raise EngineError(f"{url}: expected a JSON object, got {type(data).__name__}")
        return data, t_sent, t_done

    async def stream_into(
        self, path: str, body: bytes, stream: TokenStream, *, retry_connect: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> TokenStream:
        """POST a pre-encoded streaming request and fill `stream` until the engine ends it.

        Errors are raised *and* recorded on the stream. With `retry_connect`, a failure before
        any byte of the answer arrived is retried (safe: nothing was generated for us).
        """
        if not retry_connect:
            return await self._stream_once(path, body, stream, headers)
        # A failed attempt is not recorded on the stream until no retry follows: whoever watches
        # the stream (a window waiting on its probes) must not see a failure that is retried.
        delay_s = RETRY_FIRST_DELAY_S
        for attempt in range(1, max(1, self.retries) + 1):
            stream.reopen()
            try:
                return await self._stream_once(path, body, stream, headers, record_failure=False)
            except EngineError as exc:
                if attempt >= self.retries or stream.event_times_ns or not _retryable(exc):
                    stream.fail(self.clock(), exc)
                    raise
                stream.attempt_error = exc  # seen by the exporter's `up` while the retry waits
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, RETRY_MAX_DELAY_S)
        raise AssertionError("unreachable")

    async def _stream_once(self, path: str, body: bytes, stream: TokenStream,
                           headers: Mapping[str, str] | None = None, *, record_failure: bool = True) -> TokenStream:
        """One exchange. A failure raises; with `record_failure` it is also recorded on the stream
        (`TokenStream.fail`), else the caller records it once it decided not to retry."""
        rx = self._rx_transport()
        try:
            if rx is not None:
                return await self._stream_once_rx(rx, path, body, stream, headers)
            return await self._stream_once_aiohttp(path, body, stream, headers)
        except EngineError as exc:
            if record_failure:
                stream.fail(self.clock(), exc)
            raise

    async def _stream_once_rx(self, rx: RxTransport, path: str, body: bytes, stream: TokenStream,
                              headers: Mapping[str, str] | None = None) -> TokenStream:
        """The kernel-stamped path: a plain socket read from a reader callback (`client.kstamp`)."""
        url = self.url(path)
        target = Target.parse(url)
        parser = SSEParser()
        decoder = StreamDecoder(source=url)
        fallback = self.arrival_clock_name
        stream.stamp_clock = "kernel-rx"

        def on_body(data: bytes, t_ns: int, kernel: bool) -> bool:
            if not kernel:
                stream.note_stamp_clock(fallback)
            for event in parser.feed(data):
                self._apply(decoder, event, stream, t_ns)
            return decoder.done

        try:
            request = request_bytes("POST", target.host_header, target.path,
                                    self._headers(json_body=True, extra=headers), body)
        except ValueError as exc:
            raise ConfigError(f"request headers for {url}: {exc}") from exc
        await rx.stream(
            target, request, on_body,
            arrival_clock=self.arrival_clock,
            on_sent=lambda: stream.mark_sent(self.clock()),
            connect_s=self.timeouts.connect_s,
            read_s=self.timeouts.read_s,
        )
        if not decoder.done:
            events = parser.close()
            if events:
                stream.note_stamp_clock("read")
            for event in events:
                self._apply(decoder, event, stream, self.clock())
        if not decoder.done:
            raise SSEProtocolError(f"{url}: stream ended without 'data: [DONE]'")
        stream.finish(self.clock(), decoder.finish_reason, decoder.prompt_tokens)
        return stream

    async def _stream_once_aiohttp(self, path: str, body: bytes, stream: TokenStream,
                                   headers: Mapping[str, str] | None = None) -> TokenStream:
        url = self.url(path)
        parser = SSEParser()
        decoder = StreamDecoder(source=url)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.timeouts.connect_s, sock_read=self.timeouts.read_s
        )
        got_bytes = False
        stream.stamp_clock = self.arrival_clock_name
        try:
            stream.mark_sent(self.clock())
            async with self.session.post(
                url, data=body, headers=self._headers(json_body=True, extra=headers), timeout=timeout
            ) as resp:
                if resp.status >= 400:
                    raise http_error(url, resp.status, await resp.read())
                while True:
                    chunk = await resp.content.readany()
                    t_ns = self.arrival_clock()  # stamp first, parse after
                    if not chunk:
                        break
                    got_bytes = True
                    for event in parser.feed(chunk):
                        self._apply(decoder, event, stream, t_ns)
                    if decoder.done:
                        break
                tail = parser.close()
                if tail:
                    stream.note_stamp_clock("read")
                for event in tail:
                    self._apply(decoder, event, stream, self.clock())
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(url, exc, "mid-stream" if got_bytes else "before the first byte") from exc
        except TimeoutError as exc:
            raise EngineTimeout(f"{url}: no event for {self.timeouts.read_s:g} s") from exc
        if not decoder.done:
            raise SSEProtocolError(f"{url}: stream ended without 'data: [DONE]'")
        stream.finish(self.clock(), decoder.finish_reason, decoder.prompt_tokens)
        return stream

    def _apply(self, decoder: StreamDecoder, event: SSEEvent, stream: TokenStream, t_ns: int) -> None:
        delta = decoder.decode(event)
        if delta.prompt_tokens is not None:
            stream.prompt_tokens = delta.prompt_tokens
        stream.record(t_ns, delta.n_tokens)
        if self.event_tap is not None:
            self.event_tap(stream, event, t_ns, delta.n_tokens)


def _split_userinfo(url: str) -> tuple[str, str | None]:
    """(the URL without user:password@, an `Authorization: Basic` value or None)."""
    import base64
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    basic = "Basic " + base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), basic


# What aiohttp raises when the connection, not the engine, failed: refused, lost, cut short, or answered in
# something that is not HTTP (a polled port nobody listens on yet can connect to itself when it lies in the
# ephemeral range: the request comes back as the "status line", aiohttp's 400 "Bad status line").
_TRANSPORT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
                    aiohttp.ClientOSError, aiohttp.ClientResponseError)


def _transport_error(url: str, exc: BaseException, where: str = "") -> EngineError:
    """The engine error for one of `_TRANSPORT_ERRORS` (raised from it by the caller)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return EngineRefused(f"cannot connect to {url}: {_reason(exc)}")
    at = f" {where}" if where else ""
    if isinstance(exc, aiohttp.ClientResponseError):  # never raise_for_status here: a malformed answer
        return EngineUnreachable(f"{url}: not an HTTP answer{at} ({_reason(exc)})")
    return EngineUnreachable(f"{url}: connection lost{at} ({_reason(exc)})")


def _reason(exc: BaseException) -> str:
    os_error = getattr(exc, "os_error", None)
    if os_error is not None and getattr(os_error, "strerror", None):
        return str(os_error.strerror).lower()
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())
