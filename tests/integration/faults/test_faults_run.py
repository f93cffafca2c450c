"""`pdexporter run` (the live exporter) against a misbehaving engine (ScriptedEngine, a TEST DOUBLE).

What a user of a probe exporter expects, after Prometheus' blackbox_exporter: a scrape never hangs
(whatever the engine does, /metrics answers at once); a probe failure is a metric, not a crash
(`pdexporter_errors_total{kind}`, `pdexporter_up 0` with `pdexporter_up_reason`); label values are
bounded (no URL, error text or request id ever becomes one); a failing engine does not stop the
rest (the probes go on after a spoiled window, windows go on with an unreadable /metrics); and the
exporter waits for an engine that is not there yet instead of exiting (issue 13).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from pdexporter.errors import EngineChanged, EngineError
from pdexporter.exporter import book as book_module
from pdexporter.exporter import status as status_module
from pdexporter.exporter.metrics import (
    ERROR_KINDS,
    GRID_LABELS,
    MODES,
    PASSIVE_OUTCOMES,
    PASSIVE_SOURCES,
    PHASES,
    REJECT_REASONS,
    TRACE_KINDS,
    TRACE_RESULTS,
    UP_REASONS,
)
from tests.helpers import free_port, until
from tests.integration.faults.faultkit import live, reason, value
from tests.scripted_engine import Fault, ScriptedEngine

pytestmark = pytest.mark.integration

CADENCE = 0.01
# `pdexporter_up` drops to `probes-stalled` after `status.STALL_S` (10 s) of probe silence. The tests
# that wait for it shorten it (`short_stall`): what they check is that `up` drops after that
# silence, well before the stream is cut, not the 10 s themselves (tests/unit/exporter/
# test_exporter_status.py checks the rule).
SHORT_STALL_S = 3.0


@pytest.fixture
def short_stall(monkeypatch: pytest.MonkeyPatch) -> float:
    """`STALL_S` as SHORT_STALL_S where the runner (in this process) reads it: the book's own
    check of each open stream, and `status.up_reason`'s of the time since the last token."""
    assert book_module.STALL_S == status_module.STALL_S  # one setting, imported by name into the book
    monkeypatch.setattr(book_module, "STALL_S", SHORT_STALL_S)
    monkeypatch.setattr(status_module, "STALL_S", SHORT_STALL_S)
    return SHORT_STALL_S


async def _scrape(port: int, path: str = "/metrics") -> tuple[int, str, float]:
    """One HTTP GET of the exporter: status, body, seconds it took."""
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}",
                                                                timeout=aiohttp.ClientTimeout(total=10)) as resp:
        return resp.status, await resp.text(), time.monotonic() - t0


async def test_run_waits_for_an_engine_that_is_not_up_yet_and_serves_up_0_meanwhile() -> None:
    """Issue 13: `run --target` exited with rc 3 after 2.8 s when the engine was not up yet."""
    port = free_port()
    async with live(f"http://127.0.0.1:{port}") as (runner, task):
        await until(lambda: runner.bound_port is not None and reason(runner) == "engine-unreachable", 30,
                    "up_reason engine-unreachable")
        await asyncio.sleep(3.0)  # several attempts, with back-off
        assert not task.done(), task
        status, body, took = await _scrape(runner.bound_port)  # type: ignore[arg-type]
        assert status == 200 and "\npdexporter_up 0.0" in body and took < 2.0
        assert 'pdexporter_up_reason{reason="engine-unreachable"} 1.0' in body
        assert (await _scrape(runner.bound_port, "/livez"))[0] == 200  # type: ignore[arg-type]
        assert (await _scrape(runner.bound_port, "/readyz"))[0] == 200  # type: ignore[arg-type]
        assert value(runner, "pdexporter_errors_total", kind="connect") >= 2
        async with ScriptedEngine(cadence_s=CADENCE, port=port):  # the engine finally comes up
            await until(lambda: value(runner, "pdexporter_up") == 1 and runner.windows_seen >= 1, 60,
                        "up 1 and a window once the engine is there")
            assert reason(runner) == "ok"


async def test_run_survives_resets_during_its_start_up_warm_up() -> None:
    # More resets than the warm-up's own retries (4 attempts): the start-up itself is retried.
    fault = Fault("reset", on="prefill", times=6)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine, live(engine.url) as (runner, task):
        await until(lambda: value(runner, "pdexporter_up") == 1, 60, "up 1 after the resets")
        assert fault.hits == 6 and not task.done()


async def test_engine_wait_bounds_the_wait() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError, match=r"engine not ready after 1.5 s \(--engine-wait\): cannot connect to"):
        async with live(url, engine_wait_s=1.5) as (_, task):
            await asyncio.wait_for(asyncio.shield(task), 30)


async def test_a_slow_health_endpoint_never_slows_a_scrape() -> None:
    # /health answers after 2.5 s: a scrape that waited for it would take well over the 1 s allowed
    async with ScriptedEngine(cadence_s=CADENCE, health_delay_s=2.5) as engine, live(engine.url) as (runner, _):
        await until(lambda: runner.bound_port is not None, 10, "the metrics server")
        status, body, took = await _scrape(runner.bound_port)  # type: ignore[arg-type]
        assert status == 200 and took < 1.0 and 'pdexporter_up_reason{reason="starting"} 1.0' in body
        await until(lambda: value(runner, "pdexporter_up") == 1, 60, "up 1 after the slow health")


async def test_an_engine_answering_html_404_pages_is_up_0_with_the_reason_not_an_exit() -> None:
    async with ScriptedEngine(cadence_s=CADENCE, faults=[Fault("html-404", times=None)]) as engine, \
            live(engine.url) as (runner, task):
        await until(lambda: reason(runner) == "engine-http-error", 30, "up_reason engine-http-error")
        await asyncio.sleep(2.0)
        assert not task.done() and value(runner, "pdexporter_up") == 0
        assert value(runner, "pdexporter_errors_total", kind="http") >= 1


@pytest.mark.slow
async def test_faults_while_running_are_counted_and_the_exporter_goes_on(short_stall: float) -> None:
    """One exporter through every fault in turn; after each, windows come again."""
    async with ScriptedEngine(cadence_s=CADENCE) as engine, live(engine.url) as (runner, task):
        await until(lambda: runner.windows_seen >= 1, 60, "a first window")

        async def fault_then_recover(fault: Fault, kind: str) -> None:
            errors, windows = value(runner, "pdexporter_errors_total", kind=kind), runner.windows_seen
            engine.faults.append(fault)
            await until(lambda: fault.hits >= 1 and value(runner, "pdexporter_errors_total", kind=kind) > errors, 60,
                        f"{fault.kind} counted as {kind}")
            await until(lambda: runner.windows_seen > windows + 1, 60, f"windows after {fault.kind}")
            assert not task.done()

        await fault_then_recover(Fault("http-500", on="prefill"), "http")
        assert value(runner, "pdexporter_injections_total", outcome="error") >= 1
        await fault_then_recover(Fault("close-mid-stream", on="probe", at_token=20), "connect")
        await fault_then_recover(Fault("malformed-sse", on="probe", at_token=20), "protocol")
        await fault_then_recover(Fault("wrong-prompt-tokens", on="prefill"), "measurement")

        # An unreadable /metrics: scrapes fail and are counted, windows go on.
        engine.metrics = "garbage"
        await until(lambda: value(runner, "pdexporter_engine_scrape_success") == 0, 30, "scrape_success 0")
        windows = runner.windows_seen
        await until(lambda: runner.windows_seen > windows + 1, 60, "windows with a garbage /metrics")
        engine.metrics = "ok"

        # A hung engine: a scrape still answers at once; up drops with the reason, and comes back.
        engine.freeze(short_stall + 3.0)
        await until(lambda: reason(runner) == "probes-stalled", 30, "up_reason probes-stalled")
        status, _, took = await _scrape(runner.bound_port)  # type: ignore[arg-type]
        assert status == 200 and took < 1.0
        await until(lambda: value(runner, "pdexporter_up") == 1, 60, "up 1 after the freeze")

        # A restart: connections dropped, the port closed for a moment, counters start again.
        windows = runner.windows_seen
        # the reason stays engine-unreachable from the dropped streams until tokens flow again
        restarting = asyncio.create_task(engine.restart(down_s=1.5))
        await until(
            lambda: reason(runner) == "engine-unreachable", 30, "up_reason engine-unreachable while it restarts"
        )
        await restarting
        await until(lambda: value(runner, "pdexporter_up") == 1 and runner.windows_seen > windows + 1, 60,
                    "windows after the restart")
        assert not task.done()
        _check_bounded_labels(runner)


def _check_bounded_labels(runner) -> None:  # type: ignore[no-untyped-def]
    """Every label value is one of a known, finite set: no URL, error text or request id."""
    allowed = {
        "kind": {*ERROR_KINDS, *TRACE_KINDS}, "phase": set(PHASES), "reason": {*UP_REASONS, *REJECT_REASONS},
        "outcome": {"ok", "error", *PASSIVE_OUTCOMES}, "source": set(PASSIVE_SOURCES), "result": set(TRACE_RESULTS),
        "mode": set(MODES), "chunk_size": {"2048"}, "decode_batch_size": {"2"}, "new_prefill_tokens": {"64"},
        "engine": {"vllm", "openai-compatible"}, "model": {"scripted-model"}, "modelled": {"false"},
        "chunk_size_source": {"given"}, "version": None, "le": None,
    }
    for family in runner.metrics.registry.collect():
        for sample in family.samples:
            for label, val in sample.labels.items():
                assert label in allowed, (sample.name, label)
                if allowed[label] is not None:
                    assert val in allowed[label], (sample.name, label, val)
    assert set(GRID_LABELS) <= set(allowed)


async def test_a_probe_silent_past_the_read_timeout_is_counted_and_restarted() -> None:
    fault = Fault("stall", on="probe", skip=4, at_token=20)
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine, \
            live(engine.url, read_timeout_s=1.0) as (runner, task):
        await until(lambda: value(runner, "pdexporter_errors_total", kind="timeout") >= 1, 60, "a read timeout")
        windows = runner.windows_seen
        await until(lambda: runner.windows_seen > windows, 60, "windows after the stalled probe")
        assert fault.hits == 1 and not task.done()


async def test_a_prefill_longer_than_max_model_len_is_a_setting_error_not_a_wait() -> None:
    from pdexporter.errors import ConfigError

    async with ScriptedEngine(cadence_s=CADENCE, max_model_len=60) as engine:
        with pytest.raises(ConfigError, match="--new-prefill-tokens 64: 64 prompt tokens .* max_model_len 60"):
            async with live(engine.url) as (_, task):
                await asyncio.wait_for(asyncio.shield(task), 30)
        assert engine.completion_calls == 0


async def test_a_probe_stalling_while_the_others_decode_is_up_0_at_once_counted_and_cut(short_stall: float) -> None:
    """Issue 24: one probe whose stream goes silent (the engine streams to the others) held every
    window for the read timeout (300 s) with `up` 1, reason "ok", and no error counted. Now: `up` 0
    `probes-stalled` after `STALL_S` (10 s by default; `short_stall` here); the stream is cut after
    `stall_timeout_s` (here STALL_S + 3 s; 30 s by default), counted as a timeout, restarted;
    windows come again."""
    fault = Fault("stall", on="probe", skip=4, at_token=20)
    protocol = {"decode_context_tokens": 64, "decode_output_tokens": 160, "stall_timeout_s": short_stall + 3.0}
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine, \
            live(engine.url, protocol=protocol) as (runner, task):
        await until(lambda: fault.hits == 1, 60, "the stalled probe")
        t0 = time.monotonic()
        await until(lambda: reason(runner) == "probes-stalled", 20, "up_reason probes-stalled")
        assert value(runner, "pdexporter_up") == 0 and time.monotonic() - t0 < short_stall + 3
        await until(lambda: value(runner, "pdexporter_errors_total", kind="timeout") >= 1, 30, "the stall counted")
        assert time.monotonic() - t0 < short_stall + 13  # cut at stall_timeout_s, not at the read timeout
        windows = runner.windows_seen
        await until(lambda: runner.windows_seen > windows and reason(runner) == "ok", 60, "windows after the cut")
        assert not task.done()


async def test_up_drops_at_once_when_the_engine_dies_and_does_not_flap() -> None:
    """Issue 24: after the engine died, `up` stayed 1 for ~5 s (the probes' restarts were being
    retried, unseen) and then flapped for 8 s. Now it is 0 at the first broken stream and stays 0."""
    async with ScriptedEngine(cadence_s=CADENCE) as engine, live(engine.url, inject_every_s=None) as (runner, task):
        await until(lambda: value(runner, "pdexporter_up") == 1, 60, "up 1")
        await asyncio.sleep(1.0)
        await engine._stop()  # connections dropped, the port closed: the engine is gone
        t0 = time.monotonic()
        await until(lambda: value(runner, "pdexporter_up") == 0, 5, "up 0")
        took = time.monotonic() - t0
        seen = set()
        end = time.monotonic() + 8.0
        while time.monotonic() < end:
            seen.add(reason(runner))
            await asyncio.sleep(0.02)
        assert took < 1.0 and seen == {"engine-unreachable"}, (took, seen)
        assert not task.done()


async def test_a_window_spoiled_by_a_500_is_tried_again_soon_and_says_why() -> None:
    """Issue 24: with a 500 on the injected prefill `run` made no window in 36 s, up 1: the next
    try waited a whole period. Now the skip is counted by kind (`windows_skipped_total`) and the
    window is tried again 2 s later (`runner.RETRY_AFTER_S`), well before the next period (7 s here)."""
    period = 7.0
    fault = Fault("http-500", on="prefill", skip=2)  # the two warm-ups pass, the first window's prefill fails
    async with ScriptedEngine(cadence_s=CADENCE, faults=[fault]) as engine, \
            live(engine.url, inject_every_s=period) as (runner, task):
        await until(lambda: fault.hits == 1, 60, "the spoiled window")
        assert runner.windows_seen == 0
        await until(lambda: value(runner, "pdexporter_windows_skipped_total", kind="http") == 1, 5, "the skip counted")
        t0 = time.monotonic()
        await until(lambda: runner.windows_seen >= 1, period, f"a window well before the next period ({period:g} s)")
        assert time.monotonic() - t0 < period - 1.5 and not task.done()


async def test_an_engine_restarted_as_itself_is_asked_again_and_the_windows_go_on() -> None:
    """The audit's restart (issue 24): the engine comes back; pdexporter sees it (counted), asks who
    it is, says what it cannot check (no published chunk size), and windows go on."""
    lines: list[str] = []
    async with ScriptedEngine(cadence_s=CADENCE) as engine, live(engine.url, log=lines.append) as (runner, task):
        await until(lambda: runner.windows_seen >= 1, 60, "a first window")
        await engine.restart(down_s=0.5)
        await until(lambda: value(runner, "pdexporter_engine_restarts_total") >= 1, 30, "the restart counted")
        await until(lambda: any("answers as before" in line for line in lines), 30, "the engine asked again")
        windows = runner.windows_seen
        await until(lambda: runner.windows_seen > windows + 1, 60, "windows after the restart")
        assert not task.done()
        # each repetition keeps the engine process it ran on (the double's start time: a minute later)
        started = runner.windows[-1].rep.engine_metrics["process_start_time_seconds"]
        assert started == pytest.approx(1.79602273114e9 + 60.0)
    said = next(line for line in lines if "answers as before" in line)
    assert "publishes no chunk size" in said and "2048 (given)" in said, said
    assert any("the engine restarted (its process start time moved" in line for line in lines), lines


async def test_an_engine_back_after_an_outage_is_asked_again_without_counting_a_restart() -> None:
    """A restart may leave no sign in /metrics (a young process's counters overtaken by the new
    one's, no process start time: SGLang's multiprocess metrics): an engine that answers again after
    its /metrics could not be reached is asked who it is all the same, and windows wait for it."""
    lines: list[str] = []
    async with ScriptedEngine(cadence_s=CADENCE) as engine, live(engine.url, log=lines.append) as (runner, task):
        await until(lambda: runner.windows_seen >= 1, 60, "a first window")
        await engine.outage(down_s=1.5)
        await until(lambda: any("could not be reached" in line for line in lines), 30, "the outage seen")
        await until(lambda: any("answers as before" in line for line in lines), 30, "the engine asked again")
        windows = runner.windows_seen
        await until(lambda: runner.windows_seen > windows, 60, "windows after the outage")
        assert not task.done() and value(runner, "pdexporter_engine_restarts_total") == 0
    said = next(line for line in lines if "could not be reached" in line)
    assert "asking it who it is again; no window until it answers" in said, said


async def test_an_engine_restarted_as_another_model_ends_the_run_in_one_line() -> None:
    """Windows of the new model must not be recorded under the old one's: the run ends (exit 3)."""
    with pytest.raises(EngineChanged) as caught:
        async with ScriptedEngine(cadence_s=CADENCE) as engine, live(engine.url) as (runner, task):
            await until(lambda: runner.windows_seen >= 1, 60, "a first window")
            await engine.restart(down_s=0.5, model="another-model")
            await until(task.done, 60, "the run to end")
    message = str(caught.value)
    assert "\n" not in message and "restarted" in message and "another-model" in message, message
    assert caught.value.exit_code == 3
