"""The trace receiver's pure parts (`exporter.receiver`: bounded inflating, token buckets) and the
intake's judgement of each span (`passive_live.TraceIntake`): what a span can claim is bounded."""

from __future__ import annotations

import gzip
import zlib

import pytest

from pdexporter.client.traces import RequestTrace
from pdexporter.exporter.metrics import ExporterMetrics
from pdexporter.exporter.passive_live import TraceIntake
from pdexporter.exporter.receiver import BoundedInflater, TokenBucket, TooLarge

NOW = 1_800_000_000 * 10**9  # the intake's clock, ns


def _inflate(body: bytes, encoding: str, limit: int, chunk: int = 1000) -> bytes:
    inflater = BoundedInflater(encoding, limit)
    for i in range(0, len(body), chunk):
        inflater.feed(body[i : i + chunk])
    return inflater.finish()


def test_gzip_deflate_and_identity_bodies_come_back_whole() -> None:
    data = bytes(range(256)) * 400
    assert _inflate(gzip.compress(data), "gzip", 10**6) == data
    assert (
        _inflate(gzip.compress(data[:500]) + gzip.compress(data[500:]), "gzip", 10**6) == data
    )  # two members
    assert _inflate(zlib.compress(data), "deflate", 10**6) == data
    assert _inflate(data, "identity", 10**6) == data


def test_inflating_stops_at_the_limit_without_holding_more() -> None:
    bomb = gzip.compress(b"\0" * 50_000_000)  # ~50 KB that inflates to 50 MB
    inflater = BoundedInflater("gzip", 100_000)
    with pytest.raises(TooLarge):
        inflater.feed(bomb)
    assert inflater.size <= 100_001 and sum(map(len, inflater.parts)) <= 100_001
    with pytest.raises(TooLarge):
        _inflate(b"x" * 2000, "identity", 1000)


@pytest.mark.parametrize(
    "body",
    [b"\x1f\x8b not gzip", gzip.compress(b"abc" * 1000, mtime=0)[:40], b""],
    ids=["corrupt", "truncated", "empty"],
)
def test_corrupt_or_truncated_gzip_is_an_error_not_an_empty_body(body: bytes) -> None:
    with pytest.raises(ValueError):
        _inflate(body, "gzip", 10**6)


def test_token_bucket_spends_what_it_saved_and_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=10.0, burst=5, clock=lambda: now[0])
    assert [bucket.take() for _ in range(6)] == [True] * 5 + [False]
    assert bucket.wait_s() == pytest.approx(0.1)
    now[0] = 0.3
    assert bucket.take(3) and not bucket.take(1)
    now[0] = 100.0
    assert bucket.take(5) and not bucket.take(1)  # never more than the burst saved


class _PassiveDouble:
    """A TEST DOUBLE of the live passive mode: it keeps what the intake hands it."""

    def __init__(self) -> None:
        self.got: list[RequestTrace] = []

    def add_traces(self, traces: list[RequestTrace]) -> None:
        self.got.extend(traces)


def _trace(rid: str, first_token_ns: int) -> RequestTrace:
    return RequestTrace(rid, first_token_ns - 10**8, first_token_ns + 10**9, prompt_tokens=100, ttft_s=0.1)


def _kinds(metrics: ExporterMetrics) -> dict[str, float]:
    return {
        s.labels["kind"]: s.value
        for f in metrics.registry.collect()
        for s in f.samples
        if s.name == "pdexporter_request_traces_total"
    }


def test_spans_from_the_future_or_the_far_past_are_dropped_and_counted() -> None:
    """The audit: spans with future timestamps were never pruned (4000/s: +1 MB/s for ever), since
    passive mode prunes its requests from the oldest."""
    metrics = ExporterMetrics()
    intake = TraceIntake(metrics, max_age_s=70.0, now_unix_ns=lambda: NOW)
    passive = _PassiveDouble()
    intake.passive = passive  # type: ignore[assignment]
    intake.sink(
        [
            _trace("future", NOW + 3600 * 10**9),
            _trace("past", NOW - 3600 * 10**9),
            _trace("now", NOW - 5 * 10**9),
            _trace("skewed", NOW + 30 * 10**9),
        ]
    )
    assert [t.request_id for t in passive.got] == ["now", "skewed"]
    assert _kinds(metrics)["out-of-range"] == 2


def test_a_replayed_request_id_is_taken_once_and_long_ids_are_refused() -> None:
    metrics = ExporterMetrics()
    intake = TraceIntake(metrics, now_unix_ns=lambda: NOW)
    passive = _PassiveDouble()
    intake.passive = passive  # type: ignore[assignment]
    intake.sink([_trace("cmpl-1", NOW), _trace("cmpl-1", NOW + 10**6), _trace("x" * 10_000, NOW)])
    intake.sink([_trace("cmpl-1", NOW)])
    assert [t.request_id for t in passive.got] == ["cmpl-1"]
    kinds = _kinds(metrics)
    assert kinds["duplicate"] == 2 and kinds["unusable"] == 1


def test_the_intake_remembers_a_bounded_number_of_ids() -> None:
    intake = TraceIntake(ExporterMetrics(), now_unix_ns=lambda: NOW)
    for k in range(3):
        intake.sink([_trace(f"r{k}-{i}", NOW) for i in range(TraceIntake.KEEP_IDS)])
    assert len(intake._ids) == TraceIntake.KEEP_IDS
