"""What the exporter plugs into `measure.protocol.run_window`: its never-ending probe streams, the
quiet-period baseline, and a driver whose requests leave from the probe thread.

- `ProbeState`: the runner's view of one probe stream (its per-token times, how far its intervals
  were labelled, its span). The probe thread only appends to the stream.
- `ContinuousProbes` (a `ProbeSet`): a window may start once every probe is in the seed's steady
  state, still has one window's tokens to decode, and the quiet period before holds enough
  intervals (`timeline.ready_to_inject`); after the engine scrape it waits for `SETTLE_TOKENS`
  fresh tokens on every probe, and from then on (t_decide) no interval is labelled `baseline`
  until the window is analysed.
- `QuietBaseline` (a `BaselineSource`): the probe intervals of the quiet period before t_decide
  (`timeline.quiet_baseline`).
- `LoopDriver` (an `EngineDriver`): `start` hands an already-encoded request to the probe loop
  (the client stamps t_inject there), waits poll (`PollingProgress`), scrapes go through the
  runner's own client on its loop.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pdexporter.client.metrics import MetricsSnapshot
from pdexporter.client.stream import PollingProgress, TokenStream
from pdexporter.engines import IterationStep
from pdexporter.errors import MeasurementError
from pdexporter.exporter import timeline
from pdexporter.exporter.config import ExporterConfig
from pdexporter.exporter.probes import ProbeLoop
from pdexporter.measure.driver import Cancelling, EngineInfo, PreparedRequest
from pdexporter.measure.protocol import StreamTrace
from pdexporter.measure.window import BaselineStats, token_times

__all__ = [
    "ContinuousProbes", "LiveView", "LoopDriver", "POLL_S", "ProbeState", "QuietBaseline", "SETTLE_TOKENS",
    "Stopping",
]

SETTLE_TOKENS = 4  # tokens every probe receives between the engine scrape and the injection
POLL_S = 0.01  # while a window is open: how often its state is looked at (timestamps are not affected)


class Stopping(Exception):
    """The exporter is shutting down: the window in preparation is dropped, nothing is counted."""


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
    attempt_seen: BaseException | None = None  # the stream's last failed attempt the book took note of

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
            self.times.extend(
                token_times(s.event_times_ns[seen - 1 : n], s.event_tokens[seen - 1 : n])[anchor:].tolist()
            )
        self.events_seen = n
        return int(sum(s.event_tokens[seen:n]))

    def array(self) -> np.ndarray:
        return np.asarray(self.times, dtype=np.float64)


class LiveView(Protocol):
    """What the probe set and the baseline need from the runner."""

    config: ExporterConfig
    stopping: bool
    quiet_from: float  # the previous window's recovery end (ns)
    last_error: BaseException | None  # the probes' last failure, until a token comes

    def refresh(self) -> None:
        """Pull new tokens from the probe thread, label and publish what can be."""
        ...

    def live_states(self) -> list[ProbeState]: ...

    def all_states(self) -> list[ProbeState]:
        """Finished (still kept) and live probe states."""
        ...

    def hold(self, t_ns: float) -> None:
        """Intervals ending after t_ns wait for the window before they are labelled."""
        ...


class QuietBaseline:
    """The baseline rule of the live exporter (`exporter.timeline`, module docs there)."""

    rule = "live-quiet"

    def __init__(self, view: LiveView) -> None:
        self.view = view

    def at(self, t_decide_ns: int) -> tuple[BaselineStats | None, dict[str, Any]]:
        cfg = self.view.config
        stats, start = timeline.quiet_baseline(
            [s.array() for s in self.view.all_states()], t_decide_ns, self.view.quiet_from,
            cfg.baseline_span_s * 1e9, cfg.protocol.window,
        )
        return stats, {
            "mode": "live",
            "baseline_rule": self.rule,
            # on the driver's clock, like the raw file's t_inject_clock_ns
            "baseline_quiet_from_clock_ns": int(start) if np.isfinite(start) else None,
            "baseline_quiet_to_clock_ns": int(t_decide_ns),
        }


class ContinuousProbes:
    """The exporter's probe streams as a `ProbeSet` (module docs)."""

    def __init__(self, view: LiveView) -> None:
        self.view = view

    def _readiness(self, live: list[ProbeState], t_ns: int, settle_after_ns: int | None) -> timeline.Readiness:
        cfg = self.view.config
        probes = [s.stream for s in live]
        readiness = timeline.ready_to_inject(probes, cfg.probe_streams, cfg.protocol, cfg.reserve_tokens)
        if readiness.ready and settle_after_ns is not None:
            settling = [s for s in live if len(s.times) - bisect.bisect_right(s.times, settle_after_ns) < SETTLE_TOKENS]
            if settling:
                return timeline.Readiness(False, f"{len(settling)} probe stream(s) settling after the scrape")
        if readiness.ready:  # the quiet-period count only once the streams are there (it costs more)
            start = max(t_ns - cfg.baseline_span_s * 1e9, self.view.quiet_from)
            arrays = [s.array() for s in self.view.all_states() if s.times and s.times[-1] > start]
            n_quiet = timeline.quiet_intervals_ns(arrays, start, t_ns, cfg.protocol.window).size
            readiness = timeline.ready_to_inject(probes, cfg.probe_streams, cfg.protocol, cfg.reserve_tokens,
                                                 n_quiet, cfg.min_baseline_intervals)
        return readiness

    async def _until_ready(self, settle_after_ns: int | None = None) -> tuple[int, list[ProbeState]]:
        cfg = self.view.config
        deadline = time.monotonic() + cfg.ready_timeout_s
        while True:
            if self.view.stopping:
                raise Stopping()
            self.view.refresh()
            live = self.view.live_states()
            t_ns = time.perf_counter_ns()
            readiness = self._readiness(live, t_ns, settle_after_ns)
            if readiness.ready:
                return t_ns, live
            if time.monotonic() > deadline:
                # why the probes are not there, where the engine said (a 404: the model it serves changed)
                why = f" (the probes' last error: {self.view.last_error})" if self.view.last_error else ""
                raise MeasurementError(f"no injection within {cfg.ready_timeout_s:g} s: {readiness.reason}{why}")
            await asyncio.sleep(POLL_S)

    async def ready(self, driver: Any, d: int, p: int) -> list[TokenStream]:
        _, live = await self._until_ready()
        return _open(live)

    async def settle(self, driver: Any, streams: Sequence[TokenStream],
                     after_ns: int) -> tuple[int, list[TokenStream]]:
        t_decide, live = await self._until_ready(settle_after_ns=after_ns)
        self.view.hold(t_decide)
        self.view.refresh()
        return t_decide, _open(live)  # probes that ended while settling were replaced

    async def release(self, driver: Any, streams: Sequence[TokenStream]) -> None:
        return None  # they go on decoding, and are restarted as they end

    def traces(self, streams: Sequence[TokenStream], t_inject_ns: int,
               window_end_ns: float | None = None) -> list[StreamTrace]:
        return [StreamTrace.of(s) for s in streams]

    def raw_extra(self) -> dict[str, Any]:
        return {}

    async def abandon(self, driver: Any, others: Sequence[TokenStream]) -> None:
        """The probes go on (they are the exporter's, restarted as they end); a failed window's
        prefill is cancelled where the driver can."""
        if isinstance(driver, Cancelling):
            await driver.cancel([s for s in others if not s.done])


def _open(states: Sequence[ProbeState]) -> list[TokenStream]:
    return [s.stream for s in states if s.stream.t_sent_ns is not None and not s.stream.done]


class LoopDriver:
    """An `EngineDriver` whose requests leave from the probe thread (module docs)."""

    def __init__(self, probes: ProbeLoop, scrape: Callable[[], Awaitable[MetricsSnapshot | None]],
                 on_poll: Callable[[], None], on_send: Callable[[TokenStream], None] | None = None) -> None:
        assert probes.driver is not None, "the probe loop must have started"
        self.probes = probes
        self.inner = probes.driver
        self._scrape = scrape
        self.on_send = on_send
        self.progress = PollingProgress(POLL_S, on_poll)
        self.sent = 0
        self._ids = itertools.count()

    @property
    def info(self) -> EngineInfo:
        return self.inner.info

    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def prepare(self, prompt_token_ids: Sequence[int], max_tokens: int, tag: str) -> PreparedRequest:
        return self.probes.prepare(tuple(prompt_token_ids), max_tokens, tag)

    def start(self, prepared: PreparedRequest, *, retry_connect: bool = False) -> TokenStream:
        stream = TokenStream(f"{prepared.tag}-live-{next(self._ids)}", prepared.tag, max_tokens=prepared.max_tokens)
        self.probes.send(prepared, stream, retry_connect=retry_connect)
        self.sent += 1
        if self.on_send is not None:
            self.on_send(stream)
        return stream

    async def scrape_metrics(self) -> MetricsSnapshot | None:
        return await self._scrape()

    def step_mark(self) -> object | None:
        return self.inner.step_mark()

    def steps_since(self, mark: object | None) -> list[IterationStep] | None:
        return self.inner.steps_since(mark)

    async def aclose(self) -> None:
        return None  # the probe loop owns the connections
