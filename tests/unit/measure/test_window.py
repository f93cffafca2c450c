"""The window maths on synthetic engine timelines whose truth is known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdexporter.engines import adapter
from pdexporter.measure.window import (
    WindowParams,
    analyse_window,
    baseline_stats,
    derive,
    intervals,
    read_cadence_ms,
    token_times,
)

MS = 1_000_000


def timeline(step_ms: list[float], streams: int, skew_ns: int = 20_000) -> list[np.ndarray]:
    """Token times of `streams` decodes that each get one token per engine step."""
    ends = np.cumsum(np.asarray(step_ms) * MS)
    return [ends + i * skew_ns for i in range(streams)]


def test_token_times_spread_multi_token_events_over_their_gap() -> None:
    times = token_times([0, 10 * MS, 40 * MS], [1, 1, 3])
    assert list(times) == [0, 10 * MS, 20 * MS, 30 * MS, 40 * MS]


def test_token_times_reject_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        token_times([1, 2], [1])


def test_intervals_drop_warmup_tokens() -> None:
    times = np.arange(20, dtype=float) * MS
    iv = intervals(times, warmup_tokens=16)
    assert list(iv.token_index) == [17, 18, 19]
    assert np.allclose(iv.length_ns, MS)


def test_baseline_of_a_steady_cadence_is_that_cadence() -> None:
    stats = baseline_stats(timeline([6.0] * 256, streams=4))
    assert stats is not None
    assert stats.p50_ms == pytest.approx(6.0)
    assert stats.p99_ms == pytest.approx(6.0)
    assert stats.n_intervals == 4 * (256 - 17)


def test_no_streams_no_baseline() -> None:
    assert baseline_stats([]) is None


def _scenario(chunk_ms: list[float], *, decode_ms: float = 6.0, d: int = 4, lead: int = 60, tail: int = 60,
              async_depth: int = 1):
    """Decode steps, then the prefill arrives mid-step; `async_depth` more decode-only steps were
    already scheduled; then one mixed step per chunk; the prefill's first token leaves with the
    last mixed step."""
    steps = [decode_ms] * lead + [decode_ms] * async_depth + list(chunk_ms) + [decode_ms] * tail
    streams = timeline(steps, d)
    ends = np.cumsum(np.asarray(steps) * MS)
    t_inject = int(ends[lead - 1] - decode_ms * MS / 2)  # halfway through step `lead`
    t_first = int(ends[lead + async_depth + len(chunk_ms) - 1] + 50_000)
    base = baseline_stats(timeline([decode_ms] * 256, d))
    return streams, t_inject, t_first, base


def test_window_counts_each_mixed_step_once_and_skips_presheduled_decode_steps() -> None:
    chunks = [47.0 + (120.0 - 47.0) * k / 16 for k in range(16)] + [9.0]
    streams, t_inject, t_first, base = _scenario(chunks, async_depth=2)
    w = analyse_window(streams, t_inject, t_first, base)
    assert w.num_chunks_actual == 17
    assert w.slow_steps_per_stream == (17, 17, 17, 17)
    # the window also holds the interrupted step and the 2 pre-scheduled decode steps ...
    assert w.window_intervals == 4 * (1 + 2 + 17)
    # ... but "during" starts at the first slow step: its p50 is a mixed step, not a decode step
    assert w.during_p50_ms == pytest.approx(float(np.median(chunks)))
    assert w.chunk_step_times_ms == pytest.approx(tuple(chunks))
    assert w.after_p50_ms == pytest.approx(6.0)
    assert w.prefill_duration_ms == pytest.approx((t_first - t_inject) / MS)
    assert w.zero_intervals == 0


def test_single_chunk_penalty_matches_the_seed_example_shape() -> None:
    # seed example: baseline 42.3 ms, one 89.2 ms mixed step -> penalty 46.9, ratio 1.11
    streams, t_inject, t_first, base = _scenario([89.2], decode_ms=42.3, async_depth=1)
    w = analyse_window(streams, t_inject, t_first, base)
    d = derive(base, w, 4)
    assert w.num_chunks_actual == 1
    assert d.tpot_penalty_p50_ms == pytest.approx(46.9, abs=1e-6)
    assert d.tpot_penalty_ratio == pytest.approx(46.9 / 42.3)
    assert round(d.tpot_penalty_ratio, 2) == 1.11
    assert d.total_interference_ms == pytest.approx(46.9, abs=1e-6)
    assert d.decode_tokens_delayed == 4
    assert d.aggregate_interference_ms == pytest.approx(4 * 46.9, abs=1e-6)


def test_bursts_of_zero_intervals_are_counted() -> None:
    streams, t_inject, t_first, base = _scenario([50.0, 50.0])
    late = streams[0].copy()
    # the client read two tokens in one go: the second arrives at the same instant as the first
    idx = int(np.searchsorted(late, t_inject)) + 1
    late[idx] = late[idx + 1]
    w = analyse_window([late, *streams[1:]], t_inject, t_first, base)
    assert w.zero_intervals >= 1
    assert w.min_interval_ms == pytest.approx(0.0)


def test_no_decodes_gives_prefill_duration_only() -> None:
    w = analyse_window([], 0, 90 * MS, None)
    assert w.prefill_duration_ms == 90.0
    assert w.num_chunks_actual is None and w.during_p50_ms is None
    d = derive(None, w, 0)
    assert d.tpot_penalty_p50_ms is None and d.decode_tokens_delayed == 0


def test_first_token_before_inject_is_rejected() -> None:
    with pytest.raises(ValueError):
        analyse_window([], 10, 5, None)


@pytest.mark.parametrize(
    "p, b, d, expected",
    [(32768, 2048, 4, 17), (32768, 8192, 4, 5), (8192, 8192, 4, 2), (8192, 8192, 0, 1), (2048, 2048, 12, 2),
     (512, 8192, 12, 1), (8180, 8192, 12, 1)],
)
def test_expected_chunks(p: int, b: int, d: int, expected: int) -> None:
    assert len(adapter('vllm').chunk_schedule(p, b, d)) == expected


def test_expected_chunks_needs_budget() -> None:
    with pytest.raises(ValueError):
        adapter('vllm').chunk_schedule(100, 4, 4)


@settings(max_examples=150, deadline=None)
@given(
    chunk_ms=st.lists(st.floats(8.0, 400.0), min_size=1, max_size=24),
    decode_ms=st.floats(3.0, 6.0),
    d=st.integers(1, 12),
    async_depth=st.integers(0, 2),
)
def test_slow_steps_and_total_interference_are_exact_on_clean_timelines(
    chunk_ms: list[float], decode_ms: float, d: int, async_depth: int
) -> None:
    streams, t_inject, t_first, base = _scenario(chunk_ms, decode_ms=decode_ms, d=d, async_depth=async_depth)
    w = analyse_window(streams, t_inject, t_first, base, WindowParams())
    assert w.num_chunks_actual == len(chunk_ms)
    assert w.decode_tokens_delayed == d * len(chunk_ms)
    excess = sum(c - decode_ms for c in chunk_ms)
    assert w.total_interference_ms == pytest.approx(excess, rel=1e-6, abs=1e-6)
    assert math.isclose(w.during_p50_ms, float(np.median(chunk_ms)), rel_tol=1e-9)


def test_totals_leave_out_a_stream_still_in_its_warm_up_when_the_window_opens() -> None:
    # Passive mode: the exporter restarts a probe (256 tokens) while production prefills come, so a
    # probe may be in its first `warmup_tokens` tokens when a run of slow steps begins. Its intervals
    # up to token 16 are discarded, so it holds only the window's tail (here the second chunk step):
    # averaged in, it read a 2-chunk event 25 % low (4 probes; the H200 passive runs: 13 of 379 events,
    # 13 of 189, 14 of 357, up to 35 % low).
    chunks, lead = [150.0, 150.0], 60
    streams, t_inject, t_first, base = _scenario(chunks, d=4, lead=lead, async_depth=1)
    late = streams[3][lead - 15:]  # its token 16 comes with the first chunk's step, after t_inject
    w = analyse_window([*streams[:3], late], t_inject, t_first, base)
    assert w.total_interference_ms == pytest.approx(sum(c - 6.0 for c in chunks), abs=1e-6)
    # a stream whose warm-up ended just before the window counts whole
    ready = streams[3][lead - 18:]
    w = analyse_window([*streams[:3], ready], t_inject, t_first, base)
    assert w.total_interference_ms == pytest.approx(sum(c - 6.0 for c in chunks), abs=1e-6)
    # with no stream past its warm-up, no stream saw the whole window: no total
    assert analyse_window([late], t_inject, t_first, base).total_interference_ms is None


def test_totals_are_charged_against_the_cadence_just_before_the_injection() -> None:
    # Phase 1 measured 6.9 ms, but the decodes ran 6.0 ms steps before and after the prefill (the
    # H200's DecodeBench campaign of 2026-12-03 at D = 7: 6.44 against 5.59 ms): one 10.5 ms
    # admission step costs each decode 4.5 ms, not 4.5 - 0.9 x (the window's intervals).
    streams, t_inject, t_first, _ = _scenario([10.5], decode_ms=6.0, d=7, async_depth=2)
    stale = baseline_stats(timeline([6.9] * 256, 7))
    w = analyse_window(streams, t_inject, t_first, stale)
    assert w.pre_p50_ms == pytest.approx(6.0)
    assert w.total_interference_ms == pytest.approx(4.5, abs=1e-6)
    assert derive(stale, w, 7).tpot_penalty_ms == pytest.approx(10.5 - 6.9)  # the penalty keeps Phase 1's


def test_totals_fall_back_to_phase1_when_the_probes_saw_few_steps_before_the_injection() -> None:
    # 17 warm-up tokens dropped + 3 steps: fewer than `loss_reference_min` pre-injection intervals per stream
    streams, t_inject, t_first, _ = _scenario([10.5], decode_ms=6.0, d=4, lead=20, async_depth=2)
    stale = baseline_stats(timeline([6.9] * 256, 4))
    w = analyse_window(streams, t_inject, t_first, stale)
    n = w.window_intervals // 4
    assert w.total_interference_ms == pytest.approx(10.5 + 6.0 * (n - 1) - 6.9 * n, abs=1e-6)
    w8 = analyse_window(streams, t_inject, t_first, stale, WindowParams(loss_reference_min=1))
    assert w8.total_interference_ms == pytest.approx(4.5, abs=1e-6)


def test_totals_reference_undoes_the_read_bursts_after_a_long_window() -> None:
    # GPU session 15's grid (8 recovery intervals), B = 16384, D = 8, P = 32768, repetition 3: after
    # the window before, the probes' tokens came in bursts (one 5-token SSE event spread over 3.9 ms,
    # then 26.4 ms and 5 tokens read at once, ...); Phase 1 5.97 ms, the decodes' steps ~5.3 ms
    pre = np.array([0.78] * 5 + [1.15, 4.13, 5.41, 5.08, 26.4, 0, 0, 0, 0, 5.22, 5.4, 5.01, 5.34, 16.06, 0, 0])
    assert np.median(pre) < 0.5 * 5.3  # the plain p50 the totals were charged against
    cadence = read_cadence_ms(pre, 5.97)
    assert float(np.median(cadence)) == pytest.approx(5.28, abs=0.05)
    assert cadence.sum() == pytest.approx(pre[6:].sum())  # the leading burst dropped, the rest's time kept
    assert read_cadence_ms(np.full(10, 6.0), 6.9) == pytest.approx(np.full(10, 6.0))
    assert read_cadence_ms(np.array([0.2, 0.1]), 6.0).size == 0  # no group starts in range


def test_a_read_burst_before_the_injection_moves_no_total() -> None:
    # ~10 pre-injection intervals a stream (as with 8 recovery intervals), 6 tokens of them read at once
    streams, t_inject, t_first, base = _scenario([40.0, 40.0], decode_ms=6.0, d=4, lead=28, async_depth=2)
    w = analyse_window(streams, t_inject, t_first, base)
    burst = []
    for times in streams:
        t = np.array(times, dtype=np.float64)
        before = np.flatnonzero(t <= t_inject)
        t[before[-8:-2]] = t[before[-3]]  # tokens -8..-3 arrive with the last of them, 5 steps late
        burst.append(t)
    wb = analyse_window(burst, t_inject, t_first, base)
    pre = np.diff(burst[0][16:][burst[0][16:] <= t_inject]) / MS
    assert pre.size >= 8 and np.median(pre) <= 3.0  # the plain p50 of these intervals: half the step
    assert w.pre_p50_ms == wb.pre_p50_ms == pytest.approx(6.0)
    assert wb.total_interference_ms == pytest.approx(w.total_interference_ms, abs=1e-6)


# --- Real windows recorded on an H200 with vLLM 0.22 (tests/fixtures/h200-vllm0.22) -------------

import gzip  # noqa: E402
import json  # noqa: E402

from pdexporter.client.iterlog import summarise_chunks  # noqa: E402
from pdexporter.engines.vllm import parse_step_log as parse_iteration_lines  # noqa: E402
from pdexporter.measure.protocol import StreamTrace  # noqa: E402
from pdexporter.measure.window import ChunkPlan, token_event_index  # noqa: E402
from tests.conftest import FIXTURES  # noqa: E402

H200 = FIXTURES / "h200-vllm0.22"


def _real_window(name: str, baseline_name: str, source: str = "log"):
    """source: "log" (the engine's step log), "schedule" (vLLM's rule, no log) or "none"."""
    raw = json.loads(gzip.open(H200 / name).read())
    base_raw = json.loads(gzip.open(H200 / baseline_name).read())
    base = baseline_stats([StreamTrace.from_raw(p).token_times() for p in base_raw["probes"]])
    traces = [StreamTrace.from_raw(p) for p in raw["probes"]]
    probes = [t.token_times() for t in traces]
    sizes = summarise_chunks(parse_iteration_lines(raw["engine_steps"])).chunk_tokens
    plan = {"log": ChunkPlan(sizes, exact=True), "schedule": ChunkPlan(sizes, exact=False), "none": None}[source]
    events = [token_event_index(t.event_tokens) for t in traces]
    w = analyse_window(probes, 0, raw["t_first_ns"], base, WindowParams(), plan=plan, token_events=events)
    return w, sizes, base


def test_real_long_prefill_chunk_steps_exclude_the_admission_and_retirement_stalls() -> None:
    w, sizes, base = _real_window("B8192_D4_P32768.json.gz", "B8192_D4_baseline.json.gz")
    assert sizes == (8188, 8188, 8188, 8188, 16) and w.num_chunks_actual == 5 == len(
        adapter("vllm").chunk_schedule(32768, 8192, 4)
    )
    assert w.num_chunks_source == "engine-log"
    # the probes saw more slow steps than chunks: the engine stalled admitting and retiring the prompt
    assert w.slow_steps is not None and w.slow_steps >= 6
    steps = w.chunk_step_times_ms
    assert len(steps) == 5
    # the four full chunks grow with their position in the prompt (attention over the prefix) ...
    assert 80 < steps[0] < steps[1] < steps[2] < steps[3] < 500
    # ... and the 16-token tail with the retirement stall is the shortest
    assert steps[4] < steps[0]
    # the penalty weighs each chunk step by its chunk's tokens: the 16-token tail does not count
    assert w.during_p50_ms == pytest.approx(float(np.median(steps[:4])), rel=0.05)
    assert w.total_interference_ms > sum(s - base.p50_ms for s in steps)  # stalls add to the cost


def test_real_small_tail_whose_first_token_leaves_a_step_late() -> None:
    w, sizes, _ = _real_window("B2048_D4_P8192.json.gz", "B2048_D4_baseline.json.gz")
    assert sizes == (2044, 2044, 2044, 2044, 16)
    steps = w.chunk_step_times_ms
    assert len(steps) == 5
    assert all(40 < s < 70 for s in steps[:4])  # four equal full chunks
    assert steps[4] < 20  # the tail, not the retirement step after it


def test_real_window_without_schedule_or_log_uses_the_slow_run() -> None:
    w, _, base = _real_window("B8192_D4_P32768.json.gz", "B8192_D4_baseline.json.gz", source="none")
    assert w.num_chunks_source == "slow-steps" and w.num_chunks_actual == w.slow_steps
    assert w.num_chunks_actual > 5  # the stalls are counted as chunks without log or schedule
    assert w.during_p50_ms > 5 * base.p50_ms


@pytest.mark.parametrize("name", ["B8192_D4_P32768", "B2048_D4_P8192"])
def test_real_window_located_by_the_schedule_equals_the_engine_log(name: str) -> None:
    """Without the log, vLLM's chunk schedule (confirmed by the cadence) locates the same steps."""
    baseline_name = name.rsplit("_P", 1)[0] + "_baseline.json.gz"
    logged, _, _ = _real_window(name + ".json.gz", baseline_name, source="log")
    guessed, sizes, _ = _real_window(name + ".json.gz", baseline_name, source="schedule")
    assert guessed.num_chunks_source == "cadence" and guessed.chunk_schedule_check == "confirmed"
    assert guessed.chunk_step_times_ms == logged.chunk_step_times_ms
    assert guessed.during_p50_ms == logged.during_p50_ms
    # what the cadence saw: never more than the schedule, and counted from slow steps only
    assert guessed.num_chunks_actual == guessed.num_chunks_seen <= len(sizes)


def test_a_schedule_the_cadence_contradicts_is_not_used() -> None:
    """A wrong chunk size (2048 where the engine ran 8192) predicts 17 chunks; the probes saw 6-7
    slow steps, so the schedule is rejected and the slow run is used."""
    raw = json.loads(gzip.open(H200 / "B8192_D4_P32768.json.gz").read())
    base_raw = json.loads(gzip.open(H200 / "B8192_D4_baseline.json.gz").read())
    base = baseline_stats([StreamTrace.from_raw(p).token_times() for p in base_raw["probes"]])
    probes = [StreamTrace.from_raw(p).token_times() for p in raw["probes"]]
    wrong = ChunkPlan(tuple([2044] * 16 + [64]), exact=False)
    w = analyse_window(probes, 0, raw["t_first_ns"], base, WindowParams(), plan=wrong)
    assert w.chunk_schedule_check == "contradicted" and w.num_chunks_source == "slow-steps"


def test_weighted_percentile_is_numpys_median_with_equal_weights() -> None:
    from pdexporter.measure.window import weighted_percentile

    for values in ([3.0], [1.0, 9.0], [5.0, 1.0, 7.0], [2.0, 4.0, 6.0, 100.0]):
        assert weighted_percentile(np.array(values), np.ones(len(values)), 50) == pytest.approx(np.median(values))
    # a tiny-weight value (a 1-token tail) barely moves the median of a big chunk's step
    assert weighted_percentile(np.array([46.5, 3.1]), np.array([2047.0, 1.0]), 50) == pytest.approx(46.5, abs=0.05)
    assert weighted_percentile(np.empty(0), np.empty(0), 50) is None


def test_a_merged_event_counts_as_one_chunk_step() -> None:
    """After a stall the engine may hand the tokens it made meanwhile over in one event together
    with the last chunk's token; spread over its gap that event would hide the chunk step."""
    from pdexporter.measure.window import token_event_index

    decode, chunks = 6.0, [80.0, 230.0, 330.0, 420.0, 43.0]
    gaps = [decode] * 40 + chunks[:-1]
    times = list(np.cumsum(gaps) * MS)
    last = times[-1] + chunks[-1] * MS
    event_times = [*times, last, last + 2 * MS, last + 8 * MS, *(last + 8 * MS + np.arange(1, 40) * decode * MS)]
    event_tokens = [1] * len(times) + [6, 1, 1] + [1] * 39  # the last chunk's token + 5 made during the stall
    t_first = int(last)
    streams = [token_times(event_times, event_tokens)]
    events = [token_event_index(event_tokens)]
    base = baseline_stats(timeline([decode] * 256, 1))
    sizes = (8188, 8188, 8188, 8188, 16)
    plan = ChunkPlan(sizes, exact=True)
    merged = analyse_window(streams, int(times[39]) + 1, t_first, base, plan=plan, token_events=events)
    assert merged.chunk_step_times_ms == pytest.approx(tuple(chunks))
    spread = analyse_window(streams, int(times[39]) + 1, t_first, base, plan=plan)
    assert spread.chunk_step_times_ms != pytest.approx(tuple(chunks))  # per-token spreading loses them


def test_a_schedule_of_fewer_chunks_than_the_engine_ran_is_contradicted() -> None:
    """The restart the audit found: vLLM ran 2048 (four chunks of P = 8192, real H200 timestamps) while
    pdexporter assumed 8192 (one chunk). The one chunk step located was slow, and the three other
    chunks passed as admission stalls (at most 4 allowed); as slow as the located chunk step, they are
    chunks the schedule lacks. A production prefill (`beside_traffic`) has other requests' chunks
    beside it, so there they say nothing."""
    raw = json.loads(gzip.open(H200 / "B2048_D4_P8192.json.gz").read())
    base_raw = json.loads(gzip.open(H200 / "B2048_D4_baseline.json.gz").read())
    base = baseline_stats([StreamTrace.from_raw(p).token_times() for p in base_raw["probes"]])
    probes = [StreamTrace.from_raw(p).token_times() for p in raw["probes"]]
    assumed = ChunkPlan((8188, 4), exact=False)
    w = analyse_window(probes, 0, raw["t_first_ns"], base, WindowParams(), plan=assumed)
    assert w.chunk_schedule_check == "contradicted" and w.num_chunks_source == "slow-steps"
    assert w.slow_steps >= 4
    beside = analyse_window(probes, 0, raw["t_first_ns"], base, WindowParams().beside_traffic(), plan=assumed)
    assert beside.chunk_schedule_check == "confirmed"
    # the engine's own size is still confirmed under the stricter check
    right = analyse_window(probes, 0, raw["t_first_ns"], base, WindowParams(),
                           plan=ChunkPlan((2044, 2044, 2044, 2044, 16), exact=False))
    assert right.chunk_schedule_check == "confirmed"
