"""A probe stamp before its predecessor's (a CI sweep once crashed writing `min_interval_ms = -0.261`):
held at the stamp before it where it is recorded and in the window maths, counted in the record,
and a window whose stamps went back too far is refused in one line naming the stream."""

from __future__ import annotations

import numpy as np
import pytest

from pdexporter.client.stream import TokenStream
from pdexporter.errors import RecordError
from pdexporter.measure.probesets import trim_trace
from pdexporter.measure.protocol import StreamTrace, analyse_traces, stamp_problem
from pdexporter.measure.records import interference_block
from pdexporter.measure.window import WindowParams, analyse_window, baseline_stats, intervals, token_times

MS = 1_000_000
BACK_NS = 261_000  # the CI run's -0.261 ms


def _timeline(d: int = 2, decode_ms: float = 6.0, lead: int = 60, tail: int = 60) -> tuple[list[list[int]], int, int]:
    """D decodes' event times (one token per step) around one 50 ms chunk step; t_inject, t_first."""
    steps = [decode_ms] * lead + [decode_ms, 50.0] + [decode_ms] * tail
    ends = np.cumsum(np.asarray(steps) * MS).astype(np.int64)
    t_inject = int(ends[lead - 1] + decode_ms * MS / 2)
    t_first = int(ends[lead + 1] + 50_000)
    return [[int(t) + 1_000_000_000 + i * 20_000 for t in ends] for i in range(d)], \
        t_inject + 1_000_000_000, t_first + 1_000_000_000


def _out_of_order(times: list[int], t_inject: int) -> tuple[list[int], int]:
    """The first event after t_inject stamped late, after the next one: that one reads 0.261 ms
    before its predecessor (a negative interval inside the window). Returns the times, its index."""
    j = next(i for i, t in enumerate(times) if t > t_inject)
    out = list(times)
    out[j] = out[j + 1] + BACK_NS
    return out, j + 1


def _block(traces: list[StreamTrace], t_inject: int, t_first: int):  # type: ignore[no-untyped-def]
    base = baseline_stats([np.arange(256, dtype=np.float64) * 6 * MS] * len(traces))
    window = analyse_traces(traces, t_inject, t_first, base, WindowParams(), engine="vllm")
    block = interference_block(window, num_chunks_expected=1, engine_chunks=None, prefill_prompt_tokens=512)
    return window, block


def test_a_stream_holds_a_stamp_before_its_predecessors_and_the_record_is_written() -> None:
    """The path that crashed: stream -> trace -> window stats -> record block."""
    streams, t_inject, t_first = _timeline()
    bad, k = _out_of_order(streams[0], t_inject)
    traces = []
    for i, times in enumerate([bad, streams[1]]):
        stream = TokenStream(f"probe{i}-0", "probe")
        stream.stamp_clock = "kernel-rx"
        for t in times:
            stream.record(t, 1)
        traces.append(StreamTrace.of(stream))
    window, block = _block(traces, t_inject, t_first)  # was: pydantic's ge=0 refused min_interval_ms -0.261
    assert traces[0].stamps_held == [(k, BACK_NS)]
    assert traces[0].event_times_ns[k] == traces[0].event_times_ns[k - 1]  # held at the stamp before
    assert traces[1].stamps_held == []
    assert window.min_interval_ms == pytest.approx(0.0)
    assert window.stamp_corrections == 1
    assert block.min_interval_ms == pytest.approx(0.0) and block.stamp_corrections == 1
    assert stamp_problem(traces, baseline_stats([np.arange(64) * 6.0 * MS]), WindowParams()) is None


def test_a_trace_still_out_of_order_is_held_by_the_window_maths() -> None:
    """A raw file written before streams held their stamps (or any driver's trace) goes back as it was."""
    streams, t_inject, t_first = _timeline()
    bad, k = _out_of_order(streams[0], t_inject)
    traces = [StreamTrace("probe0-0", "probe", None, bad, [1] * len(bad)),
              StreamTrace("probe1-0", "probe", None, streams[1], [1] * len(streams[1]))]
    window, block = _block(traces, t_inject, t_first)
    assert traces[0].stamps_back_ns() == [BACK_NS]
    assert window.min_interval_ms == pytest.approx(0.0) and block.stamp_corrections == 1
    times = token_times(bad, [1] * len(bad))
    assert np.all(np.diff(times) >= 0) and times[k] == bad[k - 1]
    assert np.all(intervals(np.asarray(bad, dtype=np.float64)).length_ns >= 0)
    # arrays handed to analyse_window directly are held and counted there
    direct = analyse_window([np.asarray(bad, dtype=np.float64), np.asarray(streams[1], dtype=np.float64)],
                            t_inject, t_first, baseline_stats([np.arange(256) * 6.0 * MS]))
    assert direct.min_interval_ms == pytest.approx(0.0) and direct.stamp_corrections == 1


def test_a_stamp_far_back_refuses_the_window_in_one_line_naming_the_stream() -> None:
    streams, _, _ = _timeline()
    stream = TokenStream("probe3-7", "probe")
    stream.stamp_clock = "wakeup"
    for t in streams[0][:40]:
        stream.record(t, 1)
    stream.record(streams[0][39] - 3 * MS, 1)  # 3 ms back at a 6 ms step: more than a tenth of it
    base = baseline_stats([np.arange(64) * 6.0 * MS])
    problem = stamp_problem([StreamTrace.of(stream)], base, WindowParams())
    assert problem is not None and "\n" not in problem
    assert "probe3-7" in problem and "3.000 ms" in problem and "wakeup" in problem
    assert stamp_problem([StreamTrace.of(stream)], None, WindowParams()) is None  # no step to judge by


def test_held_stamps_survive_the_raw_file_and_the_pooled_trim() -> None:
    trace = StreamTrace("p0", "probe", 0, [10, 20, 20, 30, 40], [1, 1, 1, 1, 1], stamps_held=[(2, 5), (4, 1)])
    raw = trace.to_raw(0)
    assert raw["stamps_held"] == [[2, 5], [4, 1]]
    back = StreamTrace.from_raw(raw)
    assert back.stamps_held == [(2, 5), (4, 1)] and back.stamps_back_ns() == [5, 1]
    assert "stamps_held" not in StreamTrace("q", "probe", 0, [1, 2], [1, 1]).to_raw(0)  # the shape of before
    cut = trim_trace(trace, t_inject_ns=25, keep_tokens=0)
    assert cut.event_times_ns == [20, 30, 40] and cut.stamps_held == [(0, 5), (2, 1)]  # indices follow the cut
    with pytest.raises(RecordError, match=r"stamps_held\[0\]"):
        StreamTrace.from_raw({**raw, "stamps_held": [[2, -5]]}, where="f.json: probes[0]")
