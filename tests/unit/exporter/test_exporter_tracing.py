"""Span shape and the OTEL_* switch, with the SDK's own in-memory exporter (no network)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pdexporter.client.stream import TokenStream
from pdexporter.errors import ConfigError
from pdexporter.exporter.tracing import PROBE_EVENT, ClockOffset, OtlpTracing, tracing_enabled
from pdexporter.measure.driver import EngineInfo

MS = 1_000_000


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, True),
    ],
)
def test_tracing_is_off_unless_an_endpoint_is_set(env: dict[str, str], enabled: bool) -> None:
    assert tracing_enabled(env) is enabled


def test_grpc_protocol_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL='grpc'"):
        tracing_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_commands_that_do_not_trace_do_not_import_opentelemetry() -> None:
    code = (
        "import sys; import pdexporter.cli, pdexporter.exporter.runner, pdexporter.exporter.tracing as t;"
        "t.make_tracing(None, max_tokens=8, env={});"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_clock_offset_maps_perf_counter_to_epoch() -> None:
    import time

    clock = ClockOffset.measure()
    assert clock.uncertainty_ns < 1_000_000
    assert abs(clock.epoch(time.perf_counter_ns()) - time.time_ns()) < 5_000_000


def _info() -> EngineInfo:
    return EngineInfo(kind="pdexporter-sim", model="qwen3-coder", url="http://127.0.0.1:8123", modelled=True)


def test_probe_span_carries_genai_attributes_and_one_event_per_token_event() -> None:
    exporter = InMemorySpanExporter()
    clock = ClockOffset(offset_ns=1_700_000_000_000_000_000, uncertainty_ns=0)
    tracing = OtlpTracing(_info(), max_tokens=256, clock=clock, exporter=exporter)
    stream = TokenStream("probe0-0", "probe")
    stream.mark_sent(5 * MS)
    times = [20 * MS + k * 6 * MS for k in range(255)]
    for t in times:
        stream.record(t, 1)
    stream.record(times[-1] + 12 * MS, 2)  # an event carrying two tokens
    stream.finish(times[-1] + 13 * MS, "length", prompt_tokens=4096)
    span = tracing.start_probe(stream, slot=3)
    tracing.end_probe(span, stream)
    tracing.shutdown()
    (finished,) = exporter.get_finished_spans()
    a = finished.attributes
    assert finished.name == "text_completion qwen3-coder"
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "pdexporter-sim"
    assert a["gen_ai.request.model"] == "qwen3-coder"
    assert a["gen_ai.request.max_tokens"] == 256
    assert a["gen_ai.usage.input_tokens"] == 4096
    assert a["gen_ai.usage.output_tokens"] == 257
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == 8123
    assert a["pdexporter.probe.slot"] == 3 and a["pdexporter.engine.modelled"] is True
    assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.015)
    # 256 events: more than the SDK's default cap of 128, none dropped, exact times.
    assert len(finished.events) == 256
    assert [e.timestamp for e in finished.events] == [t + clock.offset_ns for t in [*times, times[-1] + 12 * MS]]
    assert all(e.name == PROBE_EVENT for e in finished.events)
    assert dict(finished.events[-1].attributes) == {"pdexporter.tokens": 2}
    assert finished.start_time == 5 * MS + clock.offset_ns
    assert finished.end_time == times[-1] + 13 * MS + clock.offset_ns
    assert finished.parent is None  # each probe stream is its own trace
