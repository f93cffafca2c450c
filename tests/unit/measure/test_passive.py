"""Passive windows' pure parts (`measure.passive`): steps from probe events, runs of slow steps,
attribution from traces and /metrics, the cadence estimate, binning."""

from __future__ import annotations

import numpy as np
import pytest

from pdexporter.client.metrics import MetricsSnapshot
from pdexporter.measure.passive import (
    D_BINS,
    P_BINS,
    RequestPrefill,
    SlowRun,
    attribute_metrics,
    attribute_traces,
    bin_int,
    cadence_prompt_tokens,
    log_bin,
    probe_steps,
    running_decodes,
    slow_runs,
)

MS = 1_000_000


def streams_of(steps_ms: list[float], n: int = 4, jitter_ms: float = 0.2, t0: float = 1e9,
               merged: dict[int, int] | None = None) -> list[tuple[list[int], list[int]]]:
    """Every stream gets one token at the end of every step (stream k `k * jitter` late); `merged`
    maps a step index to a stream that receives that step's token as a second event at the same time."""
    ends = t0 + np.cumsum(np.asarray(steps_ms) * MS)
    out = []
    for k in range(n):
        times = [int(e + k * jitter_ms * MS) for e in ends]
        tokens = [1] * len(times)
        for step, stream in (merged or {}).items():
            if stream == k:
                times.insert(step + 1, times[step])
                tokens.insert(step + 1, 1)
        out.append((times, tokens))
    return out


def test_steps_are_the_clusters_of_the_probes_arrivals() -> None:
    steps_ms = [6.0] * 40 + [50.0] + [6.0] * 20
    steps = probe_steps(streams_of(steps_ms, jitter_ms=0.3), 6.0, warmup_tokens=16)
    # intervals past the warm-up: both ends at token index >= 16, i.e. from step 17 on
    assert len(steps) == len(steps_ms) - 17
    durations = [s.duration_ms for s in steps]
    assert durations.count(pytest.approx(50.0)) == 1
    assert all(d == pytest.approx(6.0) for d in durations if d < 40)
    assert all(s.streams == 4 for s in steps)
    assert all(s.last_ns >= s.end_ns for s in steps)


def test_two_events_of_one_step_count_as_one_interval() -> None:
    # stream 0 gets the slow step's token as two events at once (two emissions read together)
    steps_ms = [6.0] * 30 + [55.0] + [6.0] * 10
    steps = probe_steps(streams_of(steps_ms, merged={30: 0}), 6.0, warmup_tokens=16)
    slow = [s for s in steps if s.duration_ms > 20]
    assert len(slow) == 1 and slow[0].duration_ms == pytest.approx(55.0, abs=0.5)


def test_since_and_tokens_before_select_what_is_new() -> None:
    streams = streams_of([6.0] * 60)
    since = streams[3][0][40]  # the last arrival of step 40: intervals ending after it are new
    steps = probe_steps(streams, 6.0, since_ns=since)
    assert len(steps) == 19 and all(s.end_ns > since for s in steps)
    # the same streams given from event 30 on, with the 30 tokens before them said
    tails = [(t[30:], n[30:]) for t, n in streams]
    again = probe_steps(tails, 6.0, since_ns=since, tokens_before=[30] * 4)
    assert [s.end_ns for s in again] == [s.end_ns for s in steps]
    # without them the warm-up would swallow the tails' first intervals
    assert len(probe_steps(tails, 6.0)) == 30 - 17


def test_slow_runs_bridge_one_normal_step_and_know_when_they_are_closed() -> None:
    steps_ms = [6.0] * 30 + [60.0, 200.0, 6.0, 30.0] + [6.0] * 5 + [40.0] + [6.0] * 1
    steps = probe_steps(streams_of(steps_ms), 6.0, warmup_tokens=0)
    runs = slow_runs(steps, threshold_ms=9.0, bridge_steps=1)
    assert len(runs) == 2
    first, second = runs
    assert first.slow_steps == 3 and len(first.steps_ms) == 4  # 60, 200, (6), 30
    assert first.closed and first.excess_ms(6.0) == pytest.approx(54 + 194 + 24, abs=0.5)
    assert first.start_ns == pytest.approx(steps[28].end_ns)  # the last normal step before it
    assert second.slow_steps == 1 and second.steps_after == 1 and not second.closed
    with_gap = slow_runs(steps, threshold_ms=9.0, bridge_steps=0)
    assert [r.slow_steps for r in with_gap] == [2, 1, 1]


def test_a_run_at_the_start_of_the_data_is_dropped() -> None:
    steps = probe_steps(streams_of([50.0, 50.0] + [6.0] * 10), 6.0, warmup_tokens=0)
    assert slow_runs(steps, 9.0) == []


def _run(start_ms: float, end_ms: float) -> SlowRun:
    return SlowRun(start_ms * MS, end_ms * MS, (50.0,), 1, 5)


def test_traces_attribute_the_requests_whose_first_token_fell_in_the_run() -> None:
    run = _run(100, 160)
    requests = [RequestPrefill("a", 700, 90 * MS), RequestPrefill("b", 3000, 158 * MS),
                RequestPrefill("c", 900, 165 * MS), RequestPrefill("d", 20, 400 * MS)]
    got = attribute_traces(run, requests, tolerance_ns=6 * MS)
    assert got is not None and got.source == "otlp"
    assert got.request_ids == ("b", "c") and got.prompt_tokens == 3900 and got.prefills == 2 and not got.single
    one = attribute_traces(run, requests, tolerance_ns=1 * MS)
    assert one is not None and one.single and one.prompt_tokens == 3000
    assert attribute_traces(_run(200, 300), requests, 1 * MS) is None


def _snap(prompt: float | None, firsts: float | None, running: float = 6) -> MetricsSnapshot:
    values = {"num_requests_running": running}
    if prompt is not None:
        values["prompt_tokens_total"] = prompt
    if firsts is not None:
        values["time_to_first_token_seconds_count"] = firsts
    return MetricsSnapshot(values)


def test_metrics_attribute_the_counters_rise_less_the_exporters_own_restarts() -> None:
    before, after = _snap(10_000, 40), _snap(10_000 + 2500 + 4096, 42)
    got = attribute_metrics(before, after, own_prefills=1, own_prompt_tokens=4096)
    assert got is not None and got.source == "metrics" and got.prompt_tokens == 2500 and got.single
    assert attribute_metrics(before, _snap(10_000 + 4096, 41), 1, 4096) is None  # only our probe
    assert attribute_metrics(before, _snap(5, 1), 0, 0) is None  # counters went down: a restart
    assert attribute_metrics(_snap(None, 40), after, 0, 0) is None  # a counter missing


def test_running_decodes_leave_out_the_prefills_and_never_drop_below_the_probes() -> None:
    assert running_decodes(9, 1, 4) == 8
    assert running_decodes(3, 1, 4) == 4
    assert running_decodes(None, 1, 4) == 4


def test_cadence_estimate_inverts_the_model_and_takes_the_middle_of_a_flat_stretch() -> None:
    def model(p: int) -> float:  # ms: flat (launch-bound) up to 2000 tokens, then growing
        return 50.0 if p <= 2000 else 50.0 + 0.02 * (p - 2000)

    assert cadence_prompt_tokens(50.0 + 0.02 * 4000, model, 16376) == pytest.approx(6000, rel=0.03)
    middle = cadence_prompt_tokens(50.0, model, 16376)
    assert middle is not None and 20 < middle < 2000  # anything up to 2000 explains it: the middle
    assert cadence_prompt_tokens(10_000.0, model, 16376) == 16376  # more than the largest: capped
    assert cadence_prompt_tokens(0.0, model, 16376) is None


@pytest.mark.parametrize("value, expected", [
    (512, 512), (400, 512), (363, 512), (362, 256), (724, 512), (725, 1024),
    (90, None), (128, 128), (130_000, 131072), (190_000, None), (0, None),
])
def test_prompt_bins_are_log_scale_around_powers_of_two(value: float, expected: int | None) -> None:
    assert bin_int(value, P_BINS) == expected


def test_log_bins_of_an_uneven_grid() -> None:
    grid = [0, 1, 2, 4, 6, 8, 12]
    assert log_bin(0, grid) == 0
    assert log_bin(3, grid) == 4  # sqrt(2 * 4) = 2.83
    assert log_bin(5, grid) == 6  # sqrt(4 * 6) = 4.90
    assert log_bin(14, grid) == 12 and log_bin(15, grid) is None  # 12 * sqrt(12 / 8) = 14.7
    assert log_bin(0.7, grid) is None  # below 1 / sqrt(2)
    assert bin_int(0, D_BINS) is None  # no 0 in the exporter's D bins
    assert all(bin_int(d, D_BINS) == d for d in D_BINS)
    assert log_bin(2.82, [2, 4]) == 2 and log_bin(2.83, [2, 4]) == 4
