"""Which clock a stream's stamps came from: kept on TokenStream, carried through the raw record."""

from __future__ import annotations

from pdexporter.client.stream import TokenStream
from pdexporter.measure.protocol import StreamTrace


def test_a_stream_names_its_least_precise_clock() -> None:
    stream = TokenStream("s")
    assert stream.stamp_clock is None
    stream.stamp_clock = "kernel-rx"
    stream.note_stamp_clock("kernel-rx")
    assert stream.stamp_clock == "kernel-rx"
    stream.note_stamp_clock("wakeup")  # one read had no kernel stamp
    assert stream.stamp_clock == "wakeup"
    stream.note_stamp_clock("kernel-rx")  # later kernel stamps do not make the earlier one better
    assert stream.stamp_clock == "wakeup"
    stream.note_stamp_clock("read")
    assert stream.stamp_clock == "read"


def test_a_retry_forgets_the_failed_attempts_clock() -> None:
    stream = TokenStream("s")
    stream.stamp_clock = "read"
    stream.fail(1, RuntimeError("refused"))
    stream.reopen()
    assert stream.stamp_clock is None


def test_stamp_clock_survives_the_raw_record_and_old_records_still_load() -> None:
    stream = TokenStream("p0", "probe")
    stream.mark_sent(1_000)
    stream.stamp_clock = "kernel-rx"
    for k in range(1, 4):
        stream.record(1_000 + k * 7_000_000, 1)
    stream.finish(40_000_000, "length", 4096)
    raw = StreamTrace.of(stream).to_raw(t0_ns=1_000)
    assert raw["stamp_clock"] == "kernel-rx"
    back = StreamTrace.from_raw(raw, t0_ns=1_000)
    assert back.stamp_clock == "kernel-rx" and back.event_times_ns == stream.event_times_ns

    old = dict(raw)
    del old["stamp_clock"]  # a record written before the field existed
    assert StreamTrace.from_raw(old).stamp_clock is None
    unknown = StreamTrace.of(TokenStream("q"))
    assert "stamp_clock" not in unknown.to_raw(0)  # not recorded: no key, the raw shape of before
