"""`measure` over real HTTP against the embedded engine: the client-side timing trap.

docs/vllm-facts.md: encoding a 32K-id JSON body on the loop that reads the probes delayed their
reads, and the probes logged bursts of 0 ms intervals right after the injection. The fix is that
no request body is encoded while a window is open: the prefill's body is encoded before it opens
and the probes' before they start. That is what this test checks, by recording when every body
was encoded and when every window ran.

It used to assert `zero_intervals == 0` instead, which a loaded machine breaks for reasons that
are not the client's: the engine's own writes get late (it is starved of CPU too) and the client
then reads two of a stream's events at once. `tests/benchmarks/bench_timing.py` prints those
figures, with the engine's send stamps saying which side each ~0 ms interval came from.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import pdexporter.measure.driver as driver_module
from pdexporter._internal.atomic import read_json_gz
from pdexporter.launch import SimLauncher
from pdexporter.measure.driver import http_driver
from pdexporter.measure.point import PointSpec, measure_point
from pdexporter.measure.protocol import ProtocolSettings, warm_prefix, warm_shapes
from pdexporter.measure.store import ResultsStore

pytestmark = pytest.mark.integration


def test_a_32k_injection_encodes_nothing_while_its_window_is_open(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    b, d, p = 8192, 4, 32768
    encoded_at: list[int] = []  # perf_counter_ns of every request body encoded (the driver's clock)
    encode = driver_module.encode_body

    def recorded(body):  # type: ignore[no-untyped-def]
        encoded_at.append(time.perf_counter_ns())
        return encode(body)

    monkeypatch.setattr(driver_module, "encode_body", recorded)

    async def main():
        launcher = SimLauncher(log_dir=tmp_path / "engine")
        handle = await launcher.start(b)
        try:
            async with http_driver(handle) as driver:
                settings = ProtocolSettings()
                await warm_prefix(driver, settings)
                await warm_shapes(driver, [p], settings)
                return await measure_point(driver, PointSpec(b, d, p), settings, ResultsStore(tmp_path), reps=2)
        finally:
            await launcher.stop()

    record = asyncio.run(main())
    for rep in record.reps:
        i = rep.interference
        assert i.prefill_prompt_tokens == p and i.prompt_tokens_check == "exact"  # exactly P tokens went in
        assert i.window_intervals >= d * i.num_chunks_actual
        # the chunk steps were found despite the burst of tokens the engine hands over after the
        # prompt's retirement stall (merged into one event with the last chunk's token over HTTP)
        assert i.chunk_tokens_engine_log == [8188] * 4 + [16]
        assert len(i.chunk_step_times_ms) == 5 and min(i.chunk_step_times_ms[:4]) > 5 * rep.baseline.tpot_p50_ms
        raw = read_json_gz(tmp_path / str(b) / rep.raw)  # type: ignore[operator]
        t_inject = raw["t_inject_clock_ns"]
        t_end = t_inject + max(sum(probe["dt_ns"]) for probe in raw["probes"])  # the probes' last token
        inside = [t for t in encoded_at if t_inject <= t <= t_end]
        assert inside == [], f"{len(inside)} request bodies encoded while the window of rep {rep.rep} was open"
    assert len(encoded_at) >= 2 + 2 * 2  # warm-ups, then each rep's probes and prefill: the recorder saw them
