"""`measure` over real HTTP against the embedded engine: the client-side timing trap.

docs/vllm-facts.md: encoding a 32K-id JSON body on the loop that reads the probes delayed their
reads, and the probes logged bursts of 0 ms intervals right after the injection. The body is now
encoded before the window opens; against the embedded engine, whose tokens leave at modelled
times, no interval in the window may collapse to ~0 ms.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pdexporter.launch import SimLauncher
from pdexporter.measure.driver import http_driver
from pdexporter.measure.point import PointSpec, measure_point
from pdexporter.measure.protocol import ProtocolSettings, warm_prefix, warm_shapes
from pdexporter.measure.store import ResultsStore
from pdexporter.measure.window import WindowParams

pytestmark = pytest.mark.integration


def test_a_32k_injection_leaves_no_zero_intervals_in_the_probes(tmp_path: Path) -> None:
    b, d, p = 8192, 4, 32768

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
    baseline = record.baseline.tpot_p50_ms
    assert baseline is not None
    for rep in record.reps:
        i = rep.interference
        assert i.prefill_prompt_tokens == p  # usage.prompt_tokens: exactly P tokens went in
        assert i.window_intervals >= d * i.num_chunks_actual
        assert i.zero_intervals == 0, rep
        assert i.min_interval_ms is not None and i.min_interval_ms > WindowParams().zero_interval_frac * baseline, rep
        # the chunk steps were found despite the burst of tokens the engine hands over after the
        # prompt's retirement stall (merged into one event with the last chunk's token over HTTP)
        assert len(i.chunk_step_times_ms) == 5 and min(i.chunk_step_times_ms[:4]) > 5 * baseline
