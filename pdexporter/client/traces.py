"""An engine's OTLP request traces: what one per-request span says about a finished request. Pure.

vLLM (0.22, `--otlp-traces-endpoint URL`, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`)
exports one span per request when it finishes: started at the request's arrival, ended at its
finish, with the latencies and token counts its adapter names (`EngineAdapter.request_span_name`,
`request_span_attributes`; an engine whose traces pdexporter cannot read has none, and decodes
to no trace). An OTLP/HTTP export is an `ExportTraceServiceRequest` protobuf
(opentelemetry-proto), possibly gzip-compressed. `decode_traces` turns one into `RequestTrace`s
(other spans, e.g. vLLM's start-up spans, are skipped); `encode_traces` writes the same message,
for the embedded engine's in-process runs and for tests.

Times stay on the engine's Unix clock (ns); the caller maps them onto its own.
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pdexporter.engines import adapter

PROTOBUF = "application/x-protobuf"


class TraceDecodeError(ValueError):
    """The body is not an OTLP trace export this receiver can read."""


@dataclass(frozen=True)
class RequestTrace:
    """One finished request, as its engine's per-request span tells it."""

    request_id: str
    start_ns: int  # the request's arrival (span start), engine's Unix clock
    end_ns: int  # its finish (span end)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    inference_s: float | None = None
    max_tokens: int | None = None

    @property
    def first_token_ns(self) -> float | None:
        """When its first token came out: arrival + TTFT (engine's Unix clock)."""
        return None if self.ttft_s is None else self.start_ns + self.ttft_s * 1e9


_INTS = frozenset({"prompt_tokens", "completion_tokens", "max_tokens"})
_MAX_COUNT = 10**12  # tokens in one request: far above any context (`_internal.bounds.MAX_TOKENS` is 10M)
_MAX_SECONDS = 1e9  # a latency: ~30 years


def _value(any_value: object) -> object:
    kind = any_value.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(any_value, kind) if kind else None


def decode_traces(body: bytes, *, engine: str, content_encoding: str | None = None) -> list[RequestTrace]:
    """The engine's per-request spans in one OTLP/HTTP protobuf export (module docs)."""
    return traces_of(parse_export(body, content_encoding=content_encoding), engine=engine)


def parse_export(body: bytes, *, content_encoding: str | None = None) -> Any:
    """The `ExportTraceServiceRequest` in an OTLP/HTTP body (protobuf's C parser: no span is
    turned into Python yet, so `count_spans` can bound the work before `traces_of` does it)."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    encoding = (content_encoding or "").strip().lower()
    try:
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        elif encoding not in ("", "identity"):
            raise TraceDecodeError(f"Content-Encoding {content_encoding!r}: expected gzip, deflate or none")
    except (OSError, zlib.error, EOFError) as exc:
        raise TraceDecodeError(f"body is not valid {encoding} data ({exc})") from exc
    message = ExportTraceServiceRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise TraceDecodeError(f"body is not an OTLP ExportTraceServiceRequest ({exc})") from exc
    return message


def count_spans(message: Any) -> int:
    """How many spans an export holds, of any name (cheap: the repeated fields' lengths)."""
    return sum(len(scope.spans) for resource in message.resource_spans for scope in resource.scope_spans)


def _number(key: str, name: str, value: object) -> int | float:
    """An attribute's value as the number `key` is; `TraceDecodeError` (one line, naming the
    attribute) when it is not finite or out of range (+inf prompt tokens was a 500 and a traceback)."""
    number = float(value) if not isinstance(value, int) else value  # type: ignore[arg-type]
    if isinstance(number, float) and not math.isfinite(number):
        raise TraceDecodeError(f"span attribute {name} = {value!r}: not a finite number")
    if key in _INTS:
        if not 0 <= number <= _MAX_COUNT:
            raise TraceDecodeError(f"span attribute {name} = {value!r}: a token count between 0 and {_MAX_COUNT}")
        return int(number)
    if not -_MAX_SECONDS <= number <= _MAX_SECONDS:
        raise TraceDecodeError(f"span attribute {name} = {value!r}: seconds within ±{_MAX_SECONDS:g}")
    return float(number)


def traces_of(message: Any, *, engine: str) -> list[RequestTrace]:
    """The engine's per-request spans in a parsed export (`parse_export`)."""
    rules = adapter(engine)
    if not rules.request_span_name:
        return []  # this engine's traces carry nothing pdexporter reads
    wanted: Mapping[str, str] = {name: key for key, name in rules.request_span_attributes.items()}
    out: list[RequestTrace] = []
    for resource_spans in message.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if span.name != rules.request_span_name:
                    continue
                fields: dict[str, object] = {}
                for kv in span.attributes:
                    key = wanted.get(kv.key)
                    if key is None:
                        continue
                    value = _value(kv.value)
                    try:
                        fields[key] = str(value) if key == "request_id" else _number(key, kv.key, value)
                    except (TypeError, ValueError) as exc:
                        if isinstance(exc, TraceDecodeError):
                            raise
                        continue  # an attribute of the wrong type (a list, a word) is treated as absent
                rid = fields.pop("request_id", None) or span.span_id.hex()
                out.append(RequestTrace(request_id=str(rid), start_ns=int(span.start_time_unix_nano),
                                        end_ns=int(span.end_time_unix_nano), **fields))  # type: ignore[arg-type]
    return out


def encode_traces(traces: Iterable[RequestTrace], *, engine: str, service_name: str | None = None) -> bytes:
    """`traces` as one OTLP `ExportTraceServiceRequest`, spans shaped as the engine sends them."""
    import hashlib

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    rules = adapter(engine)
    message = ExportTraceServiceRequest()
    resource_spans = message.resource_spans.add()
    attr = resource_spans.resource.attributes.add()
    attr.key, attr.value.string_value = "service.name", service_name or engine
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "vllm.llm_engine"
    for t in traces:
        span = scope_spans.spans.add()
        digest = hashlib.sha256(t.request_id.encode()).digest()
        span.trace_id, span.span_id = digest[:16], digest[16:24]
        span.name = rules.request_span_name
        span.kind = Span.SPAN_KIND_SERVER
        span.start_time_unix_nano, span.end_time_unix_nano = int(t.start_ns), int(t.end_ns)
        for key, name in rules.request_span_attributes.items():
            value = getattr(t, key)
            if value is None:
                continue
            kv = span.attributes.add()
            kv.key = name
            if key == "request_id":
                kv.value.string_value = str(value)
            elif key in _INTS:
                kv.value.int_value = int(value)
            else:
                kv.value.double_value = float(value)
    return message.SerializeToString()


__all__ = [
    "PROTOBUF", "RequestTrace", "TraceDecodeError", "count_spans", "decode_traces", "encode_traces", "parse_export",
    "traces_of",
]
