"""The exporter's OTLP/HTTP receiver (`POST /v1/traces`, `exporter.receiver`) over real HTTP: what
the OpenTelemetry SDK's own OTLP/HTTP exporter sends (as vLLM's tracer does, and the embedded
engine's `sim.otlp.RequestSpans`) is decoded into the requests' timings; bodies a collector would
refuse are refused the same way and counted by reason; what a hostile client sends (gzip bombs,
corrupt gzip, floods, no token) is refused within the receiver's limits (docs/security.md)."""

from __future__ import annotations

import asyncio
import gzip
import math

import aiohttp
import pytest

from pdexporter.client.traces import PROTOBUF, RequestTrace, encode_traces
from pdexporter.exporter.receiver import ReceiverLimits, traces_app
from pdexporter.exporter.server import start_server
from pdexporter.sim.otlp import RequestSpans
from tests.helpers import until

pytestmark = pytest.mark.integration

TRACES = [RequestTrace(f"cmpl-{k}", 1_700_000_000_000_000_000 + k * 10**9, 1_700_000_003_000_000_000 + k * 10**9,
                       prompt_tokens=1000 + k, completion_tokens=100, ttft_s=0.2, e2e_s=3.0, queue_s=0.01,
                       prefill_s=0.15, decode_s=2.8, inference_s=2.95, max_tokens=100) for k in range(5)]


async def _server(engine: str | None = "vllm", **kwargs):  # type: ignore[no-untyped-def]
    got: list[RequestTrace] = []
    results: list[str | None] = []
    app = traces_app(got.extend, on_result=results.append, engine=lambda: engine, **kwargs)
    runner, port = await start_server(app, "127.0.0.1", 0)
    return runner, port, got, results


async def test_the_sdks_otlp_http_exporter_is_decoded() -> None:
    runner, port, got, results = await _server()
    try:
        spans = RequestSpans(f"http://127.0.0.1:{port}/v1/traces", engine="pdexporter-sim", env={})
        for t in TRACES:
            spans(t)
        await asyncio.to_thread(spans.shutdown)  # flushes the batch over real HTTP
        assert sorted(got, key=lambda t: t.request_id) == TRACES
        assert results and all(r is None for r in results)
    finally:
        await runner.cleanup()


async def test_gzip_bodies_and_refusals() -> None:
    runner, port, got, results = await _server()
    url = f"http://127.0.0.1:{port}/v1/traces"
    try:
        async with aiohttp.ClientSession() as session:
            body = gzip.compress(encode_traces(TRACES[:2], engine="vllm"))
            async with session.post(url, data=body, headers={"Content-Type": PROTOBUF,
                                                             "Content-Encoding": "gzip"}) as resp:
                assert resp.status == 200 and resp.content_type == PROTOBUF
            async with session.post(url, data=b"\xff\xff\xff", headers={"Content-Type": PROTOBUF}) as resp:
                assert resp.status == 400 and "ExportTraceServiceRequest" in await resp.text()
            async with session.post(url, data=b"{}", headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 415 and PROTOBUF in await resp.text()
        assert [t.request_id for t in got] == ["cmpl-0", "cmpl-1"]
        assert results == [None, "bad-body", "unsupported-media-type"]
    finally:
        await runner.cleanup()


async def test_a_gzip_bomb_is_refused_at_the_decompressed_limit_without_inflating_it() -> None:
    """The audit's bomb: ~9 MB of gzip that inflates to 2 GB. aiohttp's own decompression inflated
    whole chunks before its size check (four at once took the exporter to 1.5 GB); the receiver
    inflates at most its limit and answers 413, counted as too-large."""
    import resource

    limits = ReceiverLimits(max_wire_bytes=16 * 2**20, max_decoded_bytes=2**20)
    runner, port, got, results = await _server(limits=limits)
    bomb = _gzip_zeros(256 * 2**20)  # 256 MB of zeros in ~250 KB
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        async with aiohttp.ClientSession() as session:
            statuses = await asyncio.gather(*(_post(session, port, bomb, "gzip") for _ in range(4)))
        grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert statuses == [413] * 4 and results == ["too-large"] * 4 and not got
        assert grew_mb < 64, f"peak RSS grew {grew_mb:.0f} MB"
    finally:
        await runner.cleanup()


async def test_corrupt_and_truncated_gzip_is_400_not_an_empty_export() -> None:
    runner, port, got, results = await _server()
    body = gzip.compress(encode_traces(TRACES[:2], engine="vllm"))
    try:
        async with aiohttp.ClientSession() as session:
            assert await _post(session, port, b"\x1f\x8b not gzip at all", "gzip") == 400
            assert await _post(session, port, body[: len(body) // 2], "gzip") == 400  # truncated
            assert await _post(session, port, body, "br") == 415
            assert await _post(session, port, body, "gzip") == 200
        assert results == ["bad-encoding", "bad-encoding", "unsupported-media-type", None]
        assert [t.request_id for t in got] == ["cmpl-0", "cmpl-1"]
    finally:
        await runner.cleanup()


async def test_bodies_over_the_wire_limit_are_413_before_or_while_they_are_read() -> None:
    runner, port, got, results = await _server(limits=ReceiverLimits(max_wire_bytes=1000))
    try:
        async with aiohttp.ClientSession() as session:
            assert await _post(session, port, b"\0" * 5000) == 413  # Content-Length says so: not read

            async def chunked():  # type: ignore[no-untyped-def]
                for _ in range(10):
                    yield b"\0" * 500

            async with session.post(f"http://127.0.0.1:{port}/v1/traces", data=chunked(),
                                    headers={"Content-Type": PROTOBUF}) as resp:
                assert resp.status == 413  # no Content-Length: counted as it streams in
        assert results == ["too-large", "too-large"] and not got
    finally:
        await runner.cleanup()


async def test_a_bearer_token_is_required_when_set() -> None:
    runner, port, got, results = await _server(token="s3cret-token")
    body = encode_traces(TRACES[:1], engine="vllm")
    try:
        async with aiohttp.ClientSession() as session:
            assert await _post(session, port, body) == 401
            assert await _post(session, port, body, headers={"Authorization": "Bearer wrong"}) == 401
            assert await _post(session, port, body, headers={"Authorization": "Bearer s3cret-token"}) == 200
        assert results == ["unauthorized", "unauthorized", None] and len(got) == 1
    finally:
        await runner.cleanup()


async def test_floods_are_answered_429_with_retry_after() -> None:
    """Requests beyond the rate, and spans beyond theirs, are refused (the SDK and the collector
    retry a 429); what was taken stays within the budget."""
    limits = ReceiverLimits(requests_per_s=1.0, request_burst=5, spans_per_s=1.0, span_burst=12)
    runner, port, got, results = await _server(limits=limits)
    body = encode_traces(TRACES, engine="vllm")  # 5 spans each
    try:
        async with aiohttp.ClientSession() as session:
            statuses = [await _post(session, port, body) for _ in range(8)]
            async with session.post(f"http://127.0.0.1:{port}/v1/traces", data=body,
                                    headers={"Content-Type": PROTOBUF}) as resp:
                assert resp.status == 429 and int(resp.headers["Retry-After"]) >= 1
        assert statuses[:2] == [200, 200] and set(statuses[2:]) == {429}
        assert results.count("rate-limited") == 7 and len(got) == 10
    finally:
        await runner.cleanup()


async def test_exports_beyond_the_concurrency_limit_wait_then_are_refused_busy() -> None:
    """Two bodies read at once; one more may wait; the rest are 429 `busy` at once, unread."""
    limits = ReceiverLimits(max_concurrent=1, max_waiting=1, wait_s=0.5)
    runner, port, _, results = await _server(limits=limits)
    try:
        async with aiohttp.ClientSession() as session:
            gate = asyncio.Event()

            async def slow():  # type: ignore[no-untyped-def]
                yield encode_traces(TRACES[:1], engine="vllm")[:5]
                await gate.wait()
                yield encode_traces(TRACES[:1], engine="vllm")[5:]

            held = asyncio.create_task(session.post(f"http://127.0.0.1:{port}/v1/traces", data=slow(),
                                                    headers={"Content-Type": PROTOBUF}))
            await asyncio.sleep(0.3)  # the slow body holds the one slot
            waiting = asyncio.create_task(_post(session, port, encode_traces(TRACES[1:2], engine="vllm")))
            await asyncio.sleep(0.1)
            assert await _post(session, port, encode_traces(TRACES[2:3], engine="vllm")) == 429  # no room to wait
            assert await waiting == 429  # waited 0.5 s for the slot
            gate.set()
            resp = await held
            assert resp.status == 200
            resp.release()
        assert sorted(results, key=str) == [None, "busy", "busy"]
    finally:
        await runner.cleanup()


async def _post(session: aiohttp.ClientSession, port: int, body: bytes, encoding: str | None = None,
                headers: dict[str, str] | None = None) -> int:
    h = {"Content-Type": PROTOBUF, **({"Content-Encoding": encoding} if encoding else {}), **(headers or {})}
    try:
        async with session.post(f"http://127.0.0.1:{port}/v1/traces", data=body, headers=h) as resp:
            return resp.status
    except aiohttp.ClientOSError:  # the server answered and closed before the whole body was sent
        return -1


def _gzip_zeros(n: int) -> bytes:
    import zlib

    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * 2**20
    return b"".join(c.compress(block) for _ in range(n // 2**20)) + c.flush()


def test_grpc_is_refused_by_the_embedded_engine_with_one_line() -> None:
    from pdexporter.errors import ConfigError

    with pytest.raises(ConfigError, match="OTLP/HTTP only") as info:
        RequestSpans("http://127.0.0.1:1/v1/traces", engine="pdexporter-sim",
                     env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="sends no request traces"):
        RequestSpans("http://127.0.0.1:1/v1/traces", engine="pdexporter-sim-sglang", env={})


async def test_traces_wait_until_the_engine_said_who_it_is() -> None:
    """Before the engine is identified the receiver cannot know whose spans it reads: 503, which
    OTLP exporters retry."""
    runner, port, got, results = await _server(engine=None)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/v1/traces", data=encode_traces(TRACES[:1], engine="vllm"),
                                    headers={"Content-Type": PROTOBUF}) as resp:
                assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        assert got == [] and results == ["engine-unknown"]
    finally:
        await runner.cleanup()


async def test_a_slow_upload_is_cut_and_does_not_keep_real_exports_out() -> None:
    """Issue 31: two uploads trickling their bodies held both slots for as long as they liked, and
    real exports were refused 429 `busy`. Now a body not read within `body_timeout_s` is 408."""
    limits = ReceiverLimits(max_concurrent=2, max_waiting=4, wait_s=4.0, body_timeout_s=1.0)
    runner, port, got, results = await _server(limits=limits)
    gate = asyncio.Event()
    try:
        async with aiohttp.ClientSession() as session:
            async def slow():  # type: ignore[no-untyped-def]
                yield encode_traces(TRACES[:1], engine="vllm")[:5]
                await gate.wait()  # never, while the test runs

            async def slow_post() -> int:
                try:
                    async with session.post(f"http://127.0.0.1:{port}/v1/traces", data=slow(),
                                            headers={"Content-Type": PROTOBUF}) as resp:
                        return resp.status
                except aiohttp.ClientError:
                    return -1

            held = [asyncio.create_task(slow_post()) for _ in range(2)]
            await asyncio.sleep(0.3)  # both slots taken by the trickles
            assert await _post(session, port, encode_traces(TRACES[1:2], engine="vllm")) == 200
            assert [t.request_id for t in got] == ["cmpl-1"]
            # The trickles end only once the server has cut both: a trickle that reached the server
            # late on a loaded machine, and was let finish, is a whole (short) body and answered 400.
            await until(lambda: results.count("slow-body") >= 2, 10, "the server to cut both trickles")
            gate.set()
            assert set(await asyncio.gather(*held)) <= {408, -1}
        assert results.count("slow-body") == 2 and results.count(None) == 1
    finally:
        gate.set()
        await runner.cleanup()


def _with_attribute(body: bytes, name: str, value: float) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    message = ExportTraceServiceRequest()
    message.ParseFromString(body)
    for kv in message.resource_spans[0].scope_spans[0].spans[0].attributes:
        if kv.key == name:
            kv.value.double_value = value
    return message.SerializeToString()


@pytest.mark.parametrize("value", [math.inf, math.nan, 1e300])
async def test_a_span_with_a_number_out_of_range_is_400_in_one_line(value: float) -> None:
    """Issue 31: an authenticated span with +inf prompt tokens got a 500 and a traceback."""
    from pdexporter.engines import adapter

    name = adapter("vllm").request_span_attributes["prompt_tokens"]
    runner, port, got, results = await _server(token="t0ken-for-spans")
    body = _with_attribute(encode_traces(TRACES[:2], engine="vllm"), name, value)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/v1/traces", data=body, headers={
                    "Content-Type": PROTOBUF, "Authorization": "Bearer t0ken-for-spans"}) as resp:
                text = await resp.text()
                assert resp.status == 400, text
        assert len(text.strip().splitlines()) == 1 and name in text and "Traceback" not in text, text
        assert results == ["bad-body"] and not got
    finally:
        await runner.cleanup()


async def test_spans_are_counted_and_paid_for_before_any_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: every export was decoded whole before its spans were counted against the rate
    (32 CPU-seconds in 31 s, /metrics at 0.8-1.0 s). Now an export over the span budget, or over
    `max_spans_per_export`, or inflating past the decode budget, is refused before decoding."""
    import pdexporter.client.traces as traces_module

    decoded: list[int] = []
    real = traces_module.traces_of
    monkeypatch.setattr(traces_module, "traces_of", lambda m, engine: decoded.append(1) or real(m, engine=engine))
    many = [RequestTrace(f"r-{k}", 1, 2, prompt_tokens=5) for k in range(60)]
    limits = ReceiverLimits(spans_per_s=1.0, span_burst=40, max_spans_per_export=50,
                            decoded_bytes_per_s=1.0, decoded_bytes_burst=2**20)
    runner, port, got, results = await _server(limits=limits)
    try:
        async with aiohttp.ClientSession() as session:
            assert await _post(session, port, encode_traces(many, engine="vllm")) == 413  # 60 > 50 in one
            assert await _post(session, port, encode_traces(many[:45], engine="vllm")) == 429  # 45 > 40 left
            assert await _post(session, port, _gzip_zeros(2 * 2**20), "gzip") == 429  # 2 MiB to inflate > 1 MiB
        assert results == ["too-large", "rate-limited", "rate-limited"] and not got and not decoded
    finally:
        await runner.cleanup()
