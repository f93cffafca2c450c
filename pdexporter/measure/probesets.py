"""The two things a Phase 2 window can be run with: which decode streams it perturbs (a probe
set) and what it compares them with (a baseline source). `protocol.run_window` is written once
against the protocols `ProbeSet` and `BaselineSource` (declared beside it, re-exported here);
`measure`, `sweep` (both modes), `sim sweep`/`calibrate` and the live exporter (`pdexporter run`)
differ only in the implementations they pass:

    probe set     FreshProbes (faithful: D new 256-token streams per window, as the seed says)
                  PooledProbes (fast mode: long-lived streams perturbed one window after another)
                  exporter.live.ContinuousProbes (the exporter's never-ending probe streams)
    baseline      FixedBaseline (Phase 1, once per (chunk size, D))
                  exporter.live.QuietBaseline (the probes' quiet period before the injection)

Fast mode. One set of D streams (max_tokens = inject_at + the drift allowance) serves successive
injections. Injections never overlap: a window returns only after every probe has
`after_intervals` recovery intervals past it, and the next injection waits for the seed's steady
state again. When a stream could not carry the next window to the end, or its context would
drift more than the allowance past the seed's 4096, the set is retired and a fresh set starts.
Retiring cancels the set's streams where the driver can (`driver.Cancelling`: the engine aborts
them, as when a client goes away) rather than letting them decode tokens no window will use;
either way none of them runs when the next set, Phase 1 or a prefill starts. A set is sized for
the injections planned next (`plan`), so the last set of a (chunk, D) ends soon after its last
window. Before analysis each probe trace is cut to the
`warmup_tokens + inject_at_tokens` tokens before the injection and what follows, and never further
back than `warmup_tokens` before the window before's end: the shape of a faithful probe, so earlier
windows cannot leak into this one's numbers (with fewer recovery intervals than `inject_at_tokens`
the counted pre-injection intervals are those recovery intervals; GPU session 14's grid, before this
cut, read up to 47 % of the window before's chunk steps there) and raw files stay small.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pdexporter.client.stream import TokenStream
from pdexporter.errors import ConfigError, MeasurementError
from pdexporter.measure.driver import Cancelling, EngineDriver
from pdexporter.measure.protocol import (
    BaselineSource,
    ProbeSet,
    ProtocolSettings,
    StreamTrace,
    end_streams,
    start_probes,
    steady,
    wait_for,
)
from pdexporter.measure.window import BaselineStats

__all__ = [
    "BaselineSource", "FixedBaseline", "FreshProbes", "PooledProbes", "ProbeSet", "trim_trace",
]


@dataclasses.dataclass(frozen=True)
class FixedBaseline:
    """Phase 1's statistics, measured once per (chunk size, D) before the windows."""

    stats: BaselineStats | None
    rule: str = "phase1"

    def at(self, t_decide_ns: int) -> tuple[BaselineStats | None, dict[str, Any]]:
        return self.stats, {}


async def _fresh_token(driver: EngineDriver, streams: Sequence[TokenStream], after_ns: int,
                       settings: ProtocolSettings, tokens: int = 1) -> tuple[int, list[TokenStream]]:
    """Wait until every stream received `tokens` events after `after_ns` (or finished)."""
    def moved(s: TokenStream) -> bool:
        return s.finished or sum(1 for t in s.event_times_ns[-tokens:] if t > after_ns) >= tokens

    await wait_for(driver, streams, lambda: all(moved(s) for s in streams), settings.steady_timeout_s,
                   "probe streams stalled after the metrics scrape", stall_s=settings.stall_timeout_s)
    return driver.now_ns(), list(streams)


async def wait_steady(driver: EngineDriver, streams: Sequence[TokenStream], settings: ProtocolSettings) -> None:
    """The seed's steady state on every stream, or a one-line MeasurementError."""
    reached: list[bool] = []  # which condition ended the wait (re-evaluating after it would race)

    def steady_or_ended() -> bool:
        if steady(streams, settings):
            reached.append(True)
            return True
        return any(s.finished for s in streams)

    await wait_for(driver, streams, steady_or_ended, settings.steady_timeout_s,
                   f"{len(streams)} probe streams did not reach steady state", stall_s=settings.stall_timeout_s)
    if not reached:
        raise MeasurementError(
            f"probe streams ended before steady state ({settings.inject_at_tokens} tokens, last "
            f"{settings.steady_last_intervals} intervals within {settings.steady_max_ratio:g}x)"
        )


@dataclasses.dataclass
class FreshProbes:
    """Faithful: D fresh streams of `decode_output_tokens` per window, run to their end after it."""

    settings: ProtocolSettings
    wait_for_end: bool = True
    streams: list[TokenStream] = dataclasses.field(default_factory=list)  # this window's, once started

    async def ready(self, driver: EngineDriver, d: int, p: int) -> list[TokenStream]:
        self.streams = start_probes(driver, d, self.settings)
        await wait_steady(driver, self.streams, self.settings)
        return list(self.streams)

    async def settle(self, driver: EngineDriver, streams: Sequence[TokenStream],
                     after_ns: int) -> tuple[int, list[TokenStream]]:
        return await _fresh_token(driver, streams, after_ns, self.settings)

    async def release(self, driver: EngineDriver, streams: Sequence[TokenStream]) -> None:
        if self.wait_for_end:
            await wait_for(driver, streams, lambda: all(s.done for s in streams), self.settings.window_timeout_s,
                           "probe streams did not finish", stall_s=self.settings.stall_timeout_s)

    def traces(self, streams: Sequence[TokenStream], t_inject_ns: int,
               window_end_ns: float | None = None) -> list[StreamTrace]:
        return [StreamTrace.of(s) for s in streams]

    def raw_extra(self) -> dict[str, Any]:
        return {}

    async def abandon(self, driver: EngineDriver, others: Sequence[TokenStream]) -> None:
        """A failed window's probes are its own: they end with it (they decoded on beside the
        re-run, which was kept: `num_requests_running` 4 at D = 2, issue 31)."""
        await end_streams(driver, [*self.streams, *others], self.settings.window_timeout_s)


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
        trace, event_times_ns=trace.event_times_ns[start:], event_tokens=trace.event_tokens[start:],
        stamps_held=[(i - start, back) for i, back in trace.stamps_held if i >= start],
    )


class PooledProbes:
    """Fast mode: the long-lived probe streams of one (chunk size, D) (module docs)."""

    reuse = True

    def __init__(self, settings: ProtocolSettings, chunk_size: int, d: int, max_tokens: int,
                 engine: str | None = None) -> None:
        self.settings = settings
        self.chunk_size = chunk_size
        self.d = d
        self.engine = engine
        self.max_tokens = max_tokens
        self.streams: list[TokenStream] = []
        self.stream_tokens = max_tokens
        self.sets_started = 0
        self.sets_cancelled = 0  # sets retired by cancelling their leftover tokens
        self.injections = 0
        self.upcoming: list[int] = []  # prefill sizes of the injections planned next, in order
        self._driver: EngineDriver | None = None
        self._window_end_ns: float | None = None  # the last window's end on these streams (`traces`)

    def plan(self, prefill_sizes: Sequence[int]) -> None:
        self.upcoming = list(prefill_sizes)

    def plan_first(self, prefill_sizes: Sequence[int]) -> None:
        """Injections that come before the planned ones (a CV re-run attempt), so the set that
        carries them is sized for them too."""
        self.upcoming[:0] = list(prefill_sizes)

    def _need(self, p: int) -> int:
        if self.engine is None:  # the chunk schedule is the engine's rule
            raise ConfigError("pooled probes: no engine named, so no chunk schedule to size a set by")
        return self.settings.window_tokens(self.engine, p, self.chunk_size, self.d)

    def _can_carry(self, p: int) -> bool:
        need = self._need(p)
        return bool(self.streams) and all(not s.done and self.stream_tokens - s.n_tokens >= need for s in self.streams)

    def _set_tokens(self, p: int) -> int:
        """max_tokens of a new set: this injection and as many planned ones as the drift allows."""
        allowance = self.max_tokens - self.settings.inject_at_tokens
        budget = self._need(p)
        for q in self.upcoming[1:] if self.upcoming[:1] == [p] else self.upcoming:
            if budget + self._need(q) > allowance:
                return self.max_tokens
            budget += self._need(q)
        return min(self.max_tokens, self.settings.inject_at_tokens + budget)

    async def ready(self, driver: EngineDriver, d: int, p: int) -> list[TokenStream]:
        self._driver = driver
        if not self._can_carry(p):
            await self.retire()
            self.stream_tokens = self._set_tokens(p)
            self.streams = start_probes(driver, self.d, self.settings, max_tokens=self.stream_tokens)
            self._window_end_ns = None  # fresh streams: no window before on them
            self.sets_started += 1
        if self.upcoming and self.upcoming[0] == p:
            self.upcoming.pop(0)
        self.injections += 1
        await wait_steady(driver, self.streams, self.settings)
        return list(self.streams)

    async def settle(self, driver: EngineDriver, streams: Sequence[TokenStream],
                     after_ns: int) -> tuple[int, list[TokenStream]]:
        return await _fresh_token(driver, streams, after_ns, self.settings)

    async def release(self, driver: EngineDriver, streams: Sequence[TokenStream]) -> None:
        return None  # the streams go on to the next window

    def traces(self, streams: Sequence[TokenStream], t_inject_ns: int,
               window_end_ns: float | None = None) -> list[StreamTrace]:
        """Each stream cut to the shape of a fresh probe (module docs), and never reaching back past
        the window before's end: its recovery intervals are this window's counted pre-injection
        intervals, and where there are fewer than `inject_at_tokens` of them (`after_intervals`
        below it; the warm-up's short windows) the tokens before it fall in the discarded
        `warmup_tokens`, not among them."""
        keep = self.settings.warmup_tokens + self.settings.inject_at_tokens
        before, self._window_end_ns = self._window_end_ns, window_end_ns
        out = []
        for s in streams:
            trace = StreamTrace.of(s)
            since = keep if before is None else sum(
                n for t, n in zip(trace.event_times_ns, trace.event_tokens) if before < t <= t_inject_ns)
            out.append(trim_trace(trace, t_inject_ns, min(keep, since + self.settings.warmup_tokens)))
        return out

    def raw_extra(self) -> dict[str, Any]:
        return {"probe_reuse": True}

    async def abandon(self, driver: EngineDriver, others: Sequence[TokenStream]) -> None:
        """A failed window retires the set (the next window starts a fresh one) and ends `others`."""
        self._driver = self._driver or driver
        await self.retire(raise_failures=False)
        await end_streams(driver, others, self.settings.window_timeout_s)

    async def retire(self, *, raise_failures: bool = True) -> None:
        """End the current set before anything else runs: cancelled where the driver can (its
        leftover tokens would only be waited for), else let run out (`drain`)."""
        if self.streams and isinstance(self._driver, Cancelling):
            streams, self.streams = self.streams, []
            if raise_failures:
                for s in streams:
                    s.raise_if_failed()
            await self._driver.cancel(streams)
            self.sets_cancelled += 1
            return
        await self.drain(raise_failures=raise_failures)

    async def drain(self, *, raise_failures: bool = True) -> None:
        """Let the current set run out (it must not overlap the next set or the next Phase 1)."""
        streams, self.streams = self.streams, []
        if not streams or self._driver is None:
            return
        ok = await self._driver.progress.wait_until(lambda: all(s.done for s in streams),
                                                    self.settings.window_timeout_s)
        if raise_failures:
            for s in streams:
                s.raise_if_failed()
        if not ok:
            raise MeasurementError(f"{len(streams)} fast-mode probe streams did not finish")
