"""Fast mode: long-lived probe streams, perturbed one injection after another.

The faithful procedure starts D fresh 256-token streams for every repetition and waits for them
to finish: most of that time the engine decodes nothing we measure. Here one set of D streams
(max_tokens = inject_at + the drift allowance) serves successive injections. Injections never
overlap: `run_interference` returns only after every probe has `after_intervals` recovery
intervals past the window, and the next injection also waits for the seed's steady state.
When a stream could not carry the next window to the end, or its context would drift more than
`max_context_drift_tokens` past the seed's 4096, the set is let run out and a fresh set starts.
A set is sized for the injections planned next (`plan`), so the last set of a (chunk, D) ends
soon after its last window instead of decoding idle tokens up to the drift limit.

Records are the same as faithful mode's: before analysis each probe trace is cut to the
`warmup_tokens + inject_at_tokens` tokens before the injection and what follows, which is the
shape of a faithful probe (16 warm-up tokens discarded, injection at token ~32), so earlier
windows cannot leak into this one's pre-injection numbers and raw files stay small.
"""

from __future__ import annotations

import dataclasses

from pdexporter.engine.stream import TokenStream
from pdexporter.errors import MeasurementError
from pdexporter.measure.driver import EngineDriver
from pdexporter.measure.protocol import (
    InterferenceRun,
    ProtocolSettings,
    StreamTrace,
    analyse_traces,
    run_interference,
    start_probes,
)
from pdexporter.measure.window import BaselineStats
from pdexporter.sweep.spec import injection_tokens


def trim_trace(trace: StreamTrace, t_inject_ns: int, keep_tokens: int) -> StreamTrace:
    """Keep the last `keep_tokens` tokens before t_inject (plus the event that starts them) and
    everything after."""
    kept = 0
    start = len(trace.event_times_ns)
    for i in range(len(trace.event_times_ns) - 1, -1, -1):
        if trace.event_times_ns[i] <= t_inject_ns:
            if kept > keep_tokens:
                break
            kept += trace.event_tokens[i]
        start = i
    return dataclasses.replace(
        trace, event_times_ns=trace.event_times_ns[start:], event_tokens=trace.event_tokens[start:]
    )


def trim_run(run: InterferenceRun, settings: ProtocolSettings, baseline: BaselineStats | None) -> InterferenceRun:
    keep = settings.warmup_tokens + settings.inject_at_tokens
    probes = [trim_trace(p, run.t_inject_ns, keep) for p in run.probes]
    window = analyse_traces(probes, run.t_inject_ns, run.t_first_ns, baseline, settings.window, run.engine_steps,
                            run.schedule)
    return dataclasses.replace(run, probes=probes, window=window, extra={**run.extra, "probe_reuse": True})


class ProbePool:
    """The long-lived probe streams of one (chunk size, D)."""

    def __init__(self, driver: EngineDriver, chunk_size: int, d: int, settings: ProtocolSettings, max_tokens: int):
        self.driver = driver
        self.chunk_size = chunk_size
        self.d = d
        self.settings = settings
        self.max_tokens = max_tokens
        self.streams: list[TokenStream] = []
        self.stream_tokens = max_tokens
        self.sets_started = 0
        self.injections = 0
        self.upcoming: list[int] = []  # prefill sizes of the injections planned next, in order

    def plan(self, prefill_sizes: list[int]) -> None:
        self.upcoming = list(prefill_sizes)

    def _need(self, p: int) -> int:
        return injection_tokens(self.settings, self.chunk_size, self.d, p)

    def _can_carry(self, p: int) -> bool:
        need = self._need(p)
        return bool(self.streams) and all(
            not s.done and self.stream_tokens - s.n_tokens >= need for s in self.streams
        )

    def _set_tokens(self, p: int) -> int:
        """max_tokens of a new set: this injection and as many planned ones as the drift allows."""
        allowance = self.max_tokens - self.settings.inject_at_tokens
        budget = self._need(p)
        for q in self.upcoming[1:] if self.upcoming[:1] == [p] else self.upcoming:
            if budget + self._need(q) > allowance:
                return self.max_tokens
            budget += self._need(q)
        return min(self.max_tokens, self.settings.inject_at_tokens + budget)

    async def interfere(self, p: int, baseline: BaselineStats | None, salt: str | None = None) -> InterferenceRun:
        if self.d and not self._can_carry(p):
            await self.drain()
            self.stream_tokens = self._set_tokens(p)
            self.streams = start_probes(self.driver, self.d, self.settings, max_tokens=self.stream_tokens)
            self.sets_started += 1
        if self.upcoming and self.upcoming[0] == p:
            self.upcoming.pop(0)
        run = await run_interference(
            self.driver, self.d, p, self.settings, baseline, probes=self.streams if self.d else None,
            wait_for_probes=False, salt=salt,
        )
        self.injections += 1
        return trim_run(run, self.settings, baseline) if self.d else run

    async def drain(self, *, raise_failures: bool = True) -> None:
        """Let the current set run out (it must not overlap the next set or the next Phase 1)."""
        streams, self.streams = self.streams, []
        if not streams:
            return
        ok = await self.driver.progress.wait_until(lambda: all(s.done for s in streams), self.settings.window_timeout_s)
        if raise_failures:
            for s in streams:
                s.raise_if_failed()
        if not ok:
            raise MeasurementError(f"{len(streams)} fast-mode probe streams did not finish")
