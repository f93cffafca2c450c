"""A spoiled window is tried again soon (`Runner._window_failed`): after `RETRY_AFTER_S`, or after
`--inject-every` where that is shorter, and the line `run` prints says which. It said "another in
2 s" whatever the period, where a 0.5-s period tried again in 0.5 s."""

from __future__ import annotations

import time

import pytest

from pdexporter.errors import EngineHTTPError
from pdexporter.exporter.config import build_config
from pdexporter.exporter.runner import RETRY_AFTER_S, WINDOW_RETRIES, Runner
from pdexporter.launch import ExternalLauncher

URL = "http://127.0.0.1:9"


def _runner(inject_every_s: float, lines: list[str]) -> Runner:
    config = build_config(probe_streams=2, chunk_size=2048, prefill_tokens=64, inject_every_s=inject_every_s,
                          target=URL, protocol={"decode_context_tokens": 64, "decode_output_tokens": 160})
    return Runner(config, ExternalLauncher(URL, 2048), log=lines.append)


def _http_500() -> EngineHTTPError:
    return EngineHTTPError(f"{URL}/v1/completions", 500, "Internal Server Error")


@pytest.mark.parametrize("inject_every_s", [0.5, RETRY_AFTER_S + 5.0])
def test_the_retry_line_says_when_the_next_window_comes(inject_every_s: float) -> None:
    lines: list[str] = []
    runner = _runner(inject_every_s, lines)
    soon = min(RETRY_AFTER_S, inject_every_s)
    for _ in range(WINDOW_RETRIES):
        before = time.monotonic()
        runner._window_failed(_http_500(), injected=True)
        assert before + soon <= runner._next_injection <= time.monotonic() + soon
        assert lines[-1].endswith(f"; another in {soon:g} s"), lines[-1]
    # retries used up: the next period, and the line promises nothing sooner
    before = time.monotonic()
    runner._window_failed(_http_500(), injected=True)
    assert before + inject_every_s <= runner._next_injection and "another in" not in lines[-1]


def test_the_period_runs_from_one_windows_start_to_the_next() -> None:
    """`--inject-every 5s` ran windows ~5.5 s apart (the runtime audit of session 22): the next window
    was a period after the last one *ended*. Now a period after it started; at once when it took longer."""
    runner = _runner(5.0, [])
    runner._window_started = time.monotonic() - 0.6  # a window that took 0.6 s
    runner._schedule_next()
    assert abs(runner._next_injection - (runner._window_started + 5.0)) < 1e-9
    runner._window_started = time.monotonic() - 7.0  # longer than the period: the next one at once
    before = time.monotonic()
    runner._schedule_next()
    assert before <= runner._next_injection <= time.monotonic()
