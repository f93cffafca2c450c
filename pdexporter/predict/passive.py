"""Passive mode on the embedded engine in process: probes beside a synthetic production load,
the engine's request traces and /metrics, and the exporter's own `PassiveTracker`, all on one
asyncio loop: virtual time under `run_virtual` (minutes of traffic in seconds, for CI and the
comparison benchmark), real time under `asyncio.run`.

What the live exporter gets over the network arrives here in process, through the same code
paths: the engine's finished requests become vLLM-shaped OTLP spans (`client.traces.encode_traces`
-> bytes -> `decode_traces`, the receiver's decoder), exported in batches every `span_delay_s`
as vLLM's BatchSpanProcessor does (5 s by default); /metrics is read as a snapshot of the
engine's own registry (`SimDriver.scrape_metrics`), periodically and whenever the tracker asks.
The probes are the exporter's: N streams on the shared prefix, restarted as they end.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdexporter.client.stream import TokenStream
from pdexporter.client.traces import RequestTrace, decode_traces, encode_traces
from pdexporter.exporter.passive import PassiveEvent, PassiveSettings, PassiveTracker, step_model_cadence
from pdexporter.load.drive import LoadResult, drive
from pdexporter.load.mix import LoadSpec, schedule
from pdexporter.measure.driver import EngineInfo
from pdexporter.measure.passive import SOURCES
from pdexporter.measure.protocol import ProtocolSettings, start_probes, warm_prefix
from pdexporter.measure.sim_driver import SimDriver
from pdexporter.sim.profile import Profile

TICK_S = 0.05  # the tracker's cadence, as the live runner's


@dataclass
class PassiveSession:
    events: list[PassiveEvent] = field(default_factory=list)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    load: LoadResult | None = None
    engine_s: float = 0.0  # engine time the load ran for
    probe_tokens: int = 0
    scrapes: int = 0
    traces: int = 0
    wall_s: float = 0.0
    chunk_size: int = 0
    modelled: bool = True
    requests: dict[str, RequestTrace] = field(default_factory=dict)  # every finished request's trace (ground truth)
    trace_offset_ns: int = 0  # engine Unix clock - probe clock
    info: EngineInfo | None = None  # the engine, as a record's config names it

    @property
    def published(self) -> list[PassiveEvent]:
        return [e for e in self.events if e.published]


class _Loop:
    """What one passive session's loop keeps between its ticks: the probe streams (live, and the
    finished ones its baseline still reads), the spans not yet exported, and per tracker its session
    (several trackers, one per source set, can watch one engine run: `passive_sessions`)."""

    def __init__(self, driver: SimDriver, trackers: list[PassiveTracker], sessions: list[PassiveSession],
                 settings: ProtocolSettings, baseline_span_s: float,
                 on_event: Callable[[PassiveEvent], None] | None) -> None:
        self.driver, self.trackers, self.sessions, self.settings = driver, trackers, sessions, settings
        self.baseline_span_s, self.on_event = baseline_span_s, on_event
        self.live: list[TokenStream] = []
        self.finished: collections.deque[TokenStream] = collections.deque()
        self.spans: list[RequestTrace] = []

    def on_finished(self, trace: RequestTrace) -> None:
        self.spans.append(trace)
        for session in self.sessions:
            session.requests[trace.request_id] = trace

    def start(self, probes: int) -> None:
        """The probe streams, their first lengths staggered as the live exporter's in passive mode."""
        s = self.settings
        self.live = [
            start_probes(self.driver, 1, s,
                         max_tokens=max(s.warmup_tokens + 2, round(s.decode_output_tokens * (k + 1) / probes)))[0]
            for k in range(probes)
        ]

    def tick_streams(self) -> None:
        for i, stream in enumerate(self.live):
            if stream.finished:
                self.finished.append(stream)
                for session in self.sessions:
                    session.probe_tokens += stream.n_tokens
                self.live[i] = start_probes(self.driver, 1, self.settings)[0]
        horizon = self.driver.now_ns() - (self.baseline_span_s + 15.0) * 1e9
        while self.finished and (self.finished[0].t_finished_ns or 0) < horizon:
            self.finished.popleft()

    def export_spans(self) -> None:
        """The finished requests' spans through the OTLP encoding and back, as an engine sends them
        (decoded for each tracker: what one receiver decoded is its own)."""
        if self.spans:
            batch, self.spans[:] = list(self.spans), []
            kind = self.driver.info.kind
            body = encode_traces(batch, engine=kind)
            for tracker, session in zip(self.trackers, self.sessions):
                session.traces += len(tracker.add_traces(decode_traces(body, engine=kind)))

    async def scrape(self, due: list[bool]) -> None:
        """One snapshot of /metrics for the trackers it is due to (the periodic scrape, or one a
        tracker asked for: each gets only what its own exporter would have scraped)."""
        snap = await self.driver.scrape_metrics()
        if snap is not None:
            now = self.driver.now_ns()
            for tracker, session, wanted in zip(self.trackers, self.sessions, due):
                if wanted:
                    tracker.add_scrape(snap, now, now)
                    session.scrapes += 1

    def poll(self) -> None:
        streams = [*self.finished, *self.live]
        for tracker, session in zip(self.trackers, self.sessions):
            for event in tracker.poll(streams, self.driver.now_ns()):
                session.events.append(event)
                session.outcomes[event.outcome] += 1
                if self.on_event is not None:
                    self.on_event(event)


async def passive_session(
    profile: str | Path | Profile,
    chunk_size: int,
    load: LoadSpec,
    *,
    probes: int = 4,
    settings: ProtocolSettings | None = None,
    sources: Sequence[str] = SOURCES,
    scrape_interval_s: float = 1.0,
    span_delay_s: float = 5.0,
    attribution_wait_s: float = 30.0,
    baseline_span_s: float = 10.0,
    on_event: Callable[[PassiveEvent], None] | None = None,
) -> PassiveSession:
    """Run `load` beside `probes` probe streams and the passive tracker; every event is returned."""
    (session,) = await passive_sessions(
        profile, chunk_size, load, [sources], probes=probes, settings=settings, scrape_interval_s=scrape_interval_s,
        span_delay_s=span_delay_s, attribution_wait_s=attribution_wait_s, baseline_span_s=baseline_span_s,
        on_event=on_event)
    return session


async def passive_sessions(
    profile: str | Path | Profile,
    chunk_size: int,
    load: LoadSpec,
    source_sets: Sequence[Sequence[str]],
    *,
    probes: int = 4,
    settings: ProtocolSettings | None = None,
    scrape_interval_s: float = 1.0,
    span_delay_s: float = 5.0,
    attribution_wait_s: float = 30.0,
    baseline_span_s: float = 10.0,
    on_event: Callable[[PassiveEvent], None] | None = None,
) -> list[PassiveSession]:
    """`passive_session` for several source sets at once: one engine run (one load, the same probe
    streams, spans and /metrics), one tracker per set, as exporters of different `--sources` beside
    the same engine would see it; a session per set, in order. Each tracker gets the periodic
    scrapes and those it asked for itself."""
    settings = settings or ProtocolSettings()
    started = time.perf_counter()
    driver = SimDriver.create(profile, chunk_size)
    engine = driver.engine
    offset_ns = round((engine.clock.wall() - engine.clock.now()) * 1e9)
    cadence = step_model_cadence(driver.info.profile or str(profile), settings.decode_context_tokens + 128,
                                 driver.info.kind)
    sessions, trackers = [], []
    for sources in source_sets:
        sessions.append(PassiveSession(chunk_size=driver.info.chunk_size or chunk_size, modelled=driver.info.modelled,
                                       info=driver.info, trace_offset_ns=offset_ns))
        trackers.append(PassiveTracker(
            PassiveSettings(
                chunk_size=sessions[-1].chunk_size, engine=driver.info.kind, window=settings.window,
                probe_prompt_tokens=settings.decode_context_tokens, probe_max_tokens=settings.decode_output_tokens,
                baseline_span_s=baseline_span_s, attribution_wait_s=attribution_wait_s, sources=tuple(sources),
            ),
            trace_offset_ns=offset_ns, cadence=cadence,
        ))
    state = _Loop(driver, trackers, sessions, settings, baseline_span_s, on_event)
    engine.on_request_finished = state.on_finished
    loop = asyncio.get_running_loop()
    try:
        await warm_prefix(driver, settings)
        state.start(probes)
        load_task = asyncio.create_task(drive(driver, schedule(load)))
        t_start = loop.time()
        next_scrape = next_spans = t_start
        end = t_start + load.duration_s
        while True:
            now = loop.time()
            if load_task.done() and (now >= end + attribution_wait_s + 5.0
                                     or (now >= end and all(t.pending == 0 for t in trackers))):
                break
            state.tick_streams()
            if now >= next_spans:
                next_spans = now + span_delay_s
                state.export_spans()
            periodic = now >= next_scrape
            due = [periodic or t.wants_scrape(driver.now_ns()) for t in trackers]
            if any(due):
                if periodic:
                    next_scrape = now + scrape_interval_s
                await state.scrape(due)
            state.poll()
            await asyncio.sleep(TICK_S)
        result = load_task.result()
        live_tokens = sum(s.n_tokens for s in state.live)
        for session in sessions:
            session.load = result
            session.engine_s = min(load.duration_s, loop.time() - t_start)
            session.probe_tokens += live_tokens
    finally:
        await driver.aclose()
    for session in sessions:
        session.wall_s = time.perf_counter() - started
    return sessions


__all__ = ["PassiveSession", "passive_session", "passive_sessions"]
