"""Pooled (fast-mode) probes: a reused probe looks like a fresh faithful probe to the maths."""

from __future__ import annotations

import numpy as np

from pdexporter.client.stream import TokenStream
from pdexporter.measure.probesets import PooledProbes, trim_trace
from pdexporter.measure.protocol import ProtocolSettings, StreamTrace, analyse_traces
from pdexporter.measure.window import analyse_window, baseline_from_lengths

MS = 1_000_000


def trace(intervals_ms: list[float], start_ns: int = 0) -> StreamTrace:
    times, t = [], start_ns
    for gap in intervals_ms:
        t += int(gap * MS)
        times.append(t)
    return StreamTrace("probe-0", "probe", start_ns, times, [1] * len(times))


def test_trim_keeps_the_tokens_before_injection_and_all_after() -> None:
    tr = trace([10.0] * 300)
    t_inject = tr.event_times_ns[199] + 1
    cut = trim_trace(tr, t_inject, keep_tokens=48)
    before = [t for t in cut.event_times_ns if t <= t_inject]
    assert len(before) == 49  # 48 tokens, plus the event that starts the first interval
    assert cut.event_times_ns[-1] == tr.event_times_ns[-1] and len(cut.event_times_ns) == 49 + 100


def test_trim_counts_tokens_of_multi_token_events() -> None:
    tr = StreamTrace("p", "probe", 0, [10, 20, 30, 40, 50], [1, 4, 4, 4, 1])
    cut = trim_trace(tr, 45, keep_tokens=5)
    assert cut.event_times_ns == [30, 40, 50] and cut.event_tokens == [4, 4, 1]  # 8 >= 5 + 1 tokens


def test_an_earlier_window_does_not_leak_into_pre_injection_numbers() -> None:
    settings = ProtocolSettings()
    base = baseline_from_lengths(np.full(200, 10.0 * MS))
    # 100 steady tokens, an earlier window of slow steps, 60 steady tokens, then this window.
    gaps = [10.0] * 100 + [80.0] * 20 + [10.0] * 60 + [80.0] * 4 + [10.0] * 40
    tr = trace(gaps)
    t_inject = tr.event_times_ns[179] + 1
    t_first = tr.event_times_ns[183]
    window_full = analyse_window([tr.token_times()], t_inject, t_first, base, settings.window)
    stream = TokenStream("probe-0", "probe", t_sent_ns=0, event_times_ns=list(tr.event_times_ns),
                         event_tokens=list(tr.event_tokens), n_tokens=len(tr.event_tokens))
    traces = PooledProbes(settings, 8192, 1, 600).traces([stream], t_inject)
    trimmed = analyse_traces(traces, t_inject, t_first, base, settings.window, engine="vllm")
    assert trimmed.pre_p50_ms == 10.0
    assert trimmed.during_p50_ms == window_full.during_p50_ms
    assert trimmed.num_chunks_actual == window_full.num_chunks_actual == 4
    assert len(traces[0].event_times_ns) < len(tr.event_times_ns)
