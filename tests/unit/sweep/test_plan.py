"""Attempts, CV re-runs and the record they produce; run-time estimates for the deadline."""

from __future__ import annotations

import pytest

from pdexporter.measure.records import (
    BaselineBlock,
    DerivedBlock,
    InterferenceBlock,
    RecordConfig,
    RepRecord,
)
from pdexporter.sweep.plan import RunTimes, config_status, summarise_attempts
from pdexporter.sweep.spec import CvSpec

CV = CvSpec(threshold=0.15, max_reruns=1)


def rep(i: int, penalty: float | None, prefill_ms: float = 100.0) -> RepRecord:
    return RepRecord(
        rep=i,
        baseline=BaselineBlock(tpot_p50_ms=10.0, tpot_p90_ms=11.0, tpot_p99_ms=12.0, step_time_ms=10.0),
        interference=InterferenceBlock(
            tpot_during_prefill_p50_ms=None if penalty is None else 10 + penalty,
            tpot_during_prefill_p90_ms=None,
            tpot_during_prefill_mean_ms=None if penalty is None else 10 + penalty,
            tpot_after_prefill_p50_ms=10.0,
            num_chunks_actual=1,
            prefill_duration_ms=prefill_ms,
            prefill_ttft_ms=prefill_ms,
        ),
        derived=DerivedBlock(
            tpot_penalty_ms=penalty,
            tpot_penalty_p50_ms=penalty,
            tpot_penalty_ratio=None if penalty is None else penalty / 10,
            total_interference_ms=penalty,
            decode_tokens_delayed=4,
        ),
    )


CONFIG = RecordConfig(decode_batch_size=4, new_prefill_tokens=8192, chunk_size=8192, model="m", gpu="g")
STEADY = [20.0, 21.0, 19.0, 20.5, 19.5]
NOISY = [20.0, 40.0, 10.0, 30.0, 20.0]


def test_nothing_recorded_needs_one_attempt() -> None:
    st = config_status([], 5, CV)
    assert st.target_reps == 5 and st.reps_to_run == 5 and not st.complete


def test_a_partial_attempt_is_completed() -> None:
    st = config_status([rep(i, p) for i, p in enumerate(STEADY[:3])], 5, CV)
    assert st.target_reps == 5 and st.reps_to_run == 2


def test_low_cv_is_complete() -> None:
    st = config_status([rep(i, p) for i, p in enumerate(STEADY)], 5, CV)
    assert st.complete and not st.flagged and st.cv_by_attempt[0] < 0.15


def test_high_cv_reruns_then_flags() -> None:
    first = [rep(i, p) for i, p in enumerate(NOISY)]
    st = config_status(first, 5, CV)
    assert st.target_reps == 10 and st.cv_by_attempt[0] > 0.15
    second_noisy = first + [rep(5 + i, p) for i, p in enumerate(NOISY)]
    st = config_status(second_noisy, 5, CV)
    assert st.complete and st.flagged and st.complete_attempts == 2
    second_steady = first + [rep(5 + i, p) for i, p in enumerate(STEADY)]
    st = config_status(second_steady, 5, CV)
    assert st.complete and not st.flagged


def test_no_reruns_allowed_flags_at_once() -> None:
    st = config_status([rep(i, p) for i, p in enumerate(NOISY)], 5, CvSpec(threshold=0.15, max_reruns=0))
    assert st.complete and st.flagged


def test_d0_uses_the_prefill_duration() -> None:
    st = config_status([rep(i, None, prefill_ms=ms) for i, ms in enumerate([100, 300, 50, 200, 100])], 5, CV)
    assert st.target_reps == 10
    st = config_status([rep(i, None, prefill_ms=ms) for i, ms in enumerate([100, 101, 99, 100, 100])], 5, CV)
    assert st.complete


def test_record_keeps_every_rep_and_aggregates_the_last_attempt() -> None:
    reps = [rep(i, p) for i, p in enumerate(NOISY)] + [rep(5 + i, p) for i, p in enumerate(STEADY)]
    record = summarise_attempts(CONFIG, reps, 5, CV)
    assert [r.rep for r in record.reps] == list(range(10))
    assert record.derived.tpot_penalty_ms == pytest.approx(20.0)  # median of STEADY
    s = record.summary.model_dump()
    assert s["aggregated_reps"] == [5, 6, 7, 8, 9] and s["attempts"] == 2 and s["rerun"] is True
    assert s["flagged"] is False and s["cv_threshold"] == 0.15 and len(s["cv_by_attempt"]) == 2
    assert s["cv_by_attempt"][0] > 0.15 > s["cv_by_attempt"][1]
    assert record.config.reps_planned == 5


def test_estimates_err_long_and_scale_with_p() -> None:
    times = RunTimes()
    assert times.estimate("rep", (8192, 4, 512)) > 0  # a default before anything was seen
    times.observe("rep", (8192, 4, 512), 0.2)
    times.observe("rep", (8192, 4, 2048), 0.4)
    assert times.estimate("rep", (8192, 4, 2048)) == pytest.approx(0.6)
    assert times.estimate("rep", (8192, 8, 2048)) == pytest.approx(0.6)  # same P, other D
    assert times.estimate("rep", (8192, 4, 8192)) == pytest.approx(1.5 * 0.4 * 4)  # scaled by P
    times.observe("engine_start", (8192,), 100.0)
    assert times.estimate("engine_start", (2048,)) == pytest.approx(150.0)
