"""The window maths on the offloaded arm: a request admitted with its KV in one 1-token step
(`engines.disagg.admission_schedule`), found in the log or checked against the cadence."""

from __future__ import annotations

import numpy as np
import pytest

from pdexporter.engines import adapter
from pdexporter.measure.window import ChunkPlan, analyse_window, baseline_stats, derive

MS = 1_000_000


def timeline(step_ms: list[float], streams: int, skew_ns: int = 20_000) -> list[np.ndarray]:
    ends = np.cumsum(np.asarray(step_ms) * MS)
    return [ends + i * skew_ns for i in range(streams)]


def scenario(admission_ms: float, *, wait_steps: int = 0, decode_ms: float = 6.0, d: int = 4):
    """Decode steps; the request reaches the decode instance mid-step; `wait_steps` decode steps pass
    while its KV arrives (NixlConnector); then the one admission step, whose first token leaves
    with it; then decode steps."""
    lead, tail = 60, 60
    steps = [decode_ms] * (lead + 1 + wait_steps) + [admission_ms] + [decode_ms] * tail
    streams = timeline(steps, d)
    ends = np.cumsum(np.asarray(steps) * MS)
    t_inject = int(ends[lead - 1] - decode_ms * MS / 2)
    t_first = int(ends[lead + wait_steps + 1] + 50_000)
    return streams, t_inject, t_first, baseline_stats(timeline([decode_ms] * 256, d))


@pytest.mark.parametrize("engine", ["vllm-decode-bench", "vllm-pd-decode", "pdexporter-sim-pd-decode"])
def test_the_offloaded_schedule_is_one_step_of_one_token(engine: str) -> None:
    assert adapter(engine).chunk_schedule(32768, 8192, 12) == (1,)
    assert adapter(engine).kv.arm == "offloaded"
    assert adapter("vllm").chunk_schedule(32768, 8192, 12) == (8180, 8180, 8180, 8180, 48)
    with pytest.raises(ValueError, match="no budget|whole step budget"):
        adapter(engine).chunk_schedule(2048, 8, 8)


def test_a_slow_admission_step_is_located_and_confirmed_by_the_cadence() -> None:
    streams, t_inject, t_first, base = scenario(9.5, wait_steps=3)
    w = analyse_window(streams, t_inject, t_first, base, plan=ChunkPlan((1,), exact=False))
    assert w.chunk_schedule_check == "confirmed" and w.num_chunks_source == "cadence"
    assert w.num_chunks_actual == w.num_chunks_seen == 1
    assert w.chunk_step_times_ms == pytest.approx((9.5,))
    assert w.during_p50_ms == pytest.approx(9.5)
    assert derive(base, w, 4).tpot_penalty_p50_ms == pytest.approx(3.5)
    # the window holds the transfer wait too: t_inject is the request reaching the decode instance
    assert w.window_intervals == 4 * (2 + 3 + 1)  # the interrupted step, one scheduled before, 3 waiting, admission


def test_an_admission_that_costs_nothing_does_not_contradict_the_schedule() -> None:
    streams, t_inject, t_first, base = scenario(6.0, wait_steps=2)
    w = analyse_window(streams, t_inject, t_first, base, plan=ChunkPlan((1,), exact=False))
    # a 1-token step runs like a decode step: not seeing it slow is no contradiction
    assert w.chunk_schedule_check == "confirmed" and w.num_chunks_source == "cadence"
    assert w.num_chunks_seen == 0 and w.num_chunks_actual == 0
    assert derive(base, w, 4).tpot_penalty_p50_ms == pytest.approx(0.0, abs=1e-9)


def test_the_engine_log_gives_the_admission_step_exactly() -> None:
    streams, t_inject, t_first, base = scenario(7.5, wait_steps=1)
    w = analyse_window(streams, t_inject, t_first, base, plan=ChunkPlan((1,), exact=True))
    assert w.num_chunks_source == "engine-log" and w.chunk_schedule_check is None
    assert w.num_chunks_actual == 1 and w.chunk_step_times_ms == pytest.approx((7.5,))


def test_a_prefill_chunk_schedule_is_still_checked_as_before() -> None:
    # a 2048-token chunk that shows no slow step contradicts the schedule (the colocated arm's rule)
    streams, t_inject, t_first, base = scenario(6.0)
    w = analyse_window(streams, t_inject, t_first, base, plan=ChunkPlan((2048,), exact=False))
    assert w.chunk_schedule_check == "contradicted" and w.num_chunks_source == "slow-steps"
