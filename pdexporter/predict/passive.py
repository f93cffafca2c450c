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


async def passive_session(  # noqa: C901 (17: to shrink)
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
    settings = settings or ProtocolSettings()
    started = time.perf_counter()
    driver = SimDriver.create(profile, chunk_size)
    session = PassiveSession(chunk_size=driver.info.chunk_size or chunk_size, modelled=driver.info.modelled,
                             info=driver.info)
    engine = driver.engine
    offset_ns = round((engine.clock.wall() - engine.clock.now()) * 1e9)
    tracker = PassiveTracker(
        PassiveSettings(
            chunk_size=session.chunk_size, engine=driver.info.kind, window=settings.window,
            probe_prompt_tokens=settings.decode_context_tokens, probe_max_tokens=settings.decode_output_tokens,
            baseline_span_s=baseline_span_s, attribution_wait_s=attribution_wait_s, sources=tuple(sources),
        ),
        trace_offset_ns=offset_ns,
        cadence=step_model_cadence(driver.info.profile or str(profile), settings.decode_context_tokens + 128,
                                   driver.info.kind),
    )
    spans: list[RequestTrace] = []
    session.trace_offset_ns = offset_ns

    def on_finished(trace: RequestTrace) -> None:
        spans.append(trace)
        session.requests[trace.request_id] = trace

    engine.on_request_finished = on_finished
    loop = asyncio.get_running_loop()
    try:
        await warm_prefix(driver, settings)
        # staggered first lengths, as the live exporter's probe slots in passive mode
        live: list[TokenStream] = [
            start_probes(
                driver,
                1,
                settings,
                max_tokens=max(settings.warmup_tokens + 2, round(settings.decode_output_tokens * (k + 1) / probes)),
            )[0]
            for k in range(probes)
        ]
        finished: collections.deque[TokenStream] = collections.deque()
        load_task = asyncio.create_task(drive(driver, schedule(load)))
        t_start = loop.time()
        next_scrape = next_spans = t_start

        def tick_streams() -> None:
            for i, s in enumerate(live):
                if s.finished:
                    finished.append(s)
                    session.probe_tokens += s.n_tokens
                    live[i] = start_probes(driver, 1, settings)[0]
            horizon = driver.now_ns() - (baseline_span_s + 15.0) * 1e9
            while finished and (finished[0].t_finished_ns or 0) < horizon:
                finished.popleft()

        async def scrape() -> None:
            snap = await driver.scrape_metrics()
            if snap is not None:
                now = driver.now_ns()
                tracker.add_scrape(snap, now, now)
                session.scrapes += 1

        def record(events: list[PassiveEvent]) -> None:
            for event in events:
                session.events.append(event)
                session.outcomes[event.outcome] += 1
                if on_event is not None:
                    on_event(event)

        end = t_start + load.duration_s
        while True:
            now = loop.time()
            load_done = load_task.done()
            if load_done and (now >= end + attribution_wait_s + 5.0 or (now >= end and tracker.pending == 0)):
                break
            tick_streams()
            if now >= next_spans:
                next_spans = now + span_delay_s
                if spans:
                    batch, spans[:] = list(spans), []
                    kind = driver.info.kind
                    received = decode_traces(encode_traces(batch, engine=kind), engine=kind)
                    session.traces += len(tracker.add_traces(received))
            if now >= next_scrape or tracker.wants_scrape(driver.now_ns()):
                if now >= next_scrape:
                    next_scrape = now + scrape_interval_s
                await scrape()
            record(tracker.poll([*finished, *live], driver.now_ns()))
            await asyncio.sleep(TICK_S)
        session.load = load_task.result()
        session.engine_s = min(load.duration_s, loop.time() - t_start)
        session.probe_tokens += sum(s.n_tokens for s in live)
    finally:
        await driver.aclose()
    session.wall_s = time.perf_counter() - started
    return session


__all__ = ["PassiveSession", "passive_session"]
