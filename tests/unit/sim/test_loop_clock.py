"""The embedded engine's clock on a virtual loop: a seeded virtual run is the same run whenever it is made.

Wall times (a span's `start_ns`, read back on the probes' clock by the passive tracker) are the Unix
epoch plus the loop's time, in floating point: with the epoch's sub-second fraction, the same virtual
time rounded differently in runs made at different moments, and one of 479 passive events flipped
between `joint` and `merged` (session 35). A virtual loop's epoch is whole seconds now."""

from __future__ import annotations

import asyncio
import random

import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.sim import engine


def _first_tokens_on_the_probes_clock(monkeypatch: pytest.MonkeyPatch, unix_now: float,
                                      spans: list[tuple[float, float]]) -> list[float]:
    """(arrival, TTFT) pairs through the path a span takes: the engine's `start_ns` on the Unix clock
    (`EngineCore.request_trace`), `first_token_ns` (`client.traces`), less the passive session's clock offset
    (`predict.passive`) as the tracker reads it (`exporter.passive.add_traces`)."""
    monkeypatch.setattr(engine.time, "time", lambda: unix_now)

    async def main() -> list[float]:
        clock = engine.LoopClock()
        offset_ns = round((clock.wall() - clock.now()) * 1e9)
        out = []
        for arrival, ttft in spans:
            await asyncio.sleep(arrival + ttft - clock.now())
            start_ns = round((clock.wall() - clock.now() + arrival) * 1e9)
            out.append(start_ns + ttft * 1e9 - offset_ns)
        return out

    return run_virtual(main())


def test_a_virtual_runs_span_times_are_the_same_whenever_it_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    spans = sorted((rng.uniform(0, 3600), rng.uniform(0.01, 2.0)) for _ in range(300))
    a = _first_tokens_on_the_probes_clock(monkeypatch, 1796629212.317406, spans)
    b = _first_tokens_on_the_probes_clock(monkeypatch, 1796629238.699305, spans)
    assert a == b  # exactly: the same rounding at every virtual time
    assert a == pytest.approx([(x + y) * 1e9 for x, y in spans], abs=1e3)


def test_a_real_loops_wall_time_is_unix_time() -> None:
    import time

    async def main() -> float:
        return engine.LoopClock().wall() - time.time()

    assert abs(asyncio.run(main())) < 0.5
