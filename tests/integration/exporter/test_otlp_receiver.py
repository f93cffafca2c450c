"""The exporter's OTLP/HTTP receiver (`POST /v1/traces`) over real HTTP: what the OpenTelemetry
SDK's own OTLP/HTTP exporter sends (as vLLM's tracer does, and the embedded engine's
`sim.otlp.RequestSpans`) is decoded into the requests' timings; bodies a collector would refuse
are refused the same way and counted."""

from __future__ import annotations

import asyncio
import gzip

import aiohttp
import pytest

from pdexporter.engine.traces import PROTOBUF, RequestTrace, encode_traces
from pdexporter.exporter.metrics import ExporterMetrics
from pdexporter.exporter.server import metrics_app, start_metrics_server
from pdexporter.sim.otlp import RequestSpans

pytestmark = pytest.mark.integration

TRACES = [RequestTrace(f"cmpl-{k}", 1_700_000_000_000_000_000 + k * 10**9, 1_700_000_003_000_000_000 + k * 10**9,
                       prompt_tokens=1000 + k, completion_tokens=100, ttft_s=0.2, e2e_s=3.0, queue_s=0.01,
                       prefill_s=0.15, decode_s=2.8, inference_s=2.95, max_tokens=100) for k in range(5)]


async def _server():  # type: ignore[no-untyped-def]
    metrics = ExporterMetrics()
    got: list[RequestTrace] = []
    results: list[bool] = []
    app = metrics_app(metrics.registry, traces_sink=got.extend, on_export=results.append)
    runner, port = await start_metrics_server(app, "127.0.0.1", 0)
    return runner, port, got, results


async def test_the_sdks_otlp_http_exporter_is_decoded() -> None:
    runner, port, got, results = await _server()
    try:
        spans = RequestSpans(f"http://127.0.0.1:{port}/v1/traces", env={})
        for t in TRACES:
            spans(t)
        await asyncio.to_thread(spans.shutdown)  # flushes the batch over real HTTP
        assert sorted(got, key=lambda t: t.request_id) == TRACES
        assert results and all(results)
    finally:
        await runner.cleanup()


async def test_gzip_bodies_and_refusals() -> None:
    runner, port, got, results = await _server()
    url = f"http://127.0.0.1:{port}/v1/traces"
    try:
        async with aiohttp.ClientSession() as session:
            body = gzip.compress(encode_traces(TRACES[:2]))
            async with session.post(url, data=body, headers={"Content-Type": PROTOBUF,
                                                             "Content-Encoding": "gzip"}) as resp:
                assert resp.status == 200 and resp.content_type == PROTOBUF
            async with session.post(url, data=b"\xff\xff\xff", headers={"Content-Type": PROTOBUF}) as resp:
                assert resp.status == 400 and "ExportTraceServiceRequest" in await resp.text()
            async with session.post(url, data=b"{}", headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 415 and PROTOBUF in await resp.text()
        assert [t.request_id for t in got] == ["cmpl-0", "cmpl-1"]
        assert results == [True, False, False]
    finally:
        await runner.cleanup()


def test_grpc_is_refused_by_the_embedded_engine_with_one_line() -> None:
    from pdexporter.errors import ConfigError

    with pytest.raises(ConfigError, match="OTLP/HTTP only") as info:
        RequestSpans("http://127.0.0.1:1/v1/traces", env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
    assert "\n" not in str(info.value)
