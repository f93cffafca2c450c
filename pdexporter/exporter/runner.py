"""The live exporter: continuous probes, periodic prefill windows, metrics, spans, records.

Two threads (docs/exporter.md draws them):

- the probe thread (`probes.ProbeLoop`) owns the engine connections of the probes and of the
  injected prefills, and stamps every token; nothing else runs on its loop;
- this module runs on the caller's loop: it reads the streams' timestamps, labels every interval
  with the window maths (`timeline`, `measure.window`), decides when to inject, analyses each
  window exactly as `measure` does, publishes Prometheus series, builds spans, scrapes the
  engine's /metrics and writes records. Its work can only delay the probe thread through the
  GIL, which `sys.setswitchinterval` makes hand over within ~0.5 ms.

A window, step by step: the next prefill's body (P random ids, max_tokens 1) is encoded here
while nothing is measured; once due, the runner waits until the probes are ready
(`timeline.ready_to_inject`), takes the quiet-period baseline, scrapes the engine, marks its
step log, and hands the body to the probe loop, which sends it (t_inject = the client's stamp).
It waits for the first token, then for every probe's 32 recovery intervals, scrapes again and
runs `analyse_traces` (the window maths); the repetition record is built by `measure.point.rep_record`, so a
window seen live and a `measure` repetition are the same object, written the same way.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import datetime as dt
import math
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdexporter.engine.client import EngineClient
from pdexporter.engine.launcher import EngineHandle, Launcher
from pdexporter.engine.metrics import MetricsSnapshot
from pdexporter.engine.stream import TokenStream
from pdexporter.errors import (
    EngineError,
    EngineHTTPError,
    EngineTimeout,
    EngineUnreachable,
    MeasurementError,
)
from pdexporter.exporter import timeline
from pdexporter.exporter.config import ExporterConfig
from pdexporter.exporter.metrics import ExporterMetrics, grid_labels, publish_window
from pdexporter.exporter.probes import FINISHED, STARTED, Lifecycle, ProbeLoop, drain
from pdexporter.exporter.server import metrics_app, start_metrics_server
from pdexporter.exporter.tracing import NoTracing, Tracing, make_tracing
from pdexporter.exporter.tracing import preload as tracing_preload
from pdexporter.measure.driver import EngineInfo, PreparedRequest
from pdexporter.measure.point import PointSpec, record_config, rep_record, resumable_reps
from pdexporter.measure.prompts import cold_prompt
from pdexporter.measure.protocol import InterferenceRun, StreamTrace, analyse_traces, expected_schedule
from pdexporter.measure.records import RepRecord, aggregate
from pdexporter.measure.store import ResultsStore
from pdexporter.measure.window import stream_phases, token_times, window_end_ns

TICK_S = 0.05  # bookkeeping cadence on the runner's loop
SETTLE_TOKENS = 4  # tokens every probe receives between the engine scrape and the injection
POLL_S = 0.01  # while a window is open: how often its state is looked at (timestamps are not affected)
STALL_S = 10.0  # `pdexporter_up` drops when no probe token arrived for this long
BASELINE_RULE = "live-quiet"


def error_kind(exc: BaseException | None) -> str:
    """`pdexporter_errors_total{kind}` for an exception (bounded label values)."""
    if isinstance(exc, EngineUnreachable):
        return "connect"
    if isinstance(exc, EngineTimeout):
        return "timeout"
    if isinstance(exc, EngineHTTPError):
        return "http"
    if isinstance(exc, MeasurementError):
        return "measurement"
    return "protocol"  # SSEProtocolError and any other engine answer we could not use


@dataclass
class ProbeState:
    """The runner's view of one probe stream (the probe thread only appends to `stream`)."""

    slot: int
    stream: TokenStream
    times: list[float] = field(default_factory=list)  # per-token arrival times (ns)
    events_seen: int = 0
    next_interval: int = 0  # token index of the next interval to label
    span: Any = None
    ended: bool = False

    def absorb(self) -> int:
        """Pull the events the probe thread appended since last time; returns new tokens.

        Per-token times come from `window.token_times` run on the new events plus the one before
        them (an n-token event is spread over the gap before it), so they equal what the window
        maths computes on the whole stream."""
        s = self.stream
        n = min(len(s.event_times_ns), len(s.event_tokens))
        seen = self.events_seen
        if n <= seen:
            return 0
        if seen == 0:
            self.times.extend(token_times(s.event_times_ns[:n], s.event_tokens[:n]).tolist())
        else:
            anchor = s.event_tokens[seen - 1]
            self.times.extend(token_times(s.event_times_ns[seen - 1 : n], s.event_tokens[seen - 1 : n])[anchor:].tolist())
        self.events_seen = n
        return int(sum(s.event_tokens[seen:n]))

    def array(self) -> np.ndarray:
        return np.asarray(self.times, dtype=np.float64)

    def open_at(self, t_ns: int) -> bool:
        s = self.stream
        started = s.t_sent_ns is not None and s.t_sent_ns <= t_ns
        return started and not (s.done and (s.t_finished_ns or 0) <= t_ns)


@dataclass(frozen=True)
class WindowResult:
    """One analysed window, as the runner published it."""

    run: InterferenceRun
    rep: RepRecord
    record_path: str | None


class Runner:
    """Owns one exporter: engine (via the launcher), probe thread, metrics server, tracing."""

    def __init__(
        self,
        config: ExporterConfig,
        launcher: Launcher,
        *,
        api_key: str | None = None,
        metrics: ExporterMetrics | None = None,
        tracing_factory: Callable[[EngineInfo], Tracing] | None = None,
        on_window: Callable[[WindowResult], None] | None = None,
        on_stream: Callable[[ProbeState], None] | None = None,
        on_inject: Callable[[int], None] | None = None,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.config = config
        self.launcher = launcher
        self.api_key = api_key
        self.metrics = metrics or ExporterMetrics()
        self._tracing_factory = tracing_factory or (
            lambda info: make_tracing(info, max_tokens=config.protocol.decode_output_tokens)
        )
        self.tracing: Tracing = NoTracing()
        self.on_window = on_window
        self.on_stream = on_stream
        self.on_inject = on_inject
        self.injections_sent = 0
        self.log = log
        self.params = config.protocol.window
        self.store = ResultsStore(config.out) if config.out else None
        self.spec = PointSpec(config.chunk_size, config.probe_streams, config.prefill_tokens).validate()
        self.handle: EngineHandle | None = None
        self.info: EngineInfo | None = None
        self.probes: ProbeLoop | None = None
        self.bound_port: int | None = None
        self.windows: list[WindowResult] = []
        self.finished: collections.deque[ProbeState] = collections.deque()
        self.live: dict[int, ProbeState] = {}
        self._scrape_client: EngineClient | None = None
        self._hold_from: float = math.inf  # intervals ending after this wait for the open window
        self._quiet_from: float = -math.inf
        self._window_task: asyncio.Task[None] | None = None
        self._scrape_task: asyncio.Task[MetricsSnapshot | None] | None = None
        self._next_scrape = 0.0
        self._next_injection = 0.0
        self._next_prefill: tuple[str, PreparedRequest] | None = None
        self._last_token_s = time.monotonic()
        self._ready_event = asyncio.Event()
        self._stopping = False
        self._in_flight = False

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def ready(self) -> asyncio.Event:
        """Set once the server listens and the probes are running (tests wait on it)."""
        return self._ready_event

    def abort_window(self) -> None:
        """Drop the window in flight (a second SIGINT): shutdown then goes on at once."""
        if self._window_task is not None and not self._window_task.done():
            self._window_task.cancel()

    def healthy(self) -> bool:
        return self.probes is not None and self.probes.alive and self.probes.fatal is None

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set (or `duration_s` passed), then shut down in order."""
        cfg = self.config
        previous_switch = sys.getswitchinterval()
        sys.setswitchinterval(cfg.switch_interval_s)
        server = None
        try:
            self._check_out_dir()
            app = metrics_app(self.metrics.registry, title="pdexporter run", healthy=self.healthy)
            try:
                server, self.bound_port = await start_metrics_server(app, cfg.listen_host, cfg.listen_port)
            except OSError as exc:
                from pdexporter.errors import ConfigError

                raise ConfigError(
                    f"--listen {cfg.listen_host}:{cfg.listen_port}: {exc.strerror or exc}"
                ) from exc
            self.log(f"metrics on http://{cfg.listen_host}:{self.bound_port}/metrics")
            tracing_preload()  # before the probes: see tracing.preload
            self.handle = await self.launcher.start(cfg.chunk_size)
            self.probes = ProbeLoop(
                self.handle,
                cfg.probe_streams,
                cfg.protocol,
                model=cfg.model,
                api_key=self.api_key,
                warm_prefill_tokens=cfg.prefill_tokens if cfg.injecting else None,
                stamp_at_wakeup=cfg.arrival_stamp == "wakeup",
            )
            self.info = await self.probes.wait_started(timeout_s=cfg.protocol.window_timeout_s)
            self._publish_engine_info()
            self.tracing = self._tracing_factory(self.info)
            self._scrape_client = EngineClient(self.handle.url, api_key=self.api_key)
            now = time.monotonic()
            self._next_injection = now + (cfg.inject_every_s or 0.0)
            self._ready_event.set()
            if self.info.modelled and self.info.note:
                self.log(self.info.note)
            await self._loop(stop, deadline=None if cfg.duration_s is None else now + cfg.duration_s)
        finally:
            await self._shutdown(server)
            sys.setswitchinterval(previous_switch)

    async def _loop(self, stop: asyncio.Event, deadline: float | None) -> None:
        cfg = self.config
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                stop.set()
            if self.probes is not None and self.probes.fatal is not None:
                raise self.probes.fatal
            self._bookkeeping()
            if stop.is_set():
                break  # _shutdown finishes the window in flight (bounded by drain_timeout_s)
            window_open = self._window_task is not None and not self._window_task.done()
            if self._window_task is not None and self._window_task.done():
                self._window_task.result()  # a bug in the window code must not pass silently
                self._window_task = None
            if cfg.injecting and not window_open and not self._stopping and now >= self._next_injection:
                self._window_task = asyncio.create_task(self._window(), name="pdexporter-window")
                window_open = True
            # While a prefill is in flight the window takes its own scrapes, before and after.
            if not self._in_flight and now >= self._next_scrape and (
                self._scrape_task is None or self._scrape_task.done()
            ):
                self._next_scrape = now + cfg.scrape_interval_s
                self._scrape_task = asyncio.create_task(self._scrape())
            if not window_open and self._next_prefill is None and cfg.injecting:
                self._encode_next_prefill()  # between windows: encoding here touches nothing measured
            try:
                await asyncio.wait_for(stop.wait(), TICK_S)
            except TimeoutError:
                pass

    async def _shutdown(self, server: Any) -> None:
        """Finish the window in flight, stop probes, end and flush spans, stop the engine."""
        self._stopping = True
        if self._window_task is not None and not self._window_task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._window_task), self.config.drain_timeout_s)
            except (TimeoutError, asyncio.CancelledError):
                self._window_task.cancel()
            except Exception:  # noqa: BLE001 - already counted; shutdown goes on
                pass
        if self._scrape_task is not None and not self._scrape_task.done():
            self._scrape_task.cancel()
        if self.probes is not None:
            await asyncio.to_thread(self.probes.stop)
            self._bookkeeping()
        for state in list(self.live.values()):
            self._end_stream(state, cancelled=True)
        self.live.clear()
        self.metrics.probe_streams.set(0)
        self.metrics.up.set(0)
        await asyncio.to_thread(self.tracing.shutdown)
        if self._scrape_client is not None:
            await self._scrape_client.aclose()
        if server is not None:
            await server.cleanup()
        await self.launcher.stop()

    # --- bookkeeping: tokens, labels, spans, gauges -----------------------------------------

    def _bookkeeping(self) -> None:
        if self.probes is None:
            return
        drain(self.probes.events, self._lifecycle)
        hold = self._hold_from
        for state in [*self.live.values(), *self.finished]:
            self._absorb(state, hold)
        for state in self.live.values():
            if state.span is None and state.stream.t_sent_ns is not None:
                state.span = self.tracing.start_probe(state.stream, state.slot)
        self._prune_finished()
        self._sensor()
        open_probes = sum(1 for s in self.live.values() if s.stream.t_sent_ns is not None and not s.stream.done)
        self.metrics.probe_streams.set(open_probes)
        fresh = time.monotonic() - self._last_token_s < STALL_S
        self.metrics.up.set(1 if open_probes == self.config.probe_streams and fresh and self.healthy() else 0)

    def _lifecycle(self, item: Lifecycle) -> None:
        if item.kind == STARTED:
            self.live[item.slot] = ProbeState(item.slot, item.stream)
            self.metrics.probe_streams_started.inc()
        elif item.kind == FINISHED:
            state = self.live.get(item.slot)
            if state is None or state.stream is not item.stream:
                return
            self._absorb(state, self._hold_from)
            if item.stream.error is not None and not self._stopping:
                self.metrics.errors.labels(kind=error_kind(item.stream.error)).inc()
            self._end_stream(state, cancelled=not item.stream.done)
            del self.live[item.slot]
            self.finished.append(state)

    def _absorb(self, state: ProbeState, hold: float) -> None:
        new_tokens = state.absorb()
        if new_tokens:
            self.metrics.probe_tokens.inc(new_tokens)
            self._last_token_s = time.monotonic()
        self._label_baseline(state, hold)

    def _label_baseline(self, state: ProbeState, hold: float) -> None:
        """Intervals that end before any open window are decode-only: `baseline`."""
        first = self.params.warmup_tokens + 1  # interval k spans tokens k-1..k; both past warm-up
        k = max(state.next_interval, first)
        times = state.times
        observe = self.metrics.probe_tpot.labels(phase=timeline.BASELINE).observe
        while k < len(times) and times[k] <= hold:
            observe((times[k] - times[k - 1]) / 1e9)
            k += 1
        state.next_interval = k

    def _label_window(
        self, states: list[ProbeState], t_inject: int, t_first: int, w_end: float, theta: float | None,
        chunk_sizes: tuple[int, ...] | None,
    ) -> list[Any]:
        """Label every held interval with the window maths' phase; returns each stream's phases."""
        all_phases = []
        for state in states:
            phases = stream_phases(state.array(), t_inject, t_first, w_end, theta, self.params, chunk_sizes)
            labels = timeline.phase_labels(phases)
            lengths = phases.intervals.length_ns
            for idx, label, length in zip(phases.intervals.token_index, labels, lengths):
                if idx >= state.next_interval:
                    self.metrics.probe_tpot.labels(phase=label).observe(float(length) / 1e9)
            state.next_interval = max(state.next_interval, len(state.times))
            all_phases.append(phases)
        return all_phases

    def _end_stream(self, state: ProbeState, *, cancelled: bool) -> None:
        if state.ended:
            return
        state.ended = True
        if state.span is None and state.stream.t_sent_ns is not None:
            state.span = self.tracing.start_probe(state.stream, state.slot)
        self.tracing.end_probe(state.span, state.stream, cancelled=cancelled)
        if self.on_stream is not None:
            self.on_stream(state)

    def _prune_finished(self) -> None:
        """Keep finished streams while their intervals can still enter a baseline or a window."""
        horizon = time.perf_counter_ns() - (self.config.baseline_span_s + 5.0) * 1e9
        while self.finished:
            head = self.finished[0]
            done = head.next_interval >= len(head.times)
            last = head.times[-1] if head.times else 0.0
            if done and last < horizon and last < self._hold_from:
                self.finished.popleft()
            else:
                break

    def _sensor(self) -> None:
        if self.probes is None:
            return
        samples = self.probes.sensor.samples_ns
        while samples:
            try:
                delay = samples.popleft()
            except IndexError:
                break
            self.metrics.probe_timestamp_delay.observe(delay / 1e9)

    def _publish_engine_info(self) -> None:
        info = self.info
        assert info is not None
        self.metrics.engine_info.labels(
            engine=info.kind,
            model=info.model,
            chunk_size=str(self.config.chunk_size),
            modelled=str(info.modelled).lower(),
        ).set(1)

    # --- engine /metrics -------------------------------------------------------------------

    async def _scrape(self) -> MetricsSnapshot | None:
        assert self._scrape_client is not None
        t0 = time.perf_counter()
        try:
            snapshot = await self._scrape_client.scrape_metrics(retry=False)
        except EngineError as exc:
            self.metrics.engine_scrape_ok.set(0)
            self.metrics.engine_scrape_seconds.set(time.perf_counter() - t0)
            if not self._stopping:
                self.metrics.errors.labels(kind=error_kind(exc)).inc()
            return None
        self.metrics.engine_scrape_seconds.set(time.perf_counter() - t0)
        self.metrics.engine_scrape_ok.set(1)
        for gauge, name in (
            (self.metrics.engine_running, "num_requests_running"),
            (self.metrics.engine_waiting, "num_requests_waiting"),
            (self.metrics.engine_kv, "kv_cache_usage_perc"),
        ):
            value = snapshot.get(name)
            if value is not None:
                gauge.set(value)
        return snapshot

    # --- prefill windows -------------------------------------------------------------------

    def _encode_next_prefill(self) -> None:
        assert self.probes is not None
        salt = str(uuid.uuid4())
        prompt = cold_prompt(self.config.prefill_tokens, salt, self.config.protocol.token_range)
        self._next_prefill = (salt, self.probes.prepare(prompt, self.config.protocol.prefill_max_tokens, "prefill"))

    def _schedule_next(self) -> None:
        self._next_injection = time.monotonic() + (self.config.inject_every_s or 0.0)

    def _window_failed(self, exc: BaseException, *, injected: bool) -> None:
        """Count it. The intervals held for an injected prefill are dropped: they may be perturbed
        and no window says how, so they are not labelled `baseline` either."""
        self.metrics.errors.labels(kind=error_kind(exc)).inc()
        if injected:
            self.metrics.injections.labels(outcome="error").inc()
        hold, self._hold_from = self._hold_from, math.inf
        for state in [*self.live.values(), *self.finished]:
            self._absorb(state, hold)  # tokens counted, intervals before the hold labelled
            if injected:
                state.next_interval = max(state.next_interval, len(state.times))
        if injected:
            self._quiet_from = time.perf_counter_ns()
        self.log(f"window skipped: {exc}")
        self._schedule_next()

    async def _window(self) -> None:
        cfg = self.config
        assert self.probes is not None and self.probes.driver is not None
        if self._next_prefill is None:
            self._encode_next_prefill()
        assert self._next_prefill is not None
        salt, prepared = self._next_prefill
        self._next_prefill = None
        deadline = time.monotonic() + cfg.ready_timeout_s

        # 1. Wait until the probes can carry a window (timeline.ready_to_inject).
        if await self._wait_ready(deadline) is None:
            return
        # 2. Scrape the engine, then let the probes settle: rendering /metrics takes the engine's
        #    HTTP loop a few ms (4-6 ms on the embedded engine), and the delayed tokens must land
        #    before t_decide, not in the window.
        self._in_flight = True  # no periodic scrape from here to the end of the window
        try:
            if self._scrape_task is not None and not self._scrape_task.done():
                await asyncio.gather(self._scrape_task, return_exceptions=True)
            before = await self._scrape()
            t_decide = await self._wait_ready(deadline, settle_after_ns=time.perf_counter_ns())
            if t_decide is None:
                return
            # 3. Baseline from the quiet period, step mark, then inject.
            self._hold_from = t_decide
            self._bookkeeping()
            await self._measure_window(t_decide, salt, prepared, before)
        finally:
            self._in_flight = False

    async def _wait_ready(self, deadline: float, settle_after_ns: int | None = None) -> int | None:
        """Poll `timeline.ready_to_inject`; with `settle_after_ns`, also wait for every probe to
        have `SETTLE_TOKENS` tokens after that time. Returns t_decide, or None (stopping, or
        `ready_timeout_s` passed: counted as a measurement error)."""
        cfg, params = self.config, self.params
        span_ns = cfg.baseline_span_s * 1e9
        while True:
            if self._stopping:
                return None
            self._bookkeeping()
            live = list(self.live.values())
            probes = [s.stream for s in live]
            t_decide = time.perf_counter_ns()
            readiness = timeline.ready_to_inject(probes, cfg.probe_streams, cfg.protocol, cfg.reserve_tokens)
            if readiness.ready and settle_after_ns is not None:
                settling = [s for s in live if len(s.times) - bisect.bisect_right(s.times, settle_after_ns) < SETTLE_TOKENS]
                if settling:
                    readiness = timeline.Readiness(False, f"{len(settling)} probe stream(s) settling after the scrape")
            if readiness.ready:  # the quiet-period count only once the streams are there (it costs more)
                start = max(t_decide - span_ns, self._quiet_from)
                arrays = [s.array() for s in [*self.finished, *live] if s.times and s.times[-1] > start]
                n_quiet = timeline.quiet_intervals_ns(arrays, start, t_decide, params).size
                readiness = timeline.ready_to_inject(
                    probes, cfg.probe_streams, cfg.protocol, cfg.reserve_tokens, n_quiet, cfg.min_baseline_intervals
                )
            if readiness.ready:
                return t_decide
            if time.monotonic() > deadline:
                self._window_failed(
                    MeasurementError(f"no injection within {cfg.ready_timeout_s:g} s: {readiness.reason}"),
                    injected=False,
                )
                return None
            await asyncio.sleep(POLL_S)

    async def _measure_window(
        self, t_decide: int, salt: str, prepared: PreparedRequest, before: MetricsSnapshot | None
    ) -> None:
        cfg, params = self.config, self.params
        assert self.probes is not None and self.probes.driver is not None
        span_ns = cfg.baseline_span_s * 1e9
        baseline, quiet_start = timeline.quiet_baseline(
            [s.array() for s in [*self.finished, *self.live.values()]], t_decide, self._quiet_from, span_ns, params
        )
        driver = self.probes.driver
        mark = driver.step_mark()
        started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        window_states = [s for s in self.live.values() if s.stream.t_sent_ns is not None and not s.stream.done]
        prefill = await asyncio.wrap_future(self.probes.inject(prepared))
        self.injections_sent += 1
        if self.on_inject is not None:
            self.on_inject(self.injections_sent)

        # 3. First token, then every probe's recovery intervals.
        timeout = cfg.protocol.window_timeout_s
        if not await self._poll(lambda: prefill.t_first_ns is not None or prefill.done, timeout):
            self._window_failed(EngineTimeout(f"the {cfg.prefill_tokens}-token prefill gave no token in {timeout:g} s"), injected=True)
            return
        if prefill.t_first_ns is None or prefill.t_sent_ns is None:
            self._window_failed(prefill.error or MeasurementError("the prefill ended without a token"), injected=True)
            return
        t_inject, t_first = prefill.t_sent_ns, prefill.t_first_ns
        w_end = window_end_ns(t_first, baseline)
        after_n = params.after_intervals

        def recovered() -> bool:
            self._bookkeeping()
            return prefill.done and all(
                s.stream.done or len(s.times) - bisect.bisect_right(s.times, w_end) >= after_n for s in window_states
            )

        if not await self._poll(recovered, timeout):
            self._window_failed(MeasurementError(f"probe streams did not recover within {timeout:g} s"), injected=True)
            return
        after = await self._scrape()
        steps = driver.steps_since(mark)
        if steps is not None:
            steps = [s for s in steps if s.context_tokens > 0 or s.generation_requests > 0]

        # 4. The window maths, exactly as `measure` runs it.
        self._bookkeeping()
        traces = [StreamTrace.of(s.stream) for s in window_states]
        schedule = expected_schedule(self.info.kind if self.info else None, cfg.prefill_tokens, cfg.chunk_size,
                                     cfg.probe_streams)
        stats = analyse_traces(traces, t_inject, t_first, baseline, params, steps, schedule)
        run = InterferenceRun(
            decode_batch_size=cfg.probe_streams,
            new_prefill_tokens=cfg.prefill_tokens,
            probes=traces,
            prefill=StreamTrace.of(prefill),
            t_inject_ns=t_inject,
            t_first_ns=t_first,
            window=stats,
            metrics_before=before,
            metrics_after=after,
            engine_steps=steps,
            schedule=schedule,
            salt=salt,
            extra={
                "mode": "live",
                "baseline_rule": BASELINE_RULE,
                "baseline_quiet_from_ns": None if not math.isfinite(quiet_start) else int(quiet_start - t_inject),
                "baseline_quiet_to_ns": int(t_decide - t_inject),
            },
        )
        touched = [s for s in [*self.finished, *self.live.values()] if s.next_interval < len(s.times)]
        theta = baseline.slow_threshold_ms(params) if baseline else None
        phases = self._label_window(touched, t_inject, t_first, w_end, theta, run.located_chunks)
        self._quiet_from = timeline.recovery_end_ns(phases, w_end)
        self._hold_from = math.inf

        record_path = None
        rep_index = 0
        if self.store is not None:
            record_path, rep, rep_index = self._save(run, baseline, started_at)
        else:
            rep_index = len(self.windows)
            rep = rep_record(rep_index, run, baseline, self.spec, raw=None, baseline_source=BASELINE_RULE,
                             started_at=started_at)
        publish_window(self.metrics, grid_labels(*_grid(self.spec)), rep)
        self.metrics.injections.labels(outcome="ok").inc()
        self.tracing.window(run, rep, cfg.chunk_size, [s.span for s in window_states])
        result = WindowResult(run, rep, record_path)
        self.windows.append(result)
        self.log(_window_line(len(self.windows), self.spec, rep))
        if self.on_window is not None:
            self.on_window(result)
        self._schedule_next()

    async def _poll(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    # --- records ---------------------------------------------------------------------------

    def _check_out_dir(self) -> None:
        """Fail before anything starts if --out holds a record measured another way."""
        if self.store is None:
            return
        existing = self.store.load_record(*_grid(self.spec))
        if existing is not None:
            path = self.store.record_path(*_grid(self.spec))
            for key, live in (("mode", "live"), ("decode_context_tokens", self.config.protocol.decode_context_tokens),
                              ("decode_output_tokens", self.config.protocol.decode_output_tokens)):
                if getattr(existing.config, key) != live:
                    from pdexporter.errors import ConfigError

                    raise ConfigError(
                        f"{path}: recorded with {key}={getattr(existing.config, key)!r}, this run has {key}={live!r}; "
                        "use another --out directory"
                    )

    def _save(self, run: InterferenceRun, baseline: Any, started_at: str) -> tuple[str, RepRecord, int]:
        assert self.store is not None and self.info is not None
        store, spec = self.store, self.spec
        path = store.record_path(*_grid(spec))
        probe_config = record_config(spec, self.info, self.config.protocol, reps=1, mode="live")
        done = resumable_reps(store.load_record(*_grid(spec)), probe_config, str(path))
        rep_index = len(done)
        raw_path = store.raw_path(*_grid(spec), rep_index)
        store.save_raw(raw_path, run.to_raw())
        rep = rep_record(rep_index, run, baseline, spec, raw=store.relative(spec.chunk_size, raw_path),
                         baseline_source=BASELINE_RULE, started_at=started_at)
        done.append(rep)
        config = record_config(spec, self.info, self.config.protocol, reps=len(done), mode="live")
        store.save_record(aggregate(config, done))
        return str(path), rep, rep_index


def _grid(spec: PointSpec) -> tuple[int, int, int]:
    return (spec.chunk_size, spec.decode_batch_size, spec.new_prefill_tokens)


def _window_line(n: int, spec: PointSpec, rep: RepRecord) -> str:
    b, i, d = rep.baseline, rep.interference, rep.derived

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} ms"

    return (
        f"window {n}: B={spec.chunk_size} D={spec.decode_batch_size} P={spec.new_prefill_tokens} "
        f"baseline {ms(b.tpot_p50_ms)} during {ms(i.tpot_during_prefill_p50_ms)} "
        f"penalty {ms(d.tpot_penalty_p50_ms)} prefill {ms(i.prefill_duration_ms)} "
        f"slow steps {i.slow_steps}, chunks {i.num_chunks_actual}/{i.num_chunks_expected}"
    )
