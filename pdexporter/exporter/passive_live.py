"""Passive mode inside the live runner (`pdexporter run --passive`): the tracker
(`exporter.passive`) fed with the probe streams the book holds, the engine scrapes and the spans
posted to `/v1/traces`; its finished events counted, published as `mode="passive"` window series
and, with `--out`, written as repetitions of their cell's record (`config.mode: "passive"`).

The published events also feed the event-fitted cost model (`analysis.passive_model`), refitted
in a worker thread every `MODEL_EVERY_S` (or 20 times as long as the last fit took, whichever
is longer: at most 5 % of a core) once new events came, every `MODEL_FIRST_EVERY_S` until a fit
gave an answer (the first events are too few: the first numbers come seconds after there are
enough): its events, how sure it is and its prediction of every cell of the seed's grid at the
exporter's B go out as the `pdexporter_passive_model_*` gauges. With a two-arm
decision.json (`--decision`), every `--threshold-every` the refit also gives the router thresholds at the
exporter's B (`analysis.live_thresholds`: the colocated side from the events, the rest from the file;
`analysis.thresholds`' one computation): `pdexporter_offload_threshold_*` and `GET /thresholds.yaml`.
numpy and pandas are imported when passive mode fits, not by an exporter that never runs it."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pdexporter.client.traces import RequestTrace
from pdexporter.exporter.book import ProbeBook
from pdexporter.exporter.config import ExporterConfig
from pdexporter.exporter.metrics import (
    LAUNCH_LEVEL_LABELS,
    THRESHOLD_BOUNDS,
    ExporterMetrics,
    count_trace_export,
    count_traces,
    grid_labels,
    publish_window,
)
from pdexporter.exporter.passive import PassiveEvent, PassiveSettings, PassiveTracker, step_model_cadence
from pdexporter.exporter.scrape import EngineScraper
from pdexporter.exporter.tracing import ClockOffset
from pdexporter.measure.driver import EngineInfo
from pdexporter.measure.passive import JOINT_DIR, MERGED_DIR, REQUESTS_LOG, RequestPrefill
from pdexporter.measure.point import PointSpec, now_iso, record_config, resumable_reps
from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.measure.records import RepRecord, aggregate
from pdexporter.measure.store import ResultsStore

if TYPE_CHECKING:  # numpy and pandas: imported when passive mode runs, not by every exporter
    from pdexporter.analysis.live_thresholds import LiveThresholds
    from pdexporter.analysis.passive_model import FitEvent, PassiveAnswer

MODEL_EVERY_S = 30.0
MODEL_FIRST_EVERY_S = 5.0  # until a fit has given an answer (too few events yet): tried again this soon
MODEL_EVENTS = 2000  # the most recent events the live model keeps (about an hour at 1.5 requests/s)
MODEL_BOOTSTRAP = 40  # refits behind the live intervals (export-table uses more)
MODEL_SHARE = 20  # a refit starts at most every 20x the last one's time: <= 5 % of a core
THRESHOLD_EVERY_S = 120.0  # the live thresholds' refresh (`run --threshold-every`)
# what a refit hands back: the answer, the thresholds (or why none), the last minutes' launch-bound one-chunk
# events at the fast and the slow level (None: no two clear levels), the seconds it took
FitResult = tuple["PassiveAnswer | None", "LiveThresholds | str | None", "tuple[int, int] | None", float]


def fit_event(event: PassiveEvent, at_s: float) -> FitEvent | None:
    """What the event model needs of a published or joint event (None for one it cannot use)."""
    from pdexporter.analysis.passive_model import FitEvent

    rep, a = event.rep, event.attribution
    if rep is None or a is None or event.decode_batch_size is None or rep.derived.total_interference_ms is None:
        return None
    chunk = event.key[0] if event.key is not None else 0
    return FitEvent(chunk, event.decode_batch_size, a.prompt_tokens, rep.derived.total_interference_ms,
                    rep.baseline.tpot_p50_ms, tuple(rep.interference.chunk_step_times_ms or ()), at_s, a.source,
                    event.cadence_prompt_tokens, a.prefills if a.joint else 1)


class LiveModel:
    """The event-fitted model of a live passive run (module docs). With a two-arm `decision`
    (`run --passive --decision FILE`), every `threshold_every_s` the fit also refreshes the router
    thresholds (`analysis.live_thresholds`): the `pdexporter_offload_threshold_*` gauges and
    `snippet()`, what `GET /thresholds.yaml` serves."""

    def __init__(self, metrics: ExporterMetrics, chunk_size: int, engine: str, *,
                 decision: dict[str, Any] | None = None, threshold_every_s: float = THRESHOLD_EVERY_S,
                 modelled: bool = False) -> None:
        from pdexporter.analysis.passive_model import Grid

        self.metrics, self.grid, self.engine = metrics, Grid((chunk_size,)), engine  # engine: its series' label
        self.events: collections.deque[FitEvent] = collections.deque(maxlen=MODEL_EVENTS)
        self.started_ns: float | None = None
        self.fitted = 0  # events added when the last fit started
        self.added = 0
        self.next_s = 0.0
        self.last: PassiveAnswer | None = None
        self.decision, self.threshold_every_s, self.modelled = decision, threshold_every_s, modelled
        self.thresholds: LiveThresholds | None = None
        self.thresholds_at_s: float | None = None  # time.monotonic() of the last refresh
        self.thresholds_next_s = 0.0
        self.thresholds_error: str | None = None  # why the last refresh gave no thresholds
        self._future: concurrent.futures.Future[FitResult] | None = None

    def add(self, event: PassiveEvent, now_ns: float) -> None:
        self.started_ns = now_ns if self.started_ns is None else self.started_ns
        row = fit_event(event, (now_ns - self.started_ns) / 1e9)
        if row is not None:
            self.events.append(row)
            self.added += 1

    def tick(self, now_s: float) -> None:
        """Publish a finished fit (and thresholds); start the next one when it is due."""
        if self._future is not None and self._future.done():
            future, self._future = self._future, None
            result, live, levels, took = future.result()
            every = MODEL_EVERY_S if result is not None or self.last is not None else MODEL_FIRST_EVERY_S
            self.next_s = now_s + max(every, MODEL_SHARE * took)
            if result is not None:
                self.last = result
                self.publish(result)
                publish_levels(self.metrics, levels)
            if isinstance(live, str):
                self.thresholds_error = live
            elif live is not None:
                self.thresholds, self.thresholds_at_s, self.thresholds_error = live, now_s, None
                self.thresholds_next_s = now_s + self.threshold_every_s
                publish_thresholds(self.metrics, live)
        if self._future is None and self.added > self.fitted and now_s >= self.next_s:
            self.fitted = self.added
            events, grid = list(self.events), self.grid
            decision = self.decision if self.decision is not None and now_s >= self.thresholds_next_s else None
            self._future = asyncio.get_running_loop().run_in_executor(  # type: ignore[assignment]
                None, _fit, events, grid, decision, self.modelled)

    def snippet(self, now_s: float) -> tuple[str, float] | None:
        """The llm-d decider configuration for the current load and its age (s), once computed."""
        if self.thresholds is None or self.thresholds_at_s is None:
            return None
        age = max(0.0, now_s - self.thresholds_at_s)
        return self.thresholds.snippet(age), age

    def retire(self) -> None:
        """Every series this model publishes (cells, intervals, levels, thresholds) back to what an
        exporter that never fitted shows: they were another chunk size's."""
        m = self.metrics
        self.last, self.thresholds = None, None
        for family in (m.passive_model_prediction, m.passive_model_reached, m.passive_model_launch_events,
                       m.offload_threshold, m.offload_threshold_events):
            family.clear()
        for gauge in (m.passive_model_events, m.passive_model_cells, m.passive_model_halfwidth,
                      m.passive_model_launch_slow_share, m.offload_threshold_timestamp):
            gauge.set(0)

    def publish(self, result: PassiveAnswer) -> None:
        m = self.metrics
        m.passive_model_events.set(result.model.events)
        width = result.halfwidth
        m.passive_model_halfwidth.set(math.nan if width is None else width)
        m.passive_model_cells.set(sum(c.reached for c in result.cells))
        for c in result.cells:
            labels = {"chunk_size": str(c.key[0]), "decode_batch_size": str(c.key[1]),
                      "new_prefill_tokens": str(c.key[2]), "engine": self.engine}
            for bound, value in (("estimate", c.aggregate_ms), ("low", c.low_ms), ("high", c.high_ms)):
                m.passive_model_prediction.labels(**labels, bound=bound).set(
                    math.nan if value is None else value / 1e3)
            m.passive_model_reached.labels(**labels).set(1 if c.reached else 0)


def publish_levels(m: ExporterMetrics, levels: tuple[int, int] | None) -> None:
    """`pdexporter_passive_model_launch_events{level}` and `..._launch_slow_share` (module docs of
    `analysis.passive_model`, "Launch levels"): cleared and NaN while the events show no two clear levels."""
    m.passive_model_launch_events.clear()
    if levels is None:
        m.passive_model_launch_slow_share.set(math.nan)
        return
    for level, count in zip(LAUNCH_LEVEL_LABELS, levels, strict=True):
        m.passive_model_launch_events.labels(level=level).set(count)
    fast, slow = levels
    m.passive_model_launch_slow_share.set(slow / (fast + slow) if fast + slow else math.nan)


def publish_thresholds(m: ExporterMetrics, live: LiveThresholds) -> None:
    """`pdexporter_offload_threshold_tokens{bound}` (+Inf: offloading never wins up to p_max; NaN: no
    interval), the events at each D and the refresh's Unix time."""
    m.offload_threshold.clear()
    m.offload_threshold_events.clear()
    for t in live.result.records:
        labels = {"chunk_size": str(t.chunk_size), "decode_batch_size": str(t.decode_batch_size)}
        values = {"central": math.inf if t.threshold is None else float(t.threshold),
                  "low": math.nan if not t.has_interval else (math.inf if t.low is None else float(t.low)),
                  "high": math.nan if not t.has_interval else (math.inf if t.high is None else float(t.high))}
        for bound in THRESHOLD_BOUNDS:
            m.offload_threshold.labels(**labels, bound=bound).set(values[bound])
        m.offload_threshold_events.labels(**labels).set(live.events_by_d.get(t.decode_batch_size, 0))
    m.offload_threshold_timestamp.set(time.time())


def thresholds_response(model: LiveModel | None, now_s: float) -> tuple[int, str, dict[str, str]]:
    """`GET /thresholds.yaml`: (status, body, headers). 200: the live llm-d decider configuration
    for the current load, its age in `Age` (seconds) and the events behind it in
    `X-Pdexporter-Events` (both also in its comments); 503 and why until the first refresh."""
    got = model.snippet(now_s) if model is not None else None
    if got is None or model is None or model.thresholds is None:
        seen = model.added if model is not None else 0
        why = model.thresholds_error if model is not None and model.thresholds_error else (
            "the first comes with the passive model's first fit (>= 4 usable events)")
        return 503, f"no live threshold yet: {seen} production prefill(s) seen; {why}\n", {"Retry-After": "30"}
    text, age = got
    return 200, text, {"Age": str(int(age)), "X-Pdexporter-Events": str(model.thresholds.events),
                       "Cache-Control": "no-store"}


def _fit(events: list[FitEvent], grid: Any, decision: dict[str, Any] | None, modelled: bool) -> FitResult:
    from pdexporter.analysis.passive_model import answer, launch_levels, recent_levels

    started = time.perf_counter()
    result = answer(events, grid, minutes=(), bootstrap=MODEL_BOOTSTRAP)
    levels = recent_levels(events, launch_levels(events, grid, result.model.model)) if result is not None else None
    live: LiveThresholds | str | None = None
    if result is not None and decision is not None:
        from pdexporter.analysis.live_thresholds import live_thresholds

        try:
            live = live_thresholds(decision, result.model, events, grid, modelled=modelled)
        except (ArithmeticError, KeyError, TypeError, ValueError) as exc:  # said by /thresholds.yaml, not fatal
            live = f"the thresholds could not be computed ({type(exc).__name__}: {exc})"
    return result, live, levels, time.perf_counter() - started


class LivePassive:
    def __init__(self, config: ExporterConfig, info: EngineInfo, metrics: ExporterMetrics, book: ProbeBook,
                 store: ResultsStore | None, decision: dict[str, Any] | None = None) -> None:
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
            cadence=step_model_cadence(info.profile or config.profile, config.protocol.decode_context_tokens + 128,
                                       info.kind),
        )
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.model = LiveModel(metrics, config.chunk_size, info.kind, decision=decision,
                               threshold_every_s=config.threshold_every_s, modelled=info.modelled)
        book.phase_of = self.tracker.phase_of

    def retire(self) -> None:
        """The engine runs another chunk size now (`Runner._adopt_chunk_size`): this size's model series
        go, as a run started now would have none (a fresh `LivePassive` takes over; the events already
        recorded stay in their chunk size's directory). A refit still running is left to finish unread."""
        self.model.retire()

    def add_traces(self, traces: list[RequestTrace]) -> None:
        own = self.tracker.own_traces_seen
        added = self.tracker.add_traces(traces)
        production = len(added)
        if added and self.store is not None:
            self._log_requests(added)
        probes = self.tracker.own_traces_seen - own
        count_traces(self.metrics, "production", production)
        count_traces(self.metrics, "probe", probes)
        count_traces(self.metrics, "unusable", len(traces) - production - probes)

    def tick(
        self, scraper: EngineScraper | None, windows_so_far: int
    ) -> Iterator[tuple[PassiveEvent, RepRecord, str | None]]:
        """Advance the tracker; scrape when it asks; count every finished event and publish the
        single-prefill ones. Yields (event, its repetition record, its record file)."""
        now_ns = time.perf_counter_ns()
        events = self.tracker.poll([state.stream for state in self.book.all_states()], now_ns)
        if scraper is not None and not self.book.stopping and self.tracker.wants_scrape(now_ns):
            scraper.trigger()
        self.book.hold_from = self.tracker.label_frontier(now_ns)
        for event in events:
            if event.published or event.joint:
                self.model.add(event, now_ns)
        self.model.tick(time.monotonic())
        for event in events:
            self.outcomes[event.outcome] += 1
            self.metrics.passive_events.labels(outcome=event.outcome, source=event.source or "none").inc()
            if event.joint and self.store is not None:  # the event model's, no window: records under joint/
                assert event.rep is not None
                self._save(event, event.rep.model_copy(update={"started_at": now_iso()}))
            elif event.outcome == "merged" and self.store is not None and event.rep is not None \
                    and event.key is not None:  # kept for a later rule to read (MERGED_DIR), read by no model
                self._save(event, event.rep.model_copy(update={"started_at": now_iso()}))
            if event.published:
                assert event.rep is not None and event.key is not None
                chunk, d_bin, p_bin = event.key
                rep = event.rep.model_copy(update={"rep": windows_so_far, "started_at": now_iso()})
                windows_so_far += 1
                record_path = self._save(event, rep) if self.store is not None else None
                publish_window(
                    self.metrics, grid_labels(chunk, d_bin, p_bin, mode="passive", engine=self.info.kind), rep
                )
                yield event, rep, record_path

    def _save(self, event: PassiveEvent, rep: RepRecord) -> str:
        assert self.store is not None
        folder = {"joint": JOINT_DIR, "merged": MERGED_DIR}.get(event.outcome)
        store = ResultsStore(self.store.root / folder) if folder else self.store
        return save_event(store, event, rep, self.info, self.config.protocol, self.config.chunk_size_source)

    def _log_requests(self, added: list[RequestPrefill]) -> None:
        """Every production prefill the traces told, one JSON line each in `REQUESTS_LOG` (the
        probes' clock, as the raw files): what a later attribution rule needs to read the merged
        runs again. Ids and token counts only: no prompt, no header."""
        assert self.store is not None
        self.store.root.mkdir(parents=True, exist_ok=True)
        with open(self.store.root / REQUESTS_LOG, "a", encoding="utf-8") as out:
            for r in added:
                out.write(json.dumps({"request_id": r.request_id, "prompt_tokens": r.prompt_tokens,
                                      "first_token_ns": r.first_token_ns, "prefill_ms": r.prefill_ms}) + "\n")


def save_event(store: ResultsStore, event: PassiveEvent, rep: RepRecord, info: EngineInfo, protocol: ProtocolSettings,
               chunk_size_source: str = "given") -> str:
    """A published (or joint: `store` then the records' `JOINT_DIR`) event as the next repetition
    of its cell's passive record (raw file first); returns the record's path. `rep.started_at` is
    kept: it is the event's traffic time."""
    assert event.key is not None and event.run is not None
    spec = PointSpec(*event.key)
    config = record_config(spec, info, protocol, reps=1, mode="passive", chunk_size_source=chunk_size_source)
    path = str(store.record_path(*event.key))
    done = resumable_reps(store.load_record(*event.key), config, path)
    raw_path = store.raw_path(*event.key, len(done))
    store.save_raw(raw_path, event.run.to_raw())
    done.append(rep.model_copy(update={"rep": len(done), "raw": store.relative(event.key[0], raw_path),
                                       "passive": event.info()}))
    store.save_record(aggregate(config.model_copy(update={"reps_planned": len(done)}), done))
    return path


class TraceIntake:
    """What the exporter's trace receiver (`exporter.receiver`) takes: every export counted, each
    span judged, the usable ones handed to passive mode (`passive`, set once it runs) or counted as
    ignored.

    A span can claim any timestamps. One whose first token (else its end) lies more than
    `MAX_AHEAD_S` ahead of this host's clock, or further back than passive mode keeps requests
    (`max_age_s`: the attribution wait, the baseline span and 30 s, as `PassiveTracker` prunes),
    could never be attributed and would never be pruned (the tracker prunes from the oldest):
    it is counted `out-of-range` and dropped. A request id already taken is counted `duplicate`:
    a replayed span cannot turn one prefill into two; one longer than `MAX_ID_CHARS` is `unusable`.
    Both sets are bounded, and the receiver bounds the rate."""

    MAX_AHEAD_S = 60.0  # clock skew between the engine's host and this one (NTP keeps it far smaller)
    KEEP_IDS = 65_536
    MAX_ID_CHARS = 256  # vLLM's ids are ~40; a longer one is not a request id (and would be kept in memory)

    def __init__(self, metrics: ExporterMetrics, *, max_age_s: float = 70.0,
                 now_unix_ns: Callable[[], int] = time.time_ns) -> None:
        self.metrics = metrics
        self.passive: LivePassive | None = None
        self.max_age_s, self.now_unix_ns = max_age_s, now_unix_ns
        self._ids: collections.OrderedDict[str, None] = collections.OrderedDict()

    def exported(self, rejected: str | None) -> None:
        count_trace_export(self.metrics, rejected)

    def admit(self, traces: list[RequestTrace]) -> list[RequestTrace]:
        """The spans worth keeping (class docs); the others counted by why."""
        now = self.now_unix_ns()
        ahead, oldest = now + self.MAX_AHEAD_S * 1e9, now - self.max_age_s * 1e9
        kept: list[RequestTrace] = []
        out_of_range = duplicate = unusable = 0
        for t in traces:
            if len(t.request_id) > self.MAX_ID_CHARS:
                unusable += 1
                continue
            when = t.first_token_ns if t.first_token_ns is not None else t.end_ns
            if not oldest <= when <= ahead or not oldest <= t.end_ns <= ahead or t.start_ns > t.end_ns:
                out_of_range += 1
            elif t.request_id in self._ids:
                duplicate += 1
            else:
                self._ids[t.request_id] = None
                kept.append(t)
        while len(self._ids) > self.KEEP_IDS:
            self._ids.popitem(last=False)
        if unusable:
            count_traces(self.metrics, "unusable", unusable)
        if out_of_range:
            count_traces(self.metrics, "out-of-range", out_of_range)
        if duplicate:
            count_traces(self.metrics, "duplicate", duplicate)
        return kept

    def sink(self, traces: list[RequestTrace]) -> None:
        traces = self.admit(traces)
        if self.passive is None:
            count_traces(self.metrics, "ignored", len(traces))
        else:
            self.passive.add_traces(traces)


__all__ = ["MODEL_BOOTSTRAP", "MODEL_EVENTS", "MODEL_EVERY_S", "MODEL_FIRST_EVERY_S", "MODEL_SHARE",
           "THRESHOLD_EVERY_S", "LiveModel", "LivePassive", "TraceIntake", "fit_event", "publish_thresholds",
           "save_event", "thresholds_response"]
