"""Every Prometheus series pdexporter emits, defined once (docs/metrics.md describes them).

Dashboards, the Prometheus puller of `export-table` and the tests import the names from here, so
a renamed series cannot silently break a panel. `ExporterMetrics` owns its own registry: an
exporter process, a sweep and a test can each have one without clashing.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from pdexporter import __version__
from pdexporter.measure.quantities import BY_FIELD, Quantity, gauged
from pdexporter.measure.records import RepRecord

__all__ = [
    "BUILD_INFO",
    "DEFAULT_PORT",
    "DELAY_BUCKETS",
    "ENGINE_INFO",
    "ENGINE_KV",
    "ENGINE_RUNNING",
    "ENGINE_SCRAPE_OK",
    "ENGINE_SCRAPE_SECONDS",
    "ENGINE_WAITING",
    "ERRORS",
    "ERROR_KINDS",
    "ExporterMetrics",
    "GRID_LABELS",
    "INJECTIONS",
    "MODES",
    "OFFLOAD_THRESHOLD",
    "OFFLOAD_THRESHOLD_EVENTS",
    "OFFLOAD_THRESHOLD_TIMESTAMP",
    "PASSIVE_EVENTS",
    "PASSIVE_MODEL_BOUNDS",
    "PASSIVE_MODEL_CELLS",
    "PASSIVE_MODEL_EVENTS",
    "PASSIVE_MODEL_HALFWIDTH",
    "PASSIVE_MODEL_PREDICTION",
    "PASSIVE_MODEL_REACHED",
    "PASSIVE_OUTCOMES",
    "PASSIVE_SOURCES",
    "PHASES",
    "PREFILL_BUCKETS",
    "PREFILL_DURATION",
    "PREFIX",
    "PROBE_STREAMS",
    "PROBE_STREAMS_STARTED",
    "PROBE_TIMESTAMP_DELAY",
    "PROBE_TOKENS",
    "PROBE_TPOT",
    "REJECT_REASONS",
    "REQUEST_TRACES",
    "TPOT_BUCKETS",
    "TRACE_EXPORTS",
    "TRACE_KINDS",
    "TRACE_REJECTIONS",
    "THRESHOLD_BOUNDS",
    "TRACE_RESULTS",
    "UP",
    "UP_REASON",
    "UP_REASONS",
    "WINDOWS",
    "WINDOWS_SKIPPED",
    "WINDOW_AFTER",
    "WINDOW_AGGREGATE",
    "WINDOW_BASELINE",
    "WINDOW_CHUNKS",
    "WINDOW_DURING",
    "WINDOW_EXPECTED",
    "WINDOW_GAUGES",
    "WINDOW_LABELS",
    "WINDOW_PENALTY",
    "WINDOW_PREFILL",
    "WINDOW_RATIO",
    "WINDOW_SLOW_STEPS",
    "WINDOW_TOTAL",
    "all_series_names",
    "count_trace_export",
    "count_traces",
    "error_kind",
    "grid_labels",
    "publish_window",
    "set_engine_info",
    "set_up",
]

PREFIX = "pdexporter"
GRID_LABELS = ("chunk_size", "decode_batch_size", "new_prefill_tokens")
# Window series carry the grid point, how the window came about: "active" (an injected
# prefill: `run`, `sweep --listen`) or "passive" (a production prefill, `run --passive`, whose D
# and P labels are bins: measure.passive), and the engine measured (its adapter's name: two
# engines' maps side by side in one Prometheus).
MODES = ("active", "passive")
WINDOW_LABELS = GRID_LABELS + ("mode", "engine")
PHASES = ("baseline", "prefill_window", "after_prefill")  # exporter.timeline labels
ERROR_KINDS = ("connect", "http", "timeout", "protocol", "measurement")
DEFAULT_PORT = 18742

# Intervals from a 1 ms decode step to a multi-second stalled step.
TPOT_BUCKETS = (0.001, 0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.030, 0.050, 0.075,
                0.100, 0.150, 0.200, 0.300, 0.500, 0.750, 1.0, 2.0, 5.0)
# Wake-up delay of the probe loop: 10 us .. 50 ms.
DELAY_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.010, 0.025, 0.050)
PREFILL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)

UP = f"{PREFIX}_up"
UP_REASON = f"{PREFIX}_up_reason"
# Why `pdexporter_up` is what it is (exporter.status): one of these is 1, the others 0.
UP_REASONS = ("ok", "starting", "engine-unreachable", "engine-timeout", "engine-http-error", "engine-protocol-error",
              "probes-stalled", "probes-restarting", "stopping")
BUILD_INFO = f"{PREFIX}_build_info"
ENGINE_INFO = f"{PREFIX}_engine_info"
PROBE_STREAMS = f"{PREFIX}_probe_streams"
PROBE_STREAMS_STARTED = f"{PREFIX}_probe_streams_started_total"
PROBE_TOKENS = f"{PREFIX}_probe_tokens_total"
PROBE_TPOT = f"{PREFIX}_probe_tpot_seconds"
INJECTIONS = f"{PREFIX}_injections_total"
WINDOWS = f"{PREFIX}_windows_total"
WINDOWS_SKIPPED = f"{PREFIX}_windows_skipped_total"
PREFILL_DURATION = f"{PREFIX}_prefill_duration_seconds"


def _gauge_of(block: str, field: str) -> str:
    """The gauge a declared quantity is exported as (every one named here declares one)."""
    name = BY_FIELD[(block, field)].gauge_name
    assert name is not None, f"{block}.{field} declares no gauge (measure.quantities)"
    return name


# The last-window gauges, one per quantity declared with a gauge (measure.quantities).
WINDOW_GAUGES: dict[str, Quantity] = {q.gauge_name: q for q in gauged() if q.gauge_name}
WINDOW_BASELINE = _gauge_of("baseline", "tpot_p50_ms")
WINDOW_DURING = _gauge_of("interference", "tpot_during_prefill_p50_ms")
WINDOW_AFTER = _gauge_of("interference", "tpot_after_prefill_p50_ms")
WINDOW_PENALTY = _gauge_of("derived", "tpot_penalty_ms")
WINDOW_RATIO = _gauge_of("derived", "tpot_penalty_ratio")
WINDOW_TOTAL = _gauge_of("derived", "total_interference_ms")
WINDOW_AGGREGATE = _gauge_of("derived", "aggregate_interference_ms")
WINDOW_PREFILL = _gauge_of("interference", "prefill_duration_ms")
WINDOW_SLOW_STEPS = _gauge_of("interference", "slow_steps")
WINDOW_CHUNKS = _gauge_of("interference", "num_chunks_actual")
WINDOW_EXPECTED = _gauge_of("interference", "num_chunks_expected")
PROBE_TIMESTAMP_DELAY = f"{PREFIX}_probe_timestamp_delay_seconds"
ERRORS = f"{PREFIX}_errors_total"
ENGINE_RUNNING = f"{PREFIX}_engine_requests_running"
ENGINE_WAITING = f"{PREFIX}_engine_requests_waiting"
ENGINE_KV = f"{PREFIX}_engine_kv_cache_usage_ratio"
ENGINE_SCRAPE_OK = f"{PREFIX}_engine_scrape_success"
ENGINE_SCRAPE_SECONDS = f"{PREFIX}_engine_scrape_duration_seconds"
ENGINE_RESTARTS = f"{PREFIX}_engine_restarts_total"
PASSIVE_EVENTS = f"{PREFIX}_passive_events_total"
# Passive mode's event-fitted model (analysis.passive_model), refitted as events come: how sure it
# is, and its prediction of every cell of the grid with the 95 % interval's ends.
PASSIVE_MODEL_EVENTS = f"{PREFIX}_passive_model_events"
PASSIVE_MODEL_HALFWIDTH = f"{PREFIX}_passive_model_interval_halfwidth_ratio"
PASSIVE_MODEL_CELLS = f"{PREFIX}_passive_model_cells_reached"
PASSIVE_MODEL_PREDICTION = f"{PREFIX}_passive_model_aggregate_interference_seconds"
PASSIVE_MODEL_REACHED = f"{PREFIX}_passive_model_cell_reached"
PASSIVE_MODEL_BOUNDS = ("estimate", "low", "high")  # PASSIVE_MODEL_PREDICTION{bound}
# ... and which launch level the launch-bound one-chunk prefills of the last minutes ran at (the
# engine's state of seconds: analysis.passive_model, "Launch levels")
PASSIVE_MODEL_LAUNCH_EVENTS = f"{PREFIX}_passive_model_launch_events"
PASSIVE_MODEL_LAUNCH_SLOW_SHARE = f"{PREFIX}_passive_model_launch_slow_share"
LAUNCH_LEVEL_LABELS = ("fast", "slow")  # PASSIVE_MODEL_LAUNCH_EVENTS{level}
# (the 5 minutes of the two gauges' help is analysis.passive_model.LEVEL_WINDOW_S, not imported here: an
# exporter that never runs passive mode does not import numpy and pandas)
# The router threshold, live (`run --passive --decision`, exporter.passive_live): per (B, D) the
# prompt length from which offloading wins, its interval's ends, the events at that D, the refresh time.
OFFLOAD_THRESHOLD = f"{PREFIX}_offload_threshold_tokens"
OFFLOAD_THRESHOLD_EVENTS = f"{PREFIX}_offload_threshold_events"
OFFLOAD_THRESHOLD_TIMESTAMP = f"{PREFIX}_offload_threshold_timestamp_seconds"
THRESHOLD_BOUNDS = ("central", "low", "high")  # OFFLOAD_THRESHOLD{bound}
REQUEST_TRACES = f"{PREFIX}_request_traces_total"
TRACE_EXPORTS = f"{PREFIX}_trace_exports_total"
TRACE_REJECTIONS = f"{PREFIX}_trace_rejections_total"
PASSIVE_OUTCOMES = ("published", "joint", "merged", "unattributed", "ambiguous", "own-probe", "no-baseline",
                    "no-window", "out-of-bins", "no-budget")
PASSIVE_SOURCES = ("otlp", "metrics", "cadence", "none")
# REQUEST_TRACES{kind}; "out-of-range": a span ending in the future or too far in the past to be
# attributed (passive_live.TraceIntake), "duplicate": a request id already received
TRACE_KINDS = ("production", "probe", "unusable", "ignored", "out-of-range", "duplicate")
TRACE_RESULTS = ("ok", "rejected")  # TRACE_EXPORTS{result}
# TRACE_REJECTIONS{reason}: why the trace receiver refused an export (exporter.receiver)
REJECT_REASONS = ("unauthorized", "rate-limited", "busy", "too-large", "unsupported-media-type", "bad-encoding",
                  "bad-body", "engine-unknown", "slow-body")


class ExporterMetrics:
    """The metric objects, registered on a private registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # No `_created` series: in the text format Prometheus stores each one as a separate gauge
        # (one per counter/histogram child), doubling series for a value no query here uses.
        # prometheus_client's switch is process-wide; pdexporter never wants them.
        disable_created_metrics()
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.up = Gauge(UP, "1 while the engine answers and probe streams are running.", registry=r)
        self.up_reason = Gauge(UP_REASON, "Why pdexporter_up is 0 (or ok): 1 for the current reason, 0 for the "
                               "others.", ["reason"], registry=r)
        self.build_info = Gauge(BUILD_INFO, "pdexporter build; always 1.", ["version"], registry=r)
        self.build_info.labels(version=__version__).set(1)
        self.engine_info = Gauge(
            ENGINE_INFO, "The engine being probed; always 1.",
            ["engine", "model", "chunk_size", "chunk_size_source", "modelled"], registry=r
        )
        self.probe_streams = Gauge(PROBE_STREAMS, "Probe streams currently decoding.", registry=r)
        self.probe_streams_started = Counter(
            PROBE_STREAMS_STARTED.removesuffix("_total"), "Probe streams started.", registry=r
        )
        self.probe_tokens = Counter(
            PROBE_TOKENS.removesuffix("_total"), "Tokens received on probe streams.", registry=r
        )
        self.probe_tpot = Histogram(
            PROBE_TPOT, "Probe inter-token intervals by window phase.", ["phase"], buckets=TPOT_BUCKETS, registry=r
        )
        self.injections = Counter(
            INJECTIONS.removesuffix("_total"), "Prefill perturbations sent.", ["outcome"], registry=r
        )
        self.windows = Counter(WINDOWS.removesuffix("_total"), "Prefill windows analysed.", WINDOW_LABELS, registry=r)
        self.windows_skipped = Counter(
            WINDOWS_SKIPPED.removesuffix("_total"), "Windows that failed (no window came), by the kind of failure.",
            ["kind"], registry=r)
        for kind in ERROR_KINDS:
            self.windows_skipped.labels(kind=kind)
        # name -> Gauge, one per declared window quantity with a gauge (help: its meaning).
        self.window_gauges: dict[str, Gauge] = {
            name: Gauge(name, f"Last window: {q.meaning}" + (" (seconds)" if q.unit == "ms" else ""),
                        WINDOW_LABELS, registry=r)
            for name, q in WINDOW_GAUGES.items()
        }
        self.prefill_duration = Histogram(
            PREFILL_DURATION, "Prefill submission to first token.", WINDOW_LABELS, buckets=PREFILL_BUCKETS, registry=r
        )
        self.probe_timestamp_delay = Histogram(
            PROBE_TIMESTAMP_DELAY,
            "Delay between a socket becoming readable and the probe loop stamping it (timestamp error).",
            buckets=DELAY_BUCKETS,
            registry=r,
        )
        self.errors = Counter(ERRORS.removesuffix("_total"), "Failures by kind.", ["kind"], registry=r)
        for kind in ERROR_KINDS:
            self.errors.labels(kind=kind)
        self.engine_running = Gauge(ENGINE_RUNNING, "Engine: requests running.", registry=r)
        self.engine_waiting = Gauge(ENGINE_WAITING, "Engine: requests waiting.", registry=r)
        self.engine_kv = Gauge(ENGINE_KV, "Engine: KV-cache usage (0-1).", registry=r)
        self.engine_scrape_ok = Gauge(ENGINE_SCRAPE_OK, "1 if the last engine /metrics scrape worked.", registry=r)
        self.engine_scrape_seconds = Gauge(ENGINE_SCRAPE_SECONDS, "Duration of the last engine scrape.", registry=r)
        self.engine_restarts = Counter(ENGINE_RESTARTS.removesuffix("_total"), "Engine restarts seen under the "
                                       "exporter (its process start time moved, or a counter it keeps fell); each "
                                       "one has the engine asked who it is again.", registry=r)
        self.passive_events = Counter(
            PASSIVE_EVENTS.removesuffix("_total"),
            "Passive mode: runs of slow steps the probes saw, by what became of them and the source of their P.",
            ["outcome", "source"], registry=r)
        self.passive_model_events = Gauge(
            PASSIVE_MODEL_EVENTS, "Passive mode: production prefills the event-fitted cost model was last fitted on.",
            registry=r)
        self.passive_model_halfwidth = Gauge(
            PASSIVE_MODEL_HALFWIDTH, "Passive mode: how sure the answer is: half the width of the model's 95 % "
            "interval over its prediction, median over the cells the traffic reaches (0.1 = +-10 %).", registry=r)
        self.passive_model_cells = Gauge(
            PASSIVE_MODEL_CELLS, "Passive mode: grid cells the traffic reaches (their D and P surrounded by events).",
            registry=r)
        self.passive_model_prediction = Gauge(
            PASSIVE_MODEL_PREDICTION, "Passive mode: the event-fitted model's aggregate interference per grid cell "
            "(seconds): the estimate and its 95 % interval's ends.", GRID_LABELS + ("engine", "bound"), registry=r)
        self.passive_model_reached = Gauge(
            PASSIVE_MODEL_REACHED, "Passive mode: 1 for a grid cell the traffic reaches, 0 for an extrapolation.",
            GRID_LABELS + ("engine",), registry=r)
        self.passive_model_launch_events = Gauge(
            PASSIVE_MODEL_LAUNCH_EVENTS, "Passive mode: launch-bound one-chunk prefills of the last 5 minutes of "
            "traffic at each launch level (absent while the events show no two clear levels).", ["level"],
            registry=r)
        self.passive_model_launch_slow_share = Gauge(
            PASSIVE_MODEL_LAUNCH_SLOW_SHARE, "Passive mode: the share of those prefills at the slow level (NaN while "
            "there are none or no two clear levels): how much of the last minutes the engine's eager one-chunk "
            "steps ran slow.", registry=r)
        self.offload_threshold = Gauge(
            OFFLOAD_THRESHOLD, "Passive mode with --decision: the prompt length (tokens) from which offloading wins "
            "at this chunk size and D, and its 90 % interval's ends (+Inf: never up to p_max).",
            ["chunk_size", "decode_batch_size", "bound"], registry=r)
        self.offload_threshold_events = Gauge(
            OFFLOAD_THRESHOLD_EVENTS, "Passive mode with --decision: production prefills at this D in the fit behind "
            "the threshold.", ["chunk_size", "decode_batch_size"], registry=r)
        self.offload_threshold_timestamp = Gauge(
            OFFLOAD_THRESHOLD_TIMESTAMP, "Passive mode with --decision: Unix time the thresholds were last computed.",
            registry=r)
        self.request_traces = Counter(
            REQUEST_TRACES.removesuffix("_total"),
            "Engine request spans received on /v1/traces, by whose requests they were.", ["kind"], registry=r)
        self.trace_exports = Counter(
            TRACE_EXPORTS.removesuffix("_total"), "OTLP export requests received on /v1/traces.", ["result"], registry=r
        )
        for result in TRACE_RESULTS:
            self.trace_exports.labels(result=result)
        self.trace_rejections = Counter(
            TRACE_REJECTIONS.removesuffix("_total"), "OTLP export requests refused on /v1/traces, by why "
            "(exporter.receiver: 401, 413, 415, 429, 400).", ["reason"], registry=r)
        for reason in REJECT_REASONS:
            self.trace_rejections.labels(reason=reason)
        for kind in TRACE_KINDS:
            self.request_traces.labels(kind=kind)
        set_up(self, "starting")


def count_traces(metrics: ExporterMetrics, kind: str, n: int = 1) -> None:
    """`pdexporter_request_traces_total{kind}` += n, for a kind of `TRACE_KINDS` only."""
    if kind not in TRACE_KINDS:
        raise ValueError(f"unknown trace kind {kind!r}: expected one of {TRACE_KINDS}")
    metrics.request_traces.labels(kind=kind).inc(n)


def count_trace_export(metrics: ExporterMetrics, rejected: str | None) -> None:
    """`pdexporter_trace_exports_total{result}` += 1 ("ok" or "rejected", `TRACE_RESULTS`), and a
    refusal's reason in `pdexporter_trace_rejections_total{reason}` (`receiver.REJECT_REASONS`)."""
    metrics.trace_exports.labels(result=TRACE_RESULTS[0] if rejected is None else TRACE_RESULTS[1]).inc()
    if rejected is not None:
        if rejected not in REJECT_REASONS:
            raise ValueError(f"unknown rejection reason {rejected!r}")
        metrics.trace_rejections.labels(reason=rejected).inc()


def set_up(metrics: ExporterMetrics, reason: str) -> None:
    """`pdexporter_up` (1 only for "ok") and `pdexporter_up_reason`: every reason of `UP_REASONS`
    present, the current one 1 (bounded label values: a dashboard can list them all)."""
    if reason not in UP_REASONS:
        raise ValueError(f"unknown up reason {reason!r}")
    metrics.up.set(1 if reason == "ok" else 0)
    for r in UP_REASONS:
        metrics.up_reason.labels(reason=r).set(1 if r == reason else 0)


def set_engine_info(metrics: ExporterMetrics, engine: str, model: str, chunk_size: int | None, modelled: bool,
                    chunk_size_source: str = "given") -> None:
    """`pdexporter_engine_info` for the engine being probed (its label set defined here only)."""
    metrics.engine_info.labels(engine=engine, model=model, chunk_size=str(chunk_size),
                               chunk_size_source=chunk_size_source, modelled=str(modelled).lower()).set(1)


def error_kind(exc: BaseException | None) -> str:
    """`pdexporter_errors_total{kind}` for an exception (bounded label values, `ERROR_KINDS`)."""
    from pdexporter.errors import EngineHTTPError, EngineTimeout, EngineUnreachable, MeasurementError

    if isinstance(exc, EngineUnreachable):
        return "connect"
    if isinstance(exc, EngineTimeout):
        return "timeout"
    if isinstance(exc, EngineHTTPError):
        return "http"
    if isinstance(exc, MeasurementError):
        return "measurement"
    return "protocol"  # SSEProtocolError and any other engine answer we could not use


def all_series_names() -> tuple[str, ...]:
    """Every sample name a scrape can show (histograms expand to _bucket/_count/_sum)."""
    names: list[str] = list(WINDOW_GAUGES)
    for value in globals().values():
        if isinstance(value, str) and value.startswith(f"{PREFIX}_") and value != PREFIX:
            if value in (PROBE_TPOT, PREFILL_DURATION, PROBE_TIMESTAMP_DELAY):
                names += [f"{value}_bucket", f"{value}_count", f"{value}_sum"]
            else:
                names.append(value)
    return tuple(sorted(set(names)))


def grid_labels(chunk_size: int | None, decode_batch_size: int, new_prefill_tokens: int,
                mode: str = "active", *, engine: str) -> dict[str, str]:
    """The labels of a window's series (`WINDOW_LABELS`); `engine`: the engine adapter's name."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {MODES}")
    return {
        "chunk_size": str(chunk_size) if chunk_size is not None else "unknown",
        "decode_batch_size": str(decode_batch_size),
        "new_prefill_tokens": str(new_prefill_tokens),
        "mode": mode,
        "engine": engine,
    }


def publish_window(metrics: ExporterMetrics, labels: dict[str, str], rep: RepRecord) -> None:
    """Set the last-window gauges from one repetition's record blocks (ms -> seconds), count the
    window, observe the prefill's duration. Shared by the live exporter and the sweep."""
    blocks = {"baseline": rep.baseline, "interference": rep.interference, "derived": rep.derived}
    for name, q in WINDOW_GAUGES.items():
        value = getattr(blocks[q.block], q.field, None)
        metrics.window_gauges[name].labels(**labels).set(float("nan") if value is None else value * q.gauge_factor)
    metrics.prefill_duration.labels(**labels).observe(rep.interference.prefill_duration_ms / 1000.0)
    metrics.windows.labels(**labels).inc()
