"""OpenTelemetry traces of the probes and the prefill windows, exported over OTLP/HTTP.

Off unless the standard variables name an endpoint (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
`OTEL_EXPORTER_OTLP_ENDPOINT`); everything else (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`, `..._COMPRESSION`, `..._CERTIFICATE`, `OTEL_BSP_*`,
`OTEL_SPAN_EVENT_COUNT_LIMIT`) is read by the SDK and the exporter themselves. `opentelemetry` is
imported only when tracing is on, so commands that do not trace do not need it installed.

Shape (docs/exporter.md has the numbers behind the choice):
- each probe stream is one trace: a root CLIENT span `text_completion {model}` from the moment
  the request left to the end of the stream, with GenAI semantic-convention attributes and one
  span *event* per token event, stamped with the exact arrival time. Per-token spans would be
  ~10,700 spans/s at D = 64 and a 6 ms step; this shape is D / stream duration (~42 spans/s)
  carrying the same timestamps.
- each prefill window is one trace: `pdexporter.prefill_window` (t_inject -> end of the window,
  the window's numbers as attributes, links to the probe spans it measured) with a child CLIENT
  span for the prefill request itself.

Timestamps: probes are stamped with `perf_counter_ns` (monotonic); spans need Unix epoch ns, so a
single offset measured at start converts every stamp (`ClockOffset`), keeping intervals exact.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from pdexporter._internal.otel import shutdown_within
from pdexporter._internal.redact import redact
from pdexporter.client.stream import TokenStream
from pdexporter.errors import ConfigError
from pdexporter.measure.driver import EngineInfo
from pdexporter.measure.quantities import spanned

if TYPE_CHECKING:
    from pdexporter.measure.protocol import InterferenceRun
    from pdexporter.measure.records import RepRecord

__all__ = [
    "ClockOffset", "ENDPOINT_VARS", "EXPORT_BATCH_SPANS", "NoTracing", "OtlpTracing", "PROBE_EVENT", "Tracing",
    "WINDOW_SPAN", "make_tracing", "preload", "tracing_enabled",
]

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROBE_EVENT = "pdexporter.token"
WINDOW_SPAN = "pdexporter.prefill_window"
EXPORT_BATCH_SPANS = 64


@dataclass(frozen=True)
class ClockOffset:
    """epoch_ns = perf_counter_ns + offset_ns, measured once (the tightest of a few brackets)."""

    offset_ns: int
    uncertainty_ns: int

    @classmethod
    def measure(cls, samples: int = 16) -> ClockOffset:
        best: tuple[int, int] | None = None
        for _ in range(samples):
            a = time.perf_counter_ns()
            wall = time.time_ns()
            b = time.perf_counter_ns()
            candidate = (b - a, wall - (a + b) // 2)
            if best is None or candidate[0] < best[0]:
                best = candidate
        assert best is not None
        return cls(offset_ns=best[1], uncertainty_ns=best[0])

    def epoch(self, perf_ns: int | float) -> int:
        return int(perf_ns) + self.offset_ns


def tracing_enabled(env: Mapping[str, str] = os.environ) -> bool:
    """True when an OTLP endpoint is set and tracing was not switched off the standard ways."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if "none" in exporters:
        return False
    if not any(env.get(name, "").strip() for name in ENDPOINT_VARS):
        return False
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "").strip()
    if protocol and protocol != "http/protobuf":
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: pdexporter exports OTLP over HTTP only (http/protobuf)"
        )
    return True


class Tracing(Protocol):
    """What the runner calls; `NoTracing` when OTLP is off, `OtlpTracing` when on."""

    enabled: bool

    def start_probe(self, stream: TokenStream, slot: int) -> Any: ...

    def end_probe(self, span: Any, stream: TokenStream, *, cancelled: bool = False) -> None: ...

    def window(self, run: InterferenceRun, rep: RepRecord, chunk_size: int, probe_spans: Sequence[Any]) -> None: ...

    def shutdown(self, timeout_s: float = 5.0) -> None: ...


class NoTracing:
    enabled = False

    def start_probe(self, stream: TokenStream, slot: int) -> None:
        return None

    def end_probe(self, span: Any, stream: TokenStream, *, cancelled: bool = False) -> None:
        return None

    def window(self, run: InterferenceRun, rep: RepRecord, chunk_size: int, probe_spans: Sequence[Any]) -> None:
        return None

    def shutdown(self, timeout_s: float = 5.0) -> None:
        return None


def _server(url: str | None) -> dict[str, Any]:
    if not url:
        return {}
    parts = urlsplit(url)
    out: dict[str, Any] = {}
    if parts.hostname:
        out["server.address"] = parts.hostname
    if parts.port or parts.scheme:
        out["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
    return out


class OtlpTracing:
    """Spans through the OTel SDK's batch processor (its own thread) to an OTLP/HTTP exporter."""

    enabled = True

    def __init__(
        self,
        info: EngineInfo,
        *,
        max_tokens: int,
        clock: ClockOffset | None = None,
        exporter: Any = None,
    ) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()  # endpoint, headers, timeout, compression: OTEL_* variables
        attributes: dict[str, Any] = {}
        if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        ):
            attributes["service.name"] = "pdexporter"
        from pdexporter import __version__

        attributes["service.version"] = __version__
        # One event per token: the SDK's default cap (128 events) would cut a 256-token stream.
        max_events = None if os.environ.get("OTEL_SPAN_EVENT_COUNT_LIMIT") else max_tokens + 16
        self.provider = TracerProvider(
            resource=Resource.create(attributes), span_limits=SpanLimits(max_events=max_events)
        )
        # Protobuf serialisation of a batch runs in C with the GIL held (~0.4 ms per 64 probe spans
        # of 256 events on this machine's CPUs, ~5 ms for the SDK's default 512): small batches keep
        # the probe thread's timestamps clear of it. OTEL_BSP_MAX_EXPORT_BATCH_SIZE still wins.
        batch = None if os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") else EXPORT_BATCH_SPANS
        self._exporter = exporter
        self.provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=batch))
        self.tracer = self.provider.get_tracer("pdexporter.exporter", __version__)
        self.clock = clock or ClockOffset.measure()
        self.info = info
        self.max_tokens = max_tokens
        provider_name = info.kind  # the engine adapter's name
        self._base = {
            "gen_ai.operation.name": "text_completion",
            "gen_ai.provider.name": provider_name,
            "gen_ai.system": provider_name,  # the pre-1.37 name, still what many backends index
            "gen_ai.request.model": info.model,
            "gen_ai.request.temperature": 0.0,
            "gen_ai.request.stream": True,
            "pdexporter.engine.modelled": info.modelled,
            **_server(info.url),
        }
        self._name = f"text_completion {info.model}"

    def start_probe(self, stream: TokenStream, slot: int) -> Any:
        from opentelemetry.trace import SpanKind

        assert stream.t_sent_ns is not None
        return self.tracer.start_span(
            self._name,
            kind=SpanKind.CLIENT,
            start_time=self.clock.epoch(stream.t_sent_ns),
            attributes={
                **self._base,
                "gen_ai.request.max_tokens": stream.max_tokens or self.max_tokens,  # probes end in phase
                "pdexporter.stream.role": "probe",
                "pdexporter.probe.slot": slot,
                "pdexporter.request_id": stream.request_id,
            },
        )

    def end_probe(self, span: Any, stream: TokenStream, *, cancelled: bool = False) -> None:
        """Add the token events (exact arrival times) and the usage, then end the span."""
        from opentelemetry.trace import Status, StatusCode

        if span is None:
            return

        n = min(len(stream.event_times_ns), len(stream.event_tokens))
        times, tokens = stream.event_times_ns[:n], stream.event_tokens[:n]
        epoch = self.clock.offset_ns
        add_event = span.add_event
        for t_ns, count in zip(times, tokens):
            # Attributes only where an event carried more than one token: keeps the payload small.
            add_event(PROBE_EVENT, {"pdexporter.tokens": count} if count != 1 else None, t_ns + epoch)
        attributes: dict[str, Any] = {"gen_ai.usage.output_tokens": sum(tokens)}
        if stream.prompt_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = stream.prompt_tokens
        if stream.finish_reason and stream.finish_reason != "error":
            attributes["gen_ai.response.finish_reasons"] = [stream.finish_reason]
        if times and stream.t_sent_ns is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = (times[0] - stream.t_sent_ns) / 1e9
        if cancelled:
            attributes["pdexporter.stream.cancelled"] = True
        span.set_attributes(attributes)
        if stream.error is not None:
            span.set_status(Status(StatusCode.ERROR, redact(str(stream.error))))
            span.set_attribute("error.type", type(stream.error).__name__)
        end = stream.t_finished_ns or (times[-1] if times else stream.t_sent_ns) or time.perf_counter_ns()
        span.end(end_time=self.clock.epoch(end))

    def window(self, run: InterferenceRun, rep: RepRecord, chunk_size: int, probe_spans: Sequence[Any]) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Link, SpanKind

        blocks = {"baseline": rep.baseline, "interference": rep.interference, "derived": rep.derived}
        numbers = {
            "pdexporter.window.chunk_size": chunk_size,
            "pdexporter.window.decode_batch_size": run.decode_batch_size,
            "pdexporter.window.new_prefill_tokens": run.new_prefill_tokens,
            **{q.span_attribute: getattr(blocks[q.block], q.field, None) for q in spanned() if q.span_attribute},
            "pdexporter.window.rep": rep.rep,
        }
        attributes = {k: v for k, v in numbers.items() if v is not None}
        attributes["pdexporter.engine.modelled"] = self.info.modelled
        attributes["gen_ai.provider.name"] = self.info.kind  # the engine adapter's name, as on the probe spans
        links = [Link(s.get_span_context()) for s in probe_spans if s is not None]
        end_window = run.window_end_ns
        window_span = self.tracer.start_span(
            WINDOW_SPAN, start_time=self.clock.epoch(run.t_inject_ns), attributes=attributes, links=links
        )
        prefill = run.prefill
        context = trace.set_span_in_context(window_span)
        request = self.tracer.start_span(
            self._name,
            context=context,
            kind=SpanKind.CLIENT,
            start_time=self.clock.epoch(prefill.t_sent_ns or run.t_inject_ns),
            attributes={
                **self._base,
                "gen_ai.request.max_tokens": 1,
                "gen_ai.usage.input_tokens": prefill.prompt_tokens or run.new_prefill_tokens,
                "gen_ai.usage.output_tokens": sum(prefill.event_tokens),
                "pdexporter.stream.role": "prefill",
                "pdexporter.request_id": prefill.request_id,
            },
        )
        for t_ns, count in zip(prefill.event_times_ns, prefill.event_tokens):
            request.add_event(PROBE_EVENT, {"pdexporter.tokens": count} if count != 1 else None, self.clock.epoch(t_ns))
        last = prefill.event_times_ns[-1] if prefill.event_times_ns else run.t_first_ns
        request.end(end_time=self.clock.epoch(last))
        window_span.end(end_time=self.clock.epoch(max(end_window, last)))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """The queued spans sent, for at most `timeout_s` (a collector that is down does not hold
        the exit for the exporter's retries)."""
        shutdown_within(self.provider, self._exporter, timeout_s)


def preload(env: Mapping[str, str] = os.environ) -> bool:
    """Import the SDK and the OTLP exporter now, if tracing is on: their imports build protobuf
    descriptors in C with the GIL held for a long while, which must happen before probes run."""
    if not tracing_enabled(env):
        return False
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace.export  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"{' or '.join(ENDPOINT_VARS)} is set but OpenTelemetry is not installed ({exc.name}); "
            "pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"
        ) from exc
    return True


def make_tracing(info: EngineInfo, *, max_tokens: int, env: Mapping[str, str] = os.environ) -> Tracing:
    if not preload(env):
        return NoTracing()
    return OtlpTracing(info, max_tokens=max_tokens)
