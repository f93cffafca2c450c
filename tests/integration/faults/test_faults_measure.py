"""`pdexporter measure` against a misbehaving engine (ScriptedEngine, a TEST DOUBLE): each fault of
docs/reliability.md, and what measure must do about it: retry what is safe to retry, run Phase 1
or a repetition that a transient fault spoiled again (`--retries`, 2; issue 24: one 500 on the
injected prefill ended `measure`, and with one 500 in three requests it never finished), fail a
persistent fault with one line and the right exit code, quickly, and never write a record a
fault spoiled."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tests.integration.faults.faultkit import D, P, error_line, foreign_stream, measure, most_beside, posts, record
from tests.scripted_engine import Fault, ScriptedEngine

pytestmark = pytest.mark.integration

CADENCE = 0.01
# Prefill-role requests (max_tokens 1) of a measure run: the prefix warm-up, the shape warm-up,
# then the window's prefill. Probe requests: D baseline streams, then D window streams.
WINDOW_PREFILL = 2
WINDOW_PROBES = 2


async def test_http_500_on_a_probe_start_is_retried(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, faults=[Fault("http-500", on="probe")]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 0, err
    assert posts(engine, "probe") == 2 * 2 + 1  # one retried POST beside the 2 + 2 probes
    assert record(tmp_path)["interference"]["prompt_tokens_check"] == "exact"


async def test_a_reset_before_the_first_byte_is_retried(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, faults=[Fault("reset", on="probe", skip=WINDOW_PROBES)]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 0, err
    assert posts(engine, "probe") == 2 * 2 + 1


async def test_http_500_on_the_warm_up_is_retried(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, faults=[Fault("http-500", on="prefill", times=2)]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 0, err


def _retries(out: Path) -> list[int]:
    """Each recorded repetition's re-runs, from its raw file (`retries`, as the sweep writes it)."""
    from pdexporter._internal.atomic import read_json_gz

    return [read_json_gz(out / "2048" / rep["raw"]).get("retries", 0) for rep in record(out)["reps"]]


async def test_http_500_on_the_injected_prefill_reruns_the_repetition(tmp_path: Path) -> None:
    """The prefill inside a window is never re-sent (it may have run); the repetition is run again
    with fresh probes. Before: exit 3, nothing recorded."""
    fault = Fault("http-500", on="prefill", skip=WINDOW_PREFILL)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 0, err
    assert "repetition 0: " in err and "answered HTTP 500" in err and "running it again" in err
    assert posts(engine, "prefill") == WINDOW_PREFILL + 2  # the spoiled window's prefill, and the re-run's
    assert _retries(tmp_path) == [1]


async def test_one_500_in_three_requests_still_finishes(tmp_path: Path) -> None:
    """The audit: with one 500 in three requests `measure` never finished. Here every third prefill
    request is answered 500 (the retried probe starts are the client's business)."""
    faults = [Fault("http-500", on="prefill", skip=k, times=1) for k in range(2, 40, 3)]
    async with ScriptedEngine(cadence_s=CADENCE, faults=faults) as engine:
        code, err, _ = await measure(engine, tmp_path, "--reps", "3")
    assert code == 0, err
    assert len(record(tmp_path)["reps"]) == 3 and sum(f.hits for f in faults) >= 1
    assert sum(_retries(tmp_path)) >= 1


async def test_a_persistent_500_on_the_injected_prefill_ends_in_one_line(tmp_path: Path) -> None:
    fault = Fault("http-500", on="prefill", skip=WINDOW_PREFILL, times=None)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 3
    assert "answered HTTP 500" in error_line(err)
    assert posts(engine, "prefill") == WINDOW_PREFILL + 3  # the first run and its 2 re-runs, each sent once
    assert not (tmp_path / "2048" / "D2_P64.json").exists()


@pytest.mark.parametrize(("kind", "fragment"), [
    ("close-mid-stream", "connection lost mid-stream"),
    ("malformed-sse", "not JSON"),
])
async def test_a_probe_broken_inside_the_window_reruns_it_and_always_broken_is_one_line(
        kind: str, fragment: str, tmp_path: Path) -> None:
    once = Fault(kind, on="probe", skip=WINDOW_PROBES, at_token=40)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[once]) as engine:
        code, err, _ = await measure(engine, tmp_path / "once")
    assert code == 0 and once.hits == 1 and fragment in err, err
    assert _retries(tmp_path / "once") == [1]
    always = Fault(kind, on="probe", skip=WINDOW_PROBES, at_token=40, times=None)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[always]) as engine:
        code, err, _ = await measure(engine, tmp_path / "always")
    assert code == 3
    assert fragment in error_line(err)
    assert not (tmp_path / "always" / "2048" / "D2_P64.json").exists()


async def test_an_engine_that_stalls_inside_the_window_fails_it_quickly(tmp_path: Path) -> None:
    """Issue 13: a stalled stream hung `measure` for 300 s (the read timeout, without a flag)."""
    fault = Fault("freeze", on="prefill", skip=WINDOW_PREFILL, times=None, seconds=3.0)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, took = await measure(engine, tmp_path, "--read-timeout", "2s")
    # The window's stall check (the read timeout, when shorter than protocol.stall_timeout_s) or
    # the probe's read timeout itself, whichever looks first: one line either way.
    line = error_line(err)
    assert (code == 4 and "the engine stalled" in line) or ("no event for 2 s" in line and code == 3), line
    assert took < 90  # three windows of 2 s of silence each, not 300 s


async def test_a_stalled_probe_in_phase_1_reruns_phase_1(tmp_path: Path) -> None:
    """Issue 24: one stall (or reset) in Phase 1 ended the run where Phase 2 retried."""
    fault = Fault("stall", on="probe", at_token=5)  # a baseline stream goes silent after 5 tokens
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, took = await measure(engine, tmp_path, "--read-timeout", "2s")
    assert code == 0, err
    assert "Phase 1: " in err and ("no event for 2 s" in err or "the engine stalled" in err)
    assert took < 60


async def test_a_stalled_probe_before_the_window_times_out_at_the_read_timeout(tmp_path: Path) -> None:
    fault = Fault("stall", on="probe", at_token=5, times=None)  # every stream goes silent after 5 tokens
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, took = await measure(engine, tmp_path, "--read-timeout", "2s")
    assert code in (3, 4)  # the read timeout or the stall check, whichever looks first
    line = error_line(err)
    assert "no event for 2 s" in line or "the engine stalled" in line
    assert took < 60


async def test_wrong_usage_prompt_tokens_is_flagged(tmp_path: Path) -> None:
    fault = Fault("wrong-prompt-tokens", on="prefill", skip=WINDOW_PREFILL, times=None)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 4
    line = error_line(err)
    assert f"usage.prompt_tokens={P + 1}" in line and f"the {P} token ids sent" in line
    assert not (tmp_path / "2048" / "D2_P64.json").exists()


@pytest.mark.parametrize("metrics", ["garbage", "html-404"])
async def test_a_broken_engine_metrics_endpoint_does_not_stop_the_measurement(metrics: str, tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, metrics=metrics) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 0, err
    rep = record(tmp_path)["reps"][0]
    assert rep["engine_metrics"] == {}  # nothing invented from an unreadable /metrics


async def test_an_engine_restart_inside_the_window_reruns_it(tmp_path: Path) -> None:
    fault = Fault("restart", on="prefill", skip=WINDOW_PREFILL)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert engine.restarts == 1 and code == 0, err
    assert "connection lost" in err and _retries(tmp_path) == [1]


async def test_a_slow_health_endpoint_only_slows_the_start(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, health_delay_s=2.0) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 0, err


async def test_an_html_404_page_is_one_short_line(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, faults=[Fault("html-404", times=None)]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 3
    line = error_line(err)
    assert "HTTP 404" in line and "Not Found" in line and "<html" not in line.lower()
    assert engine.completion_calls == 1  # a 4xx is not retried


async def test_a_prefill_longer_than_max_model_len_is_refused_before_any_request(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE, max_model_len=60) as engine:
        code, err, took = await measure(engine, tmp_path)
    assert code == 2
    line = error_line(err)
    assert f"-P {P}: {P} prompt tokens + 1 output token(s) exceed the engine's max_model_len 60" in line
    assert engine.completion_calls == 0 and took < 30


# --- a re-run never runs beside its failed attempt (issue 31) -------------------------------------

def _phase1_gaps_ms(out: Path) -> list[float]:
    """The longest silence of each kept Phase 1 probe after its first token (ms)."""
    from pdexporter._internal.atomic import read_json_gz

    raw = read_json_gz(out / "2048" / "raw" / f"D{D}_baseline.json.gz")
    return [max(probe["dt_ns"][1:]) / 1e6 for probe in raw["probes"]]


async def test_a_rerun_repetition_never_runs_beside_the_failed_attempts_probes(tmp_path: Path) -> None:
    """Issue 31: after a 500 on the injected prefill the failed window's probes decoded on beside
    the re-run, which was kept: its record said `num_requests_running` 4.0 at D = 2."""
    fault = Fault("http-500", on="prefill", skip=WINDOW_PREFILL)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 0 and fault.hits == 1, err
    assert most_beside(engine, "probe") <= D - 1  # no probe of the re-run started beside the old ones
    assert engine.arrivals[-1] == ("prefill", D)  # the kept window's prefill ran beside exactly D probes
    rep = record(tmp_path)["reps"][0]
    assert rep["engine_metrics"]["num_requests_running"] == D
    assert rep["retries"] == 1 and rep["baseline_retries"] == 0  # in the record, not only the raw file
    assert re.search(r"runs repeated after a fault\s*│\s*reps 1, Phase 1 0", err), err  # and in measure's table


async def test_a_phase_1_rerun_never_runs_beside_the_failed_attempts_probes(tmp_path: Path) -> None:
    """Issue 31: a Phase 1 re-run after a closed probe ran beside the other probe of the failed
    attempt (its baseline 6.24 ms instead of 5.05 on the embedded engine)."""
    fault = Fault("close-mid-stream", on="probe", at_token=40)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 0 and fault.hits == 1 and "Phase 1: " in err, err
    assert most_beside(engine, "probe") <= D - 1
    rep = record(tmp_path)["reps"][0]
    assert rep["baseline_retries"] == 1 and rep["retries"] == 0


async def test_a_phase_1_probe_silent_for_seconds_fails_phase_1_and_it_runs_again(tmp_path: Path) -> None:
    """Issue 31: a Phase 1 probe silent for 10-20 s was accepted without a retry or a line (the
    baseline's p50 1.8 ms, its mean 23.8-44.7 ms). A silence longer than
    max(baseline_gap_ratio x the median interval, baseline_gap_floor_ms) fails Phase 1."""
    fault = Fault("stall", on="probe", at_token=40, seconds=2.0)  # then it decodes on
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine:
        code, err, _ = await measure(engine, tmp_path)
    assert code == 0 and fault.hits == 1, err
    lines = [line for line in err.splitlines() if line.startswith("Phase 1: ")]
    assert len(lines) == 1 and "silent for" in lines[0] and "running it again" in lines[0], err
    assert max(_phase1_gaps_ms(tmp_path)) < 500  # the kept baseline has no such silence
    assert record(tmp_path)["reps"][0]["baseline_retries"] == 1


async def test_a_repetition_the_engine_ran_beside_another_request_is_refused_and_run_again(tmp_path: Path) -> None:
    """Issue 31: a window whose engine ran more than its D probes at the injection was kept with a
    warning (sweep) or silently (measure). Another client's request lands beside the first window's
    probes: that window is refused before its prefill leaves, and run again once the engine is free."""
    tasks: list[object] = []

    def beside_the_first_window(role: str, running: int) -> None:
        if role == "probe" and sum(r == "probe" for r, _ in engine.arrivals) == D + 1 and not tasks:
            tasks.append(asyncio.ensure_future(foreign_stream(engine.url, 80)))  # 0.8 s of tokens

    async with ScriptedEngine(cadence_s=CADENCE, on_arrival=beside_the_first_window) as engine:
        code, err, _ = await measure(engine, tmp_path)
        await asyncio.gather(*tasks)  # type: ignore[arg-type]
    assert code == 0, err
    assert f"at injection the engine ran {D + 1} and queued 0 requests (expected {D} and 0)" in err, err
    assert [n for r, n in engine.arrivals if r == "prefill"][-1] == D and posts(engine, "prefill") == WINDOW_PREFILL + 1
    assert record(tmp_path)["reps"][0]["retries"] == 1


async def test_gauges_left_stale_by_aborted_requests_are_refreshed_by_a_one_token_request(tmp_path: Path) -> None:
    """vLLM keeps its request gauges as they were when every request was aborted until it steps
    again (vllm-project/vllm#22545): after the failed window's probes are cancelled its /metrics
    still says 2 running. The wait before the re-run sends one 1-token request to make it step,
    then sees 0, instead of waiting out `settle_timeout_s` and stopping."""
    fault = Fault("http-500", on="prefill", skip=WINDOW_PREFILL)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault], stale_gauges=True) as engine:
        code, err, took = await measure(engine, tmp_path)
    assert code == 0 and fault.hits == 1, err
    assert posts(engine, "prefill") == WINDOW_PREFILL + 1 + 1 + 1  # the spoiled window's, the nudge, the kept one
    assert engine.arrivals[-4:] == [("prefill", 0), ("probe", 0), ("probe", 1), ("prefill", D)]  # nudge, re-run
    assert record(tmp_path)["reps"][0]["retries"] == 1 and took < 60
