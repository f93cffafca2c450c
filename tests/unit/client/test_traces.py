"""vLLM's request spans (`client.traces`): decoded from OTLP protobuf as a collector would, what
vLLM 0.22 names its attributes, and bodies a receiver must refuse."""

from __future__ import annotations

import gzip
import zlib

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from pdexporter.client.traces import RequestTrace, TraceDecodeError, decode_traces, encode_traces
from pdexporter.engines import adapter

REQUEST_SPAN_NAME, REQUEST_SPAN_ATTRIBUTES = adapter("vllm").request_span_name, adapter("vllm").request_span_attributes

TRACE = RequestTrace("cmpl-1", 1_700_000_000_000_000_000, 1_700_000_002_500_000_000, prompt_tokens=3000,
                     completion_tokens=200, ttft_s=0.25, e2e_s=2.5, queue_s=0.01, prefill_s=0.2, decode_s=2.25,
                     inference_s=2.45, max_tokens=200)


def test_round_trip_keeps_every_field() -> None:
    (got,) = decode_traces(encode_traces([TRACE], engine="vllm"), engine="vllm")
    assert got == TRACE
    assert got.first_token_ns == pytest.approx(TRACE.start_ns + 0.25e9)


def test_the_spans_are_shaped_as_vllm_sends_them() -> None:
    message = ExportTraceServiceRequest()
    message.ParseFromString(encode_traces([TRACE], engine="vllm"))
    (span,) = message.resource_spans[0].scope_spans[0].spans
    assert span.name == REQUEST_SPAN_NAME == "llm_request"
    keys = {kv.key for kv in span.attributes}
    assert (
        {
            "gen_ai.usage.prompt_tokens",
            "gen_ai.latency.time_to_first_token",
            "gen_ai.latency.time_in_queue",
            "gen_ai.latency.time_in_model_prefill",
            "gen_ai.request.id",
        }
        <= keys
        == set(REQUEST_SPAN_ATTRIBUTES.values())
    )
    by = {kv.key: kv.value for kv in span.attributes}
    assert by["gen_ai.usage.prompt_tokens"].int_value == 3000
    assert by["gen_ai.latency.time_to_first_token"].double_value == 0.25
    assert span.start_time_unix_nano == TRACE.start_ns


def test_other_spans_are_skipped_and_missing_attributes_are_none() -> None:
    message = ExportTraceServiceRequest()
    message.ParseFromString(encode_traces([TRACE, RequestTrace("cmpl-2", 10, 20)], engine="vllm"))
    startup = message.resource_spans[0].scope_spans[0].spans.add()
    startup.name = "Load weights"
    got = decode_traces(message.SerializeToString(), engine="vllm")
    assert [t.request_id for t in got] == ["cmpl-1", "cmpl-2"]
    assert got[1].prompt_tokens is None and got[1].first_token_ns is None


@pytest.mark.parametrize("encoding, pack", [("gzip", gzip.compress), ("deflate", zlib.compress), (None, bytes)])
def test_compressed_bodies(encoding, pack) -> None:
    assert decode_traces(pack(encode_traces([TRACE], engine="vllm")), engine="vllm", content_encoding=encoding) == [
        TRACE
    ]


@pytest.mark.parametrize("body, encoding, message", [
    (b"\xff\xff\xff\xff", None, "not an OTLP ExportTraceServiceRequest"),
    (b"not gzip", "gzip", "not valid gzip data"),
    (b"", "br", "Content-Encoding 'br'"),
])
def test_bad_bodies_are_one_line_errors(body, encoding, message) -> None:
    with pytest.raises(TraceDecodeError, match=message) as info:
        decode_traces(body, engine="vllm", content_encoding=encoding)
    assert "\n" not in str(info.value)
