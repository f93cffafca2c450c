"""The embedded engine's request traces, sent as vLLM 0.22 sends them (`--otlp-traces-endpoint`).

vLLM's tracer (vllm/tracing: `init_tracer("vllm.llm_engine", endpoint)`, a BatchSpanProcessor and
an OTLP exporter) ends one `llm_request` span per finished request, started at its arrival, with
the attributes `client.traces` reads. The embedded engine does the same with the OpenTelemetry
SDK and its OTLP/HTTP exporter. vLLM defaults to OTLP/gRPC
(`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` unset); the embedded engine speaks http/protobuf only and
refuses another protocol with one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pdexporter._internal.otel import shutdown_within
from pdexporter.client.traces import RequestTrace
from pdexporter.engines import adapter
from pdexporter.errors import ConfigError

SCOPE = "vllm.llm_engine"


class RequestSpans:
    """`engine.on_request_finished = RequestSpans(endpoint)`: one span per finished request."""

    def __init__(self, endpoint: str, *, engine: str, env: Mapping[str, str] = os.environ,
                 process_id: int | None = None) -> None:
        """`engine`: the embedded engine's adapter name, whose request span it sends (vLLM's)."""
        rules = adapter(engine)
        if not rules.request_span_name:
            raise ConfigError(f"--otlp-traces-endpoint: the embedded engine imitating {engine} sends no request traces "
                              "pdexporter reads (only vLLM's `llm_request` spans are modelled)")
        protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or "http/protobuf").strip()
        if protocol != "http/protobuf":
            raise ConfigError(f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={protocol!r}: the embedded engine sends its "
                              "request traces over OTLP/HTTP only (http/protobuf)")
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"--otlp-traces-endpoint {endpoint!r}: expected an http:// or https:// URL "
                              "(e.g. http://127.0.0.1:18743/v1/traces)")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"vllm.instrumenting_module_name": SCOPE,
                                    "vllm.process_id": process_id if process_id is not None else os.getpid()})
        self.provider = TracerProvider(resource=resource)
        self._exporter = OTLPSpanExporter(endpoint=endpoint)
        self.provider.add_span_processor(BatchSpanProcessor(self._exporter))
        self.tracer = self.provider.get_tracer(SCOPE)
        self._name, self._attributes = rules.request_span_name, rules.request_span_attributes

    def __call__(self, trace: RequestTrace) -> None:
        from opentelemetry.trace import SpanKind

        attributes = {name: getattr(trace, key) for key, name in self._attributes.items()
                      if getattr(trace, key) is not None}
        span = self.tracer.start_span(self._name, kind=SpanKind.SERVER, start_time=trace.start_ns,
                                      attributes=attributes)
        span.end(end_time=trace.end_ns)

    def shutdown(self, flush_s: float = 1.0) -> None:
        """Send what is queued, for at most `flush_s`: a receiver that is gone (it often stops
        first) must not hold the engine's exit for the exporter's retries."""
        shutdown_within(self.provider, self._exporter, flush_s)


__all__ = ["RequestSpans"]
