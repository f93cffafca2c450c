"""`pdexporter sweep` against a misbehaving engine (ScriptedEngine, a TEST DOUBLE): a window spoiled
by the engine is run again with fresh probes (and, retries used up, its configuration skipped while
the others go on); an engine that is not there or rejects the requests stops the sweep in one line;
nothing a fault spoiled is recorded."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.integration.faults.faultkit import B, D, P, error_line, foreign_stream, most_beside, record, sweep
from tests.scripted_engine import Fault, ScriptedEngine

pytestmark = pytest.mark.integration

CADENCE = 0.01
WINDOW_PREFILL = 2  # prefill-role requests before the first window's: the prefix and shape warm-ups
WINDOW_PROBES = 2  # probe requests before the first window's: Phase 1's D streams


def _results(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.mark.parametrize("fault", [
    Fault("http-500", on="prefill", skip=WINDOW_PREFILL),
    Fault("close-mid-stream", on="probe", skip=WINDOW_PROBES, at_token=40),
    Fault("malformed-sse", on="probe", skip=WINDOW_PROBES, at_token=40),
    Fault("restart", on="prefill", skip=WINDOW_PREFILL),
], ids=lambda f: f.kind)
async def test_a_window_the_engine_spoiled_once_is_run_again(fault: Fault, tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await sweep(engine, tmp_path)
    assert code == 0, err[-3000:]
    assert fault.hits == 1 and "retrying" in err
    rec = record(_results(tmp_path))
    assert len(rec["reps"]) == 1 and rec["reps"][0]["retries"] == 1  # the clean attempt, and that it was a re-run
    raw_retries = json.loads((_results(tmp_path) / "sweep.json").read_text())["invocations"][-1]
    assert raw_retries["chunks"][str(B)]["retries"] == 1
    # counters that went down across a restart give no (negative) deltas
    assert all(v >= 0 for k, v in rec["reps"][0]["engine_metrics"].items() if k.endswith("_delta"))


@pytest.mark.parametrize("fault", [
    Fault("close-mid-stream", on="probe", at_token=20),  # a reset of a Phase 1 stream
    Fault("stall", on="probe", at_token=20),  # a Phase 1 stream goes silent
], ids=lambda f: f.kind)
async def test_a_fault_in_phase_1_runs_phase_1_again(fault: Fault, tmp_path: Path) -> None:
    """Issue 24: one reset or stall in Phase 1 aborted the whole sweep (exit 3/4) where Phase 2
    retried; now Phase 1 is run again with fresh probes, as often as `retries`."""
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, took = await sweep(engine, tmp_path, "--read-timeout", "2s")
    assert code == 0, err[-3000:]
    assert fault.hits == 1 and f"B={B} D={D} Phase 1: " in err and "retrying" in err
    assert len(record(_results(tmp_path))["reps"]) == 1
    state = json.loads((_results(tmp_path) / "sweep.json").read_text())["invocations"][-1]
    assert state["chunks"][str(B)]["retries"] == 1 and took < 90


async def test_a_stall_inside_the_window_fails_it_quickly_and_it_is_run_again(tmp_path: Path) -> None:
    fault = Fault("freeze", on="prefill", skip=WINDOW_PREFILL, seconds=4.0)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, took = await sweep(engine, tmp_path, protocol={
            "decode_context_tokens": 64, "decode_output_tokens": 160, "stall_timeout_s": 1.5})
    assert code == 0, err[-3000:]
    assert "the engine stalled" in err and "no token for 1.5 s" in err and "retrying" in err
    assert took < 90


async def test_a_persistent_fault_skips_the_configuration_after_its_retries(tmp_path: Path) -> None:
    fault = Fault("wrong-prompt-tokens", on="prefill", skip=WINDOW_PREFILL, times=None)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await sweep(engine, tmp_path, retries=1)
    assert code == 4  # incomplete: rerun to try again
    assert f"usage.prompt_tokens={P + 1}" in err and f"the {P} token ids sent" in err
    assert f"B={B} D={D} P={P}" in err and "skipped after 1 retries" in err
    assert fault.hits == 2  # one attempt and one retry, nothing more
    assert not (_results(tmp_path) / str(B) / f"D{D}_P{P}.json").exists()


@pytest.mark.parametrize("metrics", ["garbage", "html-404"])
async def test_a_broken_engine_metrics_endpoint_does_not_stop_the_sweep(metrics: str, tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, metrics=metrics) as engine:
        code, err, _ = await sweep(engine, tmp_path)
    assert code == 0, err[-3000:]
    assert record(_results(tmp_path))["reps"][0]["engine_metrics"] == {}


async def test_a_slow_health_endpoint_only_slows_the_start(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, health_delay_s=2.0) as engine:
        code, err, _ = await sweep(engine, tmp_path)
    assert code == 0, err[-3000:]


async def test_requests_the_engine_rejects_stop_the_sweep_in_one_line(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, faults=[Fault("html-404", times=None)]) as engine:
        code, err, _ = await sweep(engine, tmp_path)
    assert code == 3
    line = error_line(err)
    assert "HTTP 404" in line and "<html" not in line.lower()
    assert engine.completion_calls == 1  # 4xx: not retried, not repeated for every configuration


async def test_an_engine_that_is_not_there_stops_the_sweep_in_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    engine = ScriptedEngine()
    engine.url = url
    code, err, took = await sweep(engine, tmp_path)
    assert code == 3
    assert f"cannot connect to {url}" in error_line(err)
    assert took < 60


async def test_a_prefill_longer_than_max_model_len_is_refused_before_the_warm_up(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, max_model_len=60) as engine:
        code, err, _ = await sweep(engine, tmp_path)
    assert code == 2
    assert (f"grid.new_prefill_tokens {P}: {P} prompt tokens + 1 output token(s) exceed the engine's max_model_len 60"
            in error_line(err))
    assert engine.completion_calls == 0


# --- a re-run never runs beside its failed attempt (issue 31) -------------------------------------

@pytest.mark.parametrize("fault", [
    Fault("http-500", on="prefill", skip=WINDOW_PREFILL),
    Fault("stall", on="prefill", skip=WINDOW_PREFILL, at_token=0),  # the injected prefill: no first token
    Fault("stall", on="probe", skip=WINDOW_PROBES, at_token=40),  # a window probe goes silent
], ids=lambda f: f"{f.kind}-{f.on}")
async def test_a_rerun_never_runs_beside_the_failed_attempt_and_is_not_kept(fault: Fault, tmp_path: Path) -> None:
    """Issue 31: the failed window's probes decoded on beside the re-run, and the sweep kept it
    with "at injection the engine ran 4 ... (expected 2 and 0)"."""
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await sweep(engine, tmp_path, "--read-timeout", "2s")
    assert code == 0 and fault.hits == 1 and "retrying" in err, err[-3000:]
    assert "at injection the engine ran" not in err, err[-3000:]
    assert most_beside(engine, "probe") <= D - 1
    assert engine.arrivals[-1] == ("prefill", D)  # the kept window's prefill: beside exactly D probes
    rep = record(_results(tmp_path))["reps"][0]
    assert rep["retries"] == 1 and rep["engine_metrics"]["num_requests_running"] == D


async def test_an_engine_that_never_frees_up_is_one_line_after_a_bounded_wait(tmp_path: Path) -> None:
    """Another client keeps a request running on the engine: the window is refused at its injection
    (D + 1 running), the re-run waits at most `protocol.settle_timeout_s` for the engine to run
    nothing, then the configuration fails with one line saying so; nothing is recorded."""
    tasks: list[asyncio.Future[None]] = []

    def beside_the_first_window(role: str, running: int) -> None:
        if role == "probe" and sum(r == "probe" for r, _ in engine.arrivals) == WINDOW_PROBES + 1 and not tasks:
            tasks.append(asyncio.ensure_future(foreign_stream(engine.url, 100_000)))

    async with ScriptedEngine(cadence_s=CADENCE, on_arrival=beside_the_first_window) as engine:
        code, err, took = await sweep(engine, tmp_path, protocol={
            "decode_context_tokens": 64, "decode_output_tokens": 160, "settle_timeout_s": 2})
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert code == 4, err[-3000:]
    assert f"at injection the engine ran {D + 1} and queued 0 requests (expected {D} and 0)" in err
    assert "the engine still ran 1 and queued 0 request(s) 2 s after" in err, err[-3000:]
    assert not (_results(tmp_path) / str(B) / f"D{D}_P{P}.json").exists() and took < 90


@pytest.mark.parametrize("fault", [
    Fault("http-500", on="prefill", skip=WINDOW_PREFILL),
    Fault("stall", on="prefill", skip=WINDOW_PREFILL, at_token=0),
], ids=lambda f: f"{f.kind}-{f.on}")
async def test_in_fast_mode_a_rerun_starts_a_fresh_set_beside_nothing(fault: Fault, tmp_path: Path) -> None:
    """Fast mode's long-lived probe set is retired when a window fails (cancelled), the spoiled
    window's prefill with it, and the re-run's set starts on an engine that runs nothing (fast mode
    retired its set before too; what main lacked here is the record saying it was a re-run)."""
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await sweep(engine, tmp_path, "--read-timeout", "2s", mode="fast")
    assert code == 0 and fault.hits == 1 and "retrying" in err, err[-3000:]
    assert "at injection the engine ran" not in err, err[-3000:]
    assert most_beside(engine, "probe") <= D - 1
    assert engine.arrivals[-1] == ("prefill", D)
    # the record counts every re-run the sweep announced for the window: the fault's, and on a machine
    # loaded enough to spoil a window by itself (a probe silent past the 2 s read timeout) that one too
    announced = err.count(f"B={B} D={D} P={P} rep 0: ")
    assert announced >= 1 and record(_results(tmp_path))["reps"][0]["retries"] == announced, err[-3000:]
