"""Passive mode inside the live runner (`pdexporter run --passive`): the tracker
(`exporter.passive`) fed with the probe streams the book holds, the engine scrapes and the spans
posted to `/v1/traces`; its finished events counted, published as `mode="passive"` window series
and, with `--out`, written as repetitions of their cell's record (`config.mode: "passive"`)."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator

from pdexporter.engine.traces import RequestTrace
from pdexporter.exporter.book import ProbeBook
from pdexporter.exporter.config import ExporterConfig
from pdexporter.exporter.metrics import ExporterMetrics, count_trace_export, count_traces, grid_labels, publish_window
from pdexporter.exporter.passive import PassiveEvent, PassiveSettings, PassiveTracker, step_model_cadence
from pdexporter.exporter.scrape import EngineScraper
from pdexporter.exporter.tracing import ClockOffset
from pdexporter.measure.driver import EngineInfo
from pdexporter.measure.point import PointSpec, now_iso, record_config, resumable_reps
from pdexporter.measure.records import RepRecord, aggregate
from pdexporter.measure.store import ResultsStore


class LivePassive:
    def __init__(self, config: ExporterConfig, info: EngineInfo, metrics: ExporterMetrics, book: ProbeBook,
                 store: ResultsStore | None) -> None:
        self.config, self.info, self.metrics, self.book, self.store = config, info, metrics, book, store
        settings = PassiveSettings(
            chunk_size=config.chunk_size, engine=info.kind, window=config.protocol.window,
            probe_prompt_tokens=config.protocol.decode_context_tokens,
            probe_max_tokens=config.protocol.decode_output_tokens,
            baseline_span_s=config.baseline_span_s, min_baseline_intervals=config.min_baseline_intervals,
            attribution_wait_s=config.attribution_wait_s,
        )
        # The engine's spans carry its Unix clock; the probes are stamped on perf_counter_ns. The
        # cadence source's step-time model is the embedded engine's profile, scaled by what the
        # traces and /metrics teach it (exporter.passive).
        self.tracker = PassiveTracker(
            settings, trace_offset_ns=ClockOffset.measure().offset_ns,
            cadence=step_model_cadence(info.profile or config.profile, config.protocol.decode_context_tokens + 128),
        )
        self.outcomes: collections.Counter[str] = collections.Counter()
        book.phase_of = self.tracker.phase_of

    def add_traces(self, traces: list[RequestTrace]) -> None:
        own = self.tracker.own_traces_seen
        production = self.tracker.add_traces(traces)
        probes = self.tracker.own_traces_seen - own
        count_traces(self.metrics, "production", production)
        count_traces(self.metrics, "probe", probes)
        count_traces(self.metrics, "unusable", len(traces) - production - probes)

    def tick(self, scraper: EngineScraper | None, windows_so_far: int) -> Iterator[tuple[PassiveEvent, RepRecord, str | None]]:
        """Advance the tracker; scrape when it asks; count every finished event and publish the
        single-prefill ones. Yields (event, its repetition record, its record file)."""
        now_ns = time.perf_counter_ns()
        events = self.tracker.poll([state.stream for state in self.book.all_states()], now_ns)
        if scraper is not None and not self.book.stopping and self.tracker.wants_scrape(now_ns):
            scraper.trigger()
        self.book.hold_from = self.tracker.label_frontier(now_ns)
        for event in events:
            self.outcomes[event.outcome] += 1
            self.metrics.passive_events.labels(outcome=event.outcome, source=event.source or "none").inc()
            if event.published:
                assert event.rep is not None and event.key is not None
                chunk, d_bin, p_bin = event.key
                rep = event.rep.model_copy(update={"rep": windows_so_far, "started_at": now_iso()})
                windows_so_far += 1
                record_path = self._save(event, rep) if self.store is not None else None
                publish_window(self.metrics, grid_labels(chunk, d_bin, p_bin, mode="passive"), rep)
                yield event, rep, record_path

    def _save(self, event: PassiveEvent, rep: RepRecord) -> str:
        """The event as the next repetition of its cell's passive record (raw file first)."""
        assert self.store is not None and event.key is not None and event.run is not None
        spec = PointSpec(*event.key)
        config = record_config(spec, self.info, self.config.protocol, reps=1, mode="passive",
                               chunk_size_source=self.config.chunk_size_source)
        path = str(self.store.record_path(*event.key))
        done = resumable_reps(self.store.load_record(*event.key), config, path)
        raw_path = self.store.raw_path(*event.key, len(done))
        self.store.save_raw(raw_path, event.run.to_raw())
        done.append(rep.model_copy(update={"rep": len(done), "raw": self.store.relative(event.key[0], raw_path),
                                           "passive": event.info()}))
        self.store.save_record(aggregate(config.model_copy(update={"reps_planned": len(done)}), done))
        return path


class TraceIntake:
    """What the exporter's `POST /v1/traces` receives: every export counted, the spans handed to
    passive mode (`passive`, set once it runs) or counted as ignored."""

    def __init__(self, metrics: ExporterMetrics) -> None:
        self.metrics = metrics
        self.passive: LivePassive | None = None

    def exported(self, ok: bool) -> None:
        count_trace_export(self.metrics, ok)

    def sink(self, traces: list[RequestTrace]) -> None:
        if self.passive is None:
            count_traces(self.metrics, "ignored", len(traces))
        else:
            self.passive.add_traces(traces)


__all__ = ["LivePassive", "TraceIntake"]
