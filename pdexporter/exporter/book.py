"""The exporter's labelling: every probe token counted, every probe interval exported once to the
TPOT histogram with the phase the window maths gives it (`exporter.timeline`), a span per probe
stream, and the probe gauges. It is the `LiveView` that `exporter.live`'s probe set and baseline
read: the streams the probe thread fills, the hold while a window is open, the quiet period.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from typing import Any

from pdexporter.exporter import timeline
from pdexporter.exporter.config import ExporterConfig
from pdexporter.exporter.live import ProbeState
from pdexporter.exporter.metrics import ExporterMetrics, error_kind, set_up
from pdexporter.exporter.probes import FINISHED, STARTED, Lifecycle, ProbeLoop, drain
from pdexporter.exporter.status import RESTART_GRACE_S, STALL_S, up_reason
from pdexporter.exporter.tracing import NoTracing, Tracing
from pdexporter.measure.protocol import InterferenceRun
from pdexporter.measure.window import stream_phases

__all__ = [
    "ProbeBook",
]


class ProbeBook:
    def __init__(self, config: ExporterConfig, metrics: ExporterMetrics,
                 on_stream: Callable[[ProbeState], None] | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.on_stream = on_stream
        self.params = config.protocol.window
        self.tracing: Tracing = NoTracing()
        self.probes: ProbeLoop | None = None
        self.finished: collections.deque[ProbeState] = collections.deque()
        self.live: dict[int, ProbeState] = {}
        self.stopping = False
        self.quiet_from: float = -math.inf  # the previous window's recovery end
        self.hold_from: float = math.inf  # intervals ending after this wait for the open window
        # passive mode: the label of an interval ending at t (exporter.passive.PassiveTracker.phase_of)
        self.phase_of: Callable[[float], str] | None = None
        self._last_token_s = time.monotonic()
        self.last_error: BaseException | None = None  # of the last probe that failed, until a token comes
        self._error_ns = -math.inf  # when `last_error` was noticed: only a token received after it clears it
        self._ended_well_s: dict[int, float] = {}  # slot -> when its stream ended well, until its successor

    def healthy(self) -> bool:
        return self.probes is not None and self.probes.alive and self.probes.fatal is None

    # --- LiveView ------------------------------------------------------------------------------

    def live_states(self) -> list[ProbeState]:
        return list(self.live.values())

    def all_states(self) -> list[ProbeState]:
        return [*self.finished, *self.live.values()]

    def hold(self, t_ns: float) -> None:
        self.hold_from = t_ns

    def refresh(self) -> None:
        """Pull what the probe thread appended; label what no window holds; spans and gauges."""
        if self.probes is None:
            return
        drain(self.probes.events, self._lifecycle)
        for state in self.all_states():
            self._absorb(state, self.hold_from)
        for state in self.live.values():
            if state.span is None and state.stream.t_sent_ns is not None:
                state.span = self.tracing.start_probe(state.stream, state.slot)
        self._prune_finished()
        samples = self.probes.sensor.samples_ns
        while samples:
            self.metrics.probe_timestamp_delay.observe(samples.popleft() / 1e9)
        open_probes = sum(1 for s in self.live.values() if s.stream.t_sent_ns is not None and not s.stream.done)
        self.metrics.probe_streams.set(open_probes)
        # A probe being (re)connected counts for `up`: it is there, just between two requests;
        # unless its last attempt failed (the retry hides it from the stream until it gives up).
        for state in self.live.values():
            attempt = state.stream.attempt_error
            if attempt is not None and attempt is not state.attempt_seen:
                state.attempt_seen = attempt
                self._fail(attempt)  # cleared by the next token, from any probe
        going = sum(1 for s in self.live.values() if not s.stream.done)
        now_ns, now_s = time.perf_counter_ns(), time.monotonic()
        stalled = sum(1 for s in self.live.values() if _silent_ns(s, now_ns) >= STALL_S * 1e9)
        # A stream that ended well (its end not drained yet, or its successor not started yet) is a
        # normal hand-over for `RESTART_GRACE_S`, not a missing probe.
        handing_over = sum(1 for s in self.live.values() if s.stream.done and s.stream.error is None)
        handing_over += sum(1 for t in self._ended_well_s.values() if now_s - t < RESTART_GRACE_S)
        set_up(self.metrics, "stopping" if self.stopping else up_reason(
            open_probes=going, wanted=self.config.probe_streams,
            seconds_since_token=now_s - self._last_token_s, probe_thread_ok=self.healthy(),
            last_error=self.last_error, stalled_probes=stalled, handing_over=handing_over))

    # --- labels ----------------------------------------------------------------------------

    def _lifecycle(self, item: Lifecycle) -> None:
        if item.kind == STARTED:
            self._ended_well_s.pop(item.slot, None)
            self.live[item.slot] = ProbeState(item.slot, item.stream)
            self.metrics.probe_streams_started.inc()
        elif item.kind == FINISHED:
            state = self.live.get(item.slot)
            if state is None or state.stream is not item.stream:
                return
            self._absorb(state, self.hold_from)
            if item.stream.error is not None and not self.stopping:
                self.metrics.errors.labels(kind=error_kind(item.stream.error)).inc()
                self._fail(item.stream.error)
            elif item.stream.done and item.stream.error is None:
                self._ended_well_s[item.slot] = time.monotonic()
            self.end_stream(state, cancelled=not item.stream.done)
            del self.live[item.slot]
            self.finished.append(state)

    def _fail(self, error: BaseException) -> None:
        self.last_error, self._error_ns = error, time.perf_counter_ns()

    def _absorb(self, state: ProbeState, hold: float) -> None:
        new_tokens = state.absorb()
        if new_tokens:
            self.metrics.probe_tokens.inc(new_tokens)
            self._last_token_s = time.monotonic()
            # A token another stream received before the failure was noticed (read from its socket's buffer
            # after the engine died, or absorbed in the same refresh) says nothing of the engine now: clearing
            # on it flapped `up_reason` to probes-restarting under a loaded CPU (issue 24's test, session 34).
            if state.times and state.times[-1] > self._error_ns:
                self.last_error = None
        # Intervals that end before any open window are decode-only: `baseline`.
        k = max(state.next_interval, self.params.warmup_tokens + 1)  # both ends past warm-up
        times = state.times
        observe = self.metrics.probe_tpot.labels(phase=timeline.BASELINE).observe
        phase_of = self.phase_of
        while k < len(times) and times[k] <= hold:
            if phase_of is None:
                observe((times[k] - times[k - 1]) / 1e9)
            else:
                self.metrics.probe_tpot.labels(phase=phase_of(times[k])).observe((times[k] - times[k - 1]) / 1e9)
            k += 1
        state.next_interval = k

    def label_window(self, run: InterferenceRun) -> None:
        """Label every held interval with the window maths' phase; the next quiet period starts
        where the last stream recovered."""
        self.refresh()
        w_end = run.window_end_ns
        anchor = run.anchor_ns if run.anchor_ns is not None else run.t_first_ns
        theta = run.baseline.slow_threshold_ms(self.params) if run.baseline else None
        all_phases = []
        for state in (s for s in self.all_states() if s.next_interval < len(s.times)):
            phases = stream_phases(state.array(), run.t_inject_ns, anchor, w_end, theta, self.params,
                                   run.located_chunks)
            labels = timeline.phase_labels(phases)
            for idx, label, length in zip(phases.intervals.token_index, labels, phases.intervals.length_ns):
                if idx >= state.next_interval:
                    self.metrics.probe_tpot.labels(phase=label).observe(float(length) / 1e9)
            state.next_interval = max(state.next_interval, len(state.times))
            all_phases.append(phases)
        self.quiet_from = timeline.recovery_end_ns(all_phases, w_end)
        self.hold_from = math.inf

    def drop_held(self, *, injected: bool) -> None:
        """A window failed. The intervals held for an injected prefill are dropped: they may be
        perturbed and no window says how, so they are not labelled `baseline` either."""
        hold, self.hold_from = self.hold_from, math.inf
        for state in self.all_states():
            self._absorb(state, hold)  # tokens counted, intervals before the hold labelled
            if injected:
                state.next_interval = max(state.next_interval, len(state.times))
        if injected:
            self.quiet_from = time.perf_counter_ns()

    def spans_of(self, request_ids: set[str]) -> list[Any]:
        return [s.span for s in self.all_states() if s.stream.request_id in request_ids]

    def end_stream(self, state: ProbeState, *, cancelled: bool) -> None:
        if state.ended:
            return
        state.ended = True
        if state.span is None and state.stream.t_sent_ns is not None:
            state.span = self.tracing.start_probe(state.stream, state.slot)
        self.tracing.end_probe(state.span, state.stream, cancelled=cancelled)
        if self.on_stream is not None:
            self.on_stream(state)

    def end_all(self) -> None:
        for state in list(self.live.values()):
            self.end_stream(state, cancelled=True)
        self.live.clear()
        self.metrics.probe_streams.set(0)
        set_up(self.metrics, "stopping")

    def _prune_finished(self) -> None:
        """Keep finished streams while their intervals can still enter a baseline or a window."""
        horizon = time.perf_counter_ns() - (self.config.baseline_span_s + 5.0) * 1e9
        while self.finished:
            head = self.finished[0]
            last = head.times[-1] if head.times else 0.0
            if head.next_interval >= len(head.times) and last < horizon and last < self.hold_from:
                self.finished.popleft()
            else:
                break


def _silent_ns(state: ProbeState, now_ns: int) -> float:
    """How long an open probe stream has gone without an event (0 when not open)."""
    stream = state.stream
    if stream.done or stream.t_sent_ns is None:
        return 0.0
    last = stream.event_times_ns[-1] if stream.event_times_ns else stream.t_sent_ns
    return float(now_ns - last)
