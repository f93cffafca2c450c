"""measure_point, unchanged, on the embedded engine in virtual time (SimDriver, no HTTP)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.measure.driver import EngineDriver
from pdexporter.measure.point import PointSpec, measure_point
from pdexporter.measure.protocol import ProtocolSettings, run_baseline, warm_prefix
from pdexporter.measure.sim_driver import SimDriver
from pdexporter.measure.store import ResultsStore

pytestmark = pytest.mark.integration

SETTINGS = ProtocolSettings()


def test_sim_driver_is_an_engine_driver_and_says_it_is_modelled():
    async def main() -> SimDriver:
        async with SimDriver.create(profile="h20-qwen3-coder-30b-a3b", chunk_size=4096) as driver:
            return driver

    driver = run_virtual(main())
    assert isinstance(driver, EngineDriver)
    info = driver.info
    assert (info.kind, info.modelled, info.clock) == ("pdexporter-sim", True, "virtual")
    assert (info.gpu, info.profile, info.chunk_size) == ("H20", "h20-qwen3-coder-30b-a3b", 4096)
    assert info.note and "MODELLED" in info.note


@pytest.mark.parametrize("d", [1, 4, 12])
def test_baseline_tpot_is_the_modelled_decode_step(d: int):
    async def main() -> tuple[float, float, float]:
        async with SimDriver.create(chunk_size=8192) as driver:
            await warm_prefix(driver, SETTINGS)
            run = await run_baseline(driver, d, SETTINGS)
            assert run.stats is not None
            # probes' context over the measured tokens: 4096 + 16 ... 4096 + 256
            lo = driver.modelled_decode_step_ms(d, 4096 + 16)
            hi = driver.modelled_decode_step_ms(d, 4096 + 256)
            return run.stats.p50_ms, lo, hi

    p50, lo, hi = run_virtual(main())
    assert lo <= p50 <= hi
    assert p50 == pytest.approx((lo + hi) / 2, rel=0.02)


# On the H200 (vLLM 0.22, 1,505 repetitions with D > 0), the probes' slow steps minus the engine
# log's chunks: -1 in 1 %, 0 in 42 %, +1 in 25 %, +2 in 26 %, +3 in 6 %. The launch of the first
# chunk holds back the decode step before it (one slow step more), a tail chunk that runs about as
# fast as a decode step is not slow (one less). The embedded engine models both, so its cadence
# is checked against that range, and the chunk count itself against the engine log.
CADENCE_MINUS_CHUNKS = range(-1, 4)


@pytest.mark.parametrize("b", [2048, 8192])
@pytest.mark.parametrize("p", [2048, 8192, 32768])
@pytest.mark.parametrize("d", [4, 12])
def test_num_chunks_actual_is_ceil_p_over_b_minus_d(tmp_path: Path, b: int, d: int, p: int):
    """The must-show: num_chunks_actual (from the engine's iteration log) = ceil(P / (B - D)), and
    the window maths locates exactly that many chunk steps in the probes' intervals."""
    async def main():
        async with SimDriver.create(chunk_size=b) as driver:
            await warm_prefix(driver, SETTINGS)
            return await measure_point(driver, PointSpec(b, d, p), SETTINGS, ResultsStore(tmp_path), reps=2)

    record = run_virtual(main())
    expected = math.ceil(p / (b - d))
    assert record.interference.num_chunks_expected == expected
    assert record.interference.num_chunks_engine_log == expected
    assert record.interference.num_chunks_actual == expected
    assert record.interference.num_chunks_source == "engine-log"
    assert record.interference.slow_steps - expected in CADENCE_MINUS_CHUNKS  # the cadence, as on the H200
    for rep in record.reps:
        assert rep.interference.num_chunks_actual == expected
        assert rep.interference.slow_steps - expected in CADENCE_MINUS_CHUNKS
        assert len(rep.interference.chunk_step_times_ms) == expected
        assert rep.interference.chunk_tokens_engine_log[:-1] == [b - d] * (expected - 1)
        assert sum(rep.interference.chunk_tokens_engine_log) == p
    assert record.derived.tpot_penalty_ms > 0
    assert (tmp_path / str(b) / f"D{d}_P{p}.json").exists()


def test_records_say_they_are_modelled(tmp_path: Path):
    async def main():
        async with SimDriver.create(chunk_size=8192) as driver:
            await warm_prefix(driver, SETTINGS)
            return await measure_point(driver, PointSpec(8192, 2, 4096), SETTINGS, ResultsStore(tmp_path), reps=1)

    record = run_virtual(main())
    c = record.config
    assert c.modelled is True and c.engine == "pdexporter-sim" and "MODELLED" in (c.note or "")
    assert c.profile == "h200-qwen3-coder-30b-a3b" and c.gpu == "H200"
    on_disk = ResultsStore(tmp_path).load_record(8192, 2, 4096)
    assert on_disk is not None and on_disk.config.modelled and on_disk.config.note == c.note
    # the engine's own counters moved as vLLM's would over the window
    metrics = record.reps[0].engine_metrics
    assert metrics["prompt_tokens_total_delta"] == 4096
    assert metrics["prefix_cache_hits_total_delta"] == 0  # a cold prefill


def test_a_known_blind_spot_a_one_token_tail_runs_as_a_decode_batch(tmp_path: Path):
    """B=2048, D=1, P=2048: chunks 2047 + 1. The 1-token tail is a uniform decode batch (full CUDA
    graph in vLLM 0.22), barely slower than a decode step: the engine log sees 2 chunks (so does
    num_chunks_actual, which takes the log when it can), the cadence sees 2 slow steps, the
    2047-token chunk and the decode step its launch held back, not the tail: what the H200 sweep
    recorded for this configuration (slow_steps 2 in all its repetitions). Physically right, and
    reported, not tuned away."""

    async def main():
        async with SimDriver.create(chunk_size=2048) as driver:
            await warm_prefix(driver, SETTINGS)
            return await measure_point(driver, PointSpec(2048, 1, 2048), SETTINGS, ResultsStore(tmp_path), reps=1)

    record = run_virtual(main())
    assert record.interference.chunk_tokens_engine_log == [2047, 1]
    assert record.interference.num_chunks_engine_log == 2 == record.interference.num_chunks_actual
    assert record.interference.slow_steps == 2
    chunk, tail = record.interference.chunk_step_times_ms
    assert tail < record.interference.slow_step_threshold_ms < chunk


def test_the_same_driver_runs_in_real_time_on_a_normal_loop():
    import asyncio
    import time

    async def main():
        async with SimDriver.create(chunk_size=8192) as driver:
            stream = driver.start(driver.prepare(list(range(1000, 1064)), 3, "probe"))
            await driver.progress.wait_until(lambda: stream.done, 10)
            return driver.info.clock, stream, [s for s in driver.engine.history if s.num_tokens > 0]

    t0 = time.perf_counter_ns()
    clock, stream, steps = asyncio.run(main())
    wall_ns = time.perf_counter_ns() - t0
    assert clock == "monotonic" and stream.n_tokens == 3 and stream.finish_reason == "length"
    # Real time: each token reaches the stream on the wall clock no earlier than the modelled end of
    # the step that produced it (the prefill, then two decode steps of real milliseconds). A loaded
    # machine can only deliver later; single gaps between tokens say nothing (a late delivery makes
    # the next gap short), so they are not asserted.
    assert len(steps) == 3 and all(s.duration_s > 1e-3 for s in steps)
    for event_ns, step in zip(stream.event_times_ns, steps):
        assert event_ns >= step.t_end * 1e9 - 1e3, (event_ns, step)
    assert stream.event_times_ns[-1] - stream.event_times_ns[0] <= wall_ns


def test_create_outside_a_loop_says_what_to_do():
    with pytest.raises(RuntimeError, match="run_virtual"):
        SimDriver.create()
