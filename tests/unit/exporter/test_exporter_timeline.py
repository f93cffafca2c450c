"""The exporter's live bookkeeping over the pure window maths."""

from __future__ import annotations

import numpy as np
import pytest

from pdexporter.client.stream import TokenStream
from pdexporter.exporter import timeline
from pdexporter.exporter.runner import ProbeState
from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.measure.window import (
    WindowParams,
    analyse_window,
    baseline_from_lengths,
    intervals,
    stream_phases,
    token_times,
    window_end_ns,
)

MS = 1_000_000
PARAMS = WindowParams()


def synthetic(n_streams: int, steps: list[float], t0: float = 0.0, stagger_ms: float = 0.0) -> list[np.ndarray]:
    """Every stream gets a token at the end of every step (step lengths in ms)."""
    ends = t0 + np.cumsum(np.asarray(steps) * MS)
    return [ends + i * stagger_ms * MS for i in range(n_streams)]


def test_quiet_baseline_uses_only_the_quiet_period_after_warmup() -> None:
    # 100 decode steps of 6 ms, then 100 of 9 ms (say, after a previous window): a baseline taken
    # at the end with the quiet period starting at step 100 must see only 9 ms intervals.
    streams = synthetic(3, [6.0] * 100 + [9.0] * 100)
    t_decide = int(streams[0][-1])
    quiet_from = float(streams[0][100])
    stats, start = timeline.quiet_baseline(streams, t_decide, quiet_from, span_ns=60e9, params=PARAMS)
    assert start == quiet_from
    assert stats is not None
    assert stats.p50_ms == pytest.approx(9.0)
    assert stats.n_intervals == 3 * 99
    # The span limits it too: the last 0.45 s hold 50 intervals per stream.
    stats, _ = timeline.quiet_baseline(streams, t_decide, -np.inf, span_ns=0.45e9, params=PARAMS)
    assert stats is not None and stats.n_intervals == 3 * 50


def test_quiet_baseline_discards_each_streams_warmup() -> None:
    stream = synthetic(1, [30.0] * 16 + [6.0] * 20)
    lengths = timeline.quiet_intervals_ns(stream, -np.inf, stream[0][-1], PARAMS)
    assert lengths.size == 35 - 16
    assert np.allclose(lengths, 6 * MS)


def test_phase_labels_pool_to_the_window_statistics() -> None:
    steps = [6.0] * 40 + [6.0, 45.0, 47.0, 50.0, 6.0] + [6.0] * 50
    streams = synthetic(4, steps, stagger_ms=0.3)
    t_inject = int(streams[0][39] + 1 * MS)
    t_first = int(streams[0][43] + 0.5 * MS)
    baseline = baseline_from_lengths(np.full(64, 6 * MS))
    stats = analyse_window(streams, t_inject, t_first, baseline, PARAMS)
    w_end = window_end_ns(t_first, baseline)
    theta = baseline.slow_threshold_ms(PARAMS)
    pooled: dict[str, list[float]] = {timeline.WINDOW: [], timeline.AFTER: []}
    for times in streams:
        phases = stream_phases(times, t_inject, t_first, w_end, theta, PARAMS)
        labels = timeline.phase_labels(phases)
        for label in pooled:
            pooled[label] += list(phases.intervals.length_ns[labels == label] / 1e6)
    assert stats.num_chunks_actual == 3
    # the histogram's during_prefill is the whole window; the record's "during" its chunk steps
    assert np.percentile(pooled[timeline.WINDOW], 50) == pytest.approx(stats.window_p50_ms)
    assert stats.during_p50_ms == pytest.approx(47.0)
    assert np.percentile(pooled[timeline.AFTER], 50) == pytest.approx(stats.after_p50_ms)
    assert len(pooled[timeline.AFTER]) == 4 * PARAMS.after_intervals
    phases = stream_phases(streams[0], t_inject, t_first, w_end, theta, PARAMS)
    labels = timeline.phase_labels(phases)
    assert list(labels[phases.window]) == [timeline.WINDOW] * 4
    assert list(phases.intervals.length_ns[phases.during] / MS) == pytest.approx([45.0, 47.0, 50.0])


def test_recovery_end_is_the_last_after_interval() -> None:
    streams = synthetic(2, [6.0] * 200, stagger_ms=1.0)
    t_inject, t_first = int(streams[0][49]), int(streams[0][52])
    w_end = float(t_first + 3 * MS)
    phases = [stream_phases(s, t_inject, t_first, w_end, None, PARAMS) for s in streams]
    end = timeline.recovery_end_ns(phases, w_end)
    expected = max(float(s[s > w_end][PARAMS.after_intervals - 1]) for s in streams)
    assert end == expected
    assert timeline.recovered(streams[0], w_end, 32)
    assert not timeline.recovered(streams[0][:60], w_end, 32)


def _stream(n_tokens: int, step_ms: float = 6.0, jitter: float = 0.0) -> TokenStream:
    stream = TokenStream("p", "probe")
    stream.mark_sent(0)
    t = 10 * MS
    rng = np.random.default_rng(n_tokens)
    for _ in range(n_tokens):
        t += int(step_ms * MS * (1 + jitter * rng.uniform(-1, 1)))
        stream.record(t, 1)
    return stream


def test_ready_to_inject_reasons() -> None:
    settings = ProtocolSettings()
    ready = [_stream(40) for _ in range(4)]
    assert timeline.ready_to_inject(ready, 4, settings, reserve_tokens=50, baseline_intervals=200,
                                    min_baseline_intervals=32).ready
    r = timeline.ready_to_inject(ready[:3], 4, settings, reserve_tokens=50)
    assert not r.ready and r.reason == "3/4 probe streams open"
    r = timeline.ready_to_inject([*ready[:3], _stream(20)], 4, settings, reserve_tokens=50)
    assert not r.ready and "steady" in r.reason
    r = timeline.ready_to_inject([*ready[:3], _stream(220)], 4, settings, reserve_tokens=50)
    assert not r.ready and "fewer than 50 tokens left" in r.reason
    r = timeline.ready_to_inject(
        ready, 4, settings, reserve_tokens=50, baseline_intervals=10, min_baseline_intervals=32
    )
    assert not r.ready and r.reason == "10/32 quiet baseline intervals"
    unsteady = _stream(40)
    unsteady.record(unsteady.event_times_ns[-1] + 100 * MS, 1)  # last 8 intervals no longer within 2x
    r = timeline.ready_to_inject([*ready[:3], unsteady], 4, settings, reserve_tokens=50)
    assert not r.ready


def test_step_spreads_measure_cross_stream_arrival_jitter() -> None:
    rng = np.random.default_rng(0)
    base = np.cumsum(np.full(100, 6.0 * MS))
    jitter = [rng.uniform(0, 0.2 * MS, size=100) for _ in range(8)]
    streams = [base + j for j in jitter]
    spreads = timeline.step_spreads_ns(streams, step_ns=6 * MS)
    assert spreads.size == 100
    expected = np.max(jitter, axis=0) - np.min(jitter, axis=0)
    assert np.allclose(spreads, expected)
    assert timeline.step_spreads_ns([], 6 * MS).size == 0


def test_probe_state_absorbs_like_token_times() -> None:
    """The runner's incremental per-token times equal the window maths' `token_times`."""
    stream = TokenStream("p", "probe")
    events = [(100, 1), (106, 1), (118, 2), (124, 1), (160, 3), (166, 1)]
    state = ProbeState(0, stream)
    for i, (t, n) in enumerate(events):
        stream.record(t * MS, n)
        if i % 2:
            state.absorb()
    state.absorb()
    assert np.allclose(state.array(), token_times([t * MS for t, _ in events], [n for _, n in events]))
    assert intervals(state.array()).length_ns.size == sum(n for _, n in events) - 1


def test_a_shortened_probe_counts_its_own_tokens_left() -> None:
    settings = ProtocolSettings()
    ready = [_stream(40) for _ in range(4)]
    ready[0].max_tokens = 80  # restarted in phase with the others: 40 tokens left, not 216
    r = timeline.ready_to_inject(ready, 4, settings, reserve_tokens=50)
    assert not r.ready and "1 probe stream(s) have fewer than 50 tokens left" in r.reason
    ready[0].max_tokens = 100
    assert timeline.ready_to_inject(ready, 4, settings, reserve_tokens=50).ready


def test_reads_that_carried_two_events_do_not_break_the_steady_state() -> None:
    """Issue 13's soak under CPU contention: a read that held two of a probe's events (same stamp)
    made a 0 ms interval, so one of 12 x 8 intervals nearly always broke the 2x rule."""
    from pdexporter.measure.protocol import steady

    settings = ProtocolSettings()
    merged = _stream(40)
    t = merged.event_times_ns[-1]
    merged.record(t + 16 * MS, 1)
    merged.record(t + 16 * MS, 1)  # the same read: 2 tokens in 16 ms, 8 ms a token
    merged.record(t + 24 * MS, 1)
    assert steady([merged], settings)
    slow = _stream(40)
    slow.record(slow.event_times_ns[-1] + 40 * MS, 1)  # a real 5x step: not steady
    assert not steady([slow], settings)
    slow_pair = _stream(40)
    t = slow_pair.event_times_ns[-1]
    slow_pair.record(t + 80 * MS, 1)
    slow_pair.record(t + 80 * MS, 1)  # 2 tokens in 80 ms: 40 ms a token, still 5x
    assert not steady([slow_pair], settings)


@pytest.mark.parametrize(("others", "expected"), [
    ([], 256),  # the first probe: a full cycle
    ([None, 0], 256),  # the others are done (or not known)
    ([256, 256], 256),  # they just restarted: the same
    ([120, 118], 120),  # far from their end (this one failed and came back): end with them
    ([5, 3], None),  # about to end: wait and restart together
    ([300], 256),  # never more than a full cycle
])
def test_a_restarting_probe_ends_with_the_others(others: list[int | None], expected: int | None) -> None:
    assert timeline.aligned_max_tokens(256, others, 32) == expected


def test_with_max_tokens_rewrites_only_max_tokens() -> None:
    from pdexporter.client.client import completion_request, encode_body
    from pdexporter.measure.driver import PreparedRequest

    ids = tuple(range(1000, 1100))
    body = encode_body(completion_request("m", ids, 256))
    prepared = PreparedRequest("probe", ids, 256, body)
    short = prepared.with_max_tokens(57)
    import json

    assert json.loads(short.body) == {**json.loads(body), "max_tokens": 57} and short.max_tokens == 57
    assert prepared.with_max_tokens(256) is prepared
