"""Probe streams on a dedicated event-loop thread that does nothing but read sockets.

docs/vllm-facts.md: work on the loop that reads the probes delays their timestamps (a 32K-id
body encoded on it showed up as bursts of 0 ms intervals). So this thread's loop only

- keeps N probe streams open on the shared cached prefix, restarting each as it finishes
  (a fresh stream, same prefix, the pre-encoded body with the max_tokens that ends it with the
  other probes: `timeline.aligned_max_tokens`, why in `exporter.timeline`);
- sends a prefill whose body the caller already encoded (`inject`);
- runs a wake-up sensor (below).

Everything else (window maths, Prometheus, spans, scrapes, files, the HTTP server) runs on the
caller's loop in another thread and reads the streams' lists, which this thread only appends to.
The GIL is still shared: the runner lowers `sys.setswitchinterval` so a busy main thread hands
it over within ~0.5 ms instead of 5 ms.

Arrival stamps: on http:// targets the probes' client reads each stream on a plain socket that
asks the kernel for receive timestamps (`client.kstamp`), so a token's stamp is when its TCP
segment reached this host, whatever this loop was doing then (`stamp_clock` "kernel-rx"). Where
the kernel refuses the option, for https, or with `rx_stamps=False` (env
`PDEXPORTER_KERNEL_STAMPS=0`), the stamp is the wake-up time below. With D streams readable at
once, one loop iteration handles D reads in a row and each parses its SSE event before the next
one would stamp, so the k-th stamp would carry k-1 parses (~0.1 ms each). The probe loop
therefore runs on a `StampingSelector`, which notes when each `select()` returned, and the
probes' client stamps a read without a kernel stamp with that time
(`EngineClient.use_arrival_clock`): the start of the iteration that handles the read. On the
aiohttp path it is never earlier than the bytes' arrival (the socket was read in that iteration or
the one before); on the plain-socket path a segment can land between the wake-up and the read, so
such a stamp can be early by the time the loop takes to read its ready sockets. Either way it no
longer depends on how many other streams were parsed first.

Wake-up sensor: a helper thread stamps `perf_counter_ns` and writes one byte to a socket pair
every `sensor_period_s`; this loop's reader stamps again when it sees the byte. The difference is
exactly what a token's timestamp suffers between "the socket became readable" and "we stamped
it": kernel wake-up, GIL hand-over and callbacks queued ahead on this loop. Kernel stamps do not
suffer it; the sensor still bounds the wake-up stamps of any read that had none.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from pdexporter.client.client import EngineClient
from pdexporter.client.stream import TokenStream
from pdexporter.errors import EngineError, EngineTimeout, PdexporterError
from pdexporter.exporter.timeline import aligned_max_tokens
from pdexporter.launch import EngineHandle
from pdexporter.measure.driver import EngineInfo, HttpDriver, PreparedRequest, http_driver
from pdexporter.measure.prompts import cold_prompt, shared_prefix
from pdexporter.measure.protocol import ProtocolSettings, run_single

__all__ = [
    "KERNEL_STAMPS_ENV", "STALL_CHECK_S", "Lifecycle", "ProbeLoop", "StampingSelector", "WakeupSensor", "drain",
    "kernel_stamps_default",
]

STARTED, FINISHED = "started", "finished"
STALL_CHECK_S = 1.0  # how often a probe stream is looked at for a stall (`ProbeLoop._watched`)
ALIGN_WAIT_S, ALIGN_POLL_S = 5.0, 0.002  # a probe waits this long at most for the others to end
KERNEL_STAMPS_ENV = "PDEXPORTER_KERNEL_STAMPS"  # "0", "off" or "false": the aiohttp path, wake-up stamps


def kernel_stamps_default() -> bool:
    return os.environ.get(KERNEL_STAMPS_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


@dataclass(frozen=True)
class Lifecycle:
    """A probe stream started or finished (sent to the runner through a thread-safe queue)."""

    kind: str
    slot: int
    stream: TokenStream


class StampingSelector(selectors.DefaultSelector):
    """The platform's selector, remembering when its last `select()` returned (perf_counter_ns)."""

    def __init__(self) -> None:
        super().__init__()
        self.wake_ns = time.perf_counter_ns()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        self.wake_ns = time.perf_counter_ns()
        return ready

    def arrival_ns(self) -> int:
        return self.wake_ns


class WakeupSensor:
    """Socket-readable -> stamped delay on one loop (module docs). Samples in ns, bounded deque."""

    def __init__(self, period_s: float = 0.01, keep: int = 100_000) -> None:
        self.period_s = period_s
        self.samples_ns: collections.deque[int] = collections.deque(maxlen=keep)
        self._rx, self._tx = socket.socketpair()
        self._rx.setblocking(False)
        self._stop = threading.Event()
        self._sent: collections.deque[int] = collections.deque()
        self._thread: threading.Thread | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_reader(self._rx.fileno(), self._on_readable)
        self._thread = threading.Thread(target=self._writer, name="pdexporter-wakeup-sensor", daemon=True)
        self._thread.start()

    def _writer(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sent.append(time.perf_counter_ns())
            try:
                self._tx.send(b"x")
            except OSError:
                return

    def _on_readable(self) -> None:
        t_ns = time.perf_counter_ns()
        try:
            n = len(self._rx.recv(4096))
        except (BlockingIOError, OSError):
            return
        for _ in range(n):
            if self._sent:
                self.samples_ns.append(t_ns - self._sent.popleft())

    def detach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        try:
            loop.remove_reader(self._rx.fileno())
        except (ValueError, RuntimeError):
            pass
        self._rx.close()
        self._tx.close()


class ProbeLoop:
    """N probe streams restarted forever on their own thread and event loop."""

    def __init__(
        self,
        handle: EngineHandle,
        n_probes: int,
        settings: ProtocolSettings,
        *,
        model: str | None = None,
        api_key: str | None = None,
        warm_prefill_tokens: int | None = None,
        sensor_period_s: float = 0.01,
        restart_backoff_s: tuple[float, float] = (0.25, 10.0),
        stamp_at_wakeup: bool = True,
        rx_stamps: bool | None = None,
        configure_client: Callable[[EngineClient], None] | None = None,
        stagger: bool = False,
        read_timeout_s: float | None = None,
        check: Callable[[EngineInfo], None] | None = None,
    ) -> None:
        self.handle = handle
        # Passive mode: slot i's first stream decodes (i + 1) / N of the usual tokens, so the slots
        # restart (and sit in their warm-up) at different times, never all at once.
        self.stagger = stagger
        self.n_probes = n_probes
        self.settings = settings
        self.model = model
        self.api_key = api_key
        self.warm_prefill_tokens = warm_prefill_tokens
        self.restart_backoff_s = restart_backoff_s
        self.stamp_at_wakeup = stamp_at_wakeup
        # Kernel receive stamps (engine.kstamp); None: on unless PDEXPORTER_KERNEL_STAMPS=0.
        self.rx_stamps = kernel_stamps_default() if rx_stamps is None else rx_stamps
        self.configure_client = configure_client  # called on the probe thread before any request
        self.read_timeout_s = read_timeout_s  # the client's read timeout (`--read-timeout`)
        self.check = check  # called with the engine's info before the warm-ups (e.g. max_model_len)
        self.stamping: str | None = None  # how the probes are stamped, in one line, once started
        self.events: queue.SimpleQueue[Lifecycle] = queue.SimpleQueue()
        self.sensor = WakeupSensor(sensor_period_s)
        self.driver: HttpDriver | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready: concurrent.futures.Future[EngineInfo] = concurrent.futures.Future()
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self.fatal: BaseException | None = None
        self._current: dict[int, TokenStream] = {}  # each slot's stream (probe thread only)

    # --- called from the runner's thread ---------------------------------------------------

    async def wait_started(self, timeout_s: float = 300.0) -> EngineInfo:
        """Start the probe thread; returns once the engine answered, the warm-ups ran and the probes
        were sent. A dead target or a bad model fails here, with the engine's one-line error."""
        self._thread = threading.Thread(target=self._run, name="pdexporter-probes", daemon=True)
        self._thread.start()
        async with asyncio.timeout(timeout_s):
            return await asyncio.wrap_future(self._ready)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def prepare(self, prompt: tuple[int, ...], max_tokens: int, tag: str) -> PreparedRequest:
        """Encode a request body on the *caller's* thread (never on the probe loop)."""
        assert self.driver is not None
        return self.driver.prepare(prompt, max_tokens, tag)

    def send(self, prepared: PreparedRequest, stream: TokenStream, *, retry_connect: bool = False) -> None:
        """Send an already-encoded request from the probe loop into `stream` (created by the
        caller, filled by this thread; t_sent is stamped by the client when the request leaves)."""
        assert self.loop is not None and self.driver is not None
        client = self.driver.client
        future = asyncio.run_coroutine_threadsafe(
            client.stream_into(prepared.path, prepared.body, stream, retry_connect=retry_connect), self.loop
        )
        future.add_done_callback(_seen)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel the probes, close the driver, end the thread."""
        self._stopping = True
        loop, stop = self.loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    # --- the probe thread --------------------------------------------------------------------

    def _run(self) -> None:
        selector = StampingSelector()
        try:
            with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector)) as runner:
                runner.run(self._main(selector))
        except BaseException as exc:  # noqa: BLE001 - handed to the runner
            self.fatal = exc
            if not self._ready.done():
                self._ready.set_exception(exc)

    async def _main(self, selector: StampingSelector | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with http_driver(self.handle, model=self.model, api_key=self.api_key,
                               read_timeout_s=self.read_timeout_s) as driver:
            if self.check is not None:
                self.check(driver.info)
            self.driver = driver
            client = driver.client
            client.rx_stamps = client.rx_stamps and self.rx_stamps
            if selector is not None and self.stamp_at_wakeup:
                client.use_arrival_clock(selector.arrival_ns, "wakeup")
            if self.configure_client is not None:
                self.configure_client(client)
            self.stamping = client.stamping
            s = self.settings
            prefix = shared_prefix(s.decode_context_tokens, s.token_range)
            # Warm-ups before any probe runs, so their encoding and JIT cost hit nothing measured.
            await run_single(driver, prefix, 1, "warm-prefix", s.window_timeout_s)
            if self.warm_prefill_tokens:
                prompt = cold_prompt(self.warm_prefill_tokens, f"warm-{id(self)}-{time.time_ns()}", s.token_range)
                await run_single(driver, prompt, 1, "warm-shape", s.window_timeout_s)
            probe = driver.prepare(prefix, s.decode_output_tokens, "probe")
            self.sensor.attach(self.loop)
            slots = [asyncio.create_task(self._slot(i, driver, probe, self._first(i)),
                                         name=f"probe-{i}") for i in range(self.n_probes)]
            self._ready.set_result(driver.info)
            try:
                await self._stop.wait()
            finally:
                for task in slots:
                    task.cancel()
                await asyncio.gather(*slots, return_exceptions=True)
                await driver.cancel_all()
                self.sensor.detach(self.loop)

    def _first(self, slot: int) -> int | None:
        """max_tokens of the slot's first stream when staggering (see `stagger`), else None."""
        if not self.stagger:
            return None
        s = self.settings
        return max(s.warmup_tokens + 2, round(s.decode_output_tokens * (slot + 1) / self.n_probes))

    async def _slot(self, slot: int, driver: HttpDriver, probe: PreparedRequest, first: int | None = None) -> None:
        """One probe position: a stream, and a fresh one (same prefix) each time it ends."""
        backoff = self.restart_backoff_s[0]
        serial = 0
        full = probe.max_tokens
        while not self._stopping:
            # Passive mode staggers the slots (first stream only); a window wants them in phase.
            n = (first if serial == 0 else full) if first is not None else await self._in_phase(slot, full)
            request = probe.with_max_tokens(n)
            stream = TokenStream(f"probe{slot}-{serial}", "probe", max_tokens=n)
            self._current[slot] = stream
            serial += 1
            self.events.put(Lifecycle(STARTED, slot, stream))
            try:
                await self._watched(slot, driver.client.stream_into(request.path, request.body, stream,
                                                                    retry_connect=True), stream)
            except asyncio.CancelledError:
                self.events.put(Lifecycle(FINISHED, slot, stream))
                raise
            except PdexporterError:
                pass  # recorded on the stream (`stream.error`); the runner counts it by kind
            except Exception as exc:  # noqa: BLE001 - any other failure must not kill the slot
                if not stream.done:
                    stream.fail(time.perf_counter_ns(), EngineError(f"probe stream failed: {exc!r}"))
            self.events.put(Lifecycle(FINISHED, slot, stream))
            if stream.error is not None and not self._stopping:
                # An engine that is down must not be hammered: back off until a stream works again.
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.restart_backoff_s[1])
            else:
                backoff = self.restart_backoff_s[0]


    async def _watched(self, slot: int, streaming: Coroutine[Any, Any, TokenStream], stream: TokenStream) -> None:
        """`streaming`, cut when the probe is stalled: no event for `settings.stall_timeout_s`
        (30 s, or --read-timeout when shorter) while another probe received one within that time.
        The engine steps and serves the others; this stream will not come back (a request the
        engine lost, a proxy holding it), and every window would wait for it until the read
        timeout (300 s). It fails with `EngineTimeout` (counted as a timeout) and is restarted.
        An engine silent to every probe (a long unchunked prefill, a hang) is left to the read
        timeout; `pdexporter_up` says `probes-stalled` meanwhile (`exporter.book`)."""
        task = asyncio.ensure_future(streaming)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=STALL_CHECK_S)
                if done:
                    task.result()
                    return
                silent_s = self._stalled_for(slot, stream)
                if silent_s is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, PdexporterError):
                        await task
                    if not stream.done:
                        stream.fail(time.perf_counter_ns(), EngineTimeout(
                            f"probe stream silent for {silent_s:.0f} s while the engine streamed to the other "
                            "probes: cut and restarted"))
                    return
        except asyncio.CancelledError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, PdexporterError):
                await task
            raise

    def _stalled_for(self, slot: int, stream: TokenStream) -> float | None:
        """Seconds `stream` has been silent, when that makes it stalled (`_watched`); else None."""
        last = stream.event_times_ns[-1] if stream.event_times_ns else stream.t_sent_ns
        if last is None or stream.done:
            return None
        now = time.perf_counter_ns()
        limit_ns = self.settings.stall_timeout_s * 1e9
        if now - last < limit_ns:
            return None
        others = [s.event_times_ns[-1] for i, s in self._current.items() if i != slot and s.event_times_ns]
        if not any(now - t < limit_ns for t in others):
            return None  # the engine is silent to everyone: the read timeout's business
        return (now - last) / 1e9

    async def _in_phase(self, slot: int, full: int) -> int:
        """max_tokens for this slot's next stream, after waiting (at most `ALIGN_WAIT_S`) for the
        other probes that are about to end, so that all restart together."""
        deadline = time.monotonic() + ALIGN_WAIT_S
        while True:
            left = [s.tokens_left for i, s in self._current.items() if i != slot and not s.done]
            n = aligned_max_tokens(full, left, self.settings.inject_at_tokens)
            if n is not None:
                return n
            if time.monotonic() > deadline or self._stopping:
                return full
            await asyncio.sleep(ALIGN_POLL_S)


def _seen(future: concurrent.futures.Future[TokenStream]) -> None:
    """The stream holds any failure already; mark the future's exception as retrieved."""
    if not future.cancelled():
        future.exception()


def drain(events: queue.SimpleQueue[Lifecycle], handle: Callable[[Lifecycle], None]) -> int:
    """Hand every queued lifecycle event to `handle`; returns how many there were."""
    count = 0
    while True:
        try:
            item = events.get_nowait()
        except queue.Empty:
            return count
        handle(item)
        count += 1
