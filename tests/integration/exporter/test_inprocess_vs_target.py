"""The embedded engine agrees with itself: one configuration measured in process (virtual clock,
`measure`'s protocol on the engine directly, the engine's step log read) and by the live exporter
(`pdexporter run --target`) against the same engine served over HTTP in real time by `pdexporter
sim serve` (no step log: chunk steps from the schedule and the cadence) gives the same penalty and
prefill duration within 3 %."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.exporter.config import build_config
from pdexporter.exporter.runner import Runner
from pdexporter.launch import ExternalLauncher
from pdexporter.measure.point import PointSpec, measure_point
from pdexporter.measure.protocol import ProtocolSettings, warm_prefix
from pdexporter.measure.sim_driver import SimDriver
from pdexporter.measure.store import ResultsStore
from tests.helpers import free_port, stop_process

pytestmark = [pytest.mark.integration, pytest.mark.realtime]  # run alone (scripts/test.sh)

B, D, P = 8192, 4, 32768


def _in_process(tmp: Path) -> tuple[float, float]:
    async def main():  # type: ignore[no-untyped-def]
        async with SimDriver.create(chunk_size=B) as driver:
            await warm_prefix(driver, ProtocolSettings())
            return await measure_point(driver, PointSpec(B, D, P), ProtocolSettings(), ResultsStore(tmp), reps=2)

    record = run_virtual(main())
    assert record.interference.num_chunks_source == "engine-log"
    return record.derived.tpot_penalty_ms, record.interference.prefill_duration_ms  # type: ignore[return-value]


def _live(url: str, windows: int) -> list:  # type: ignore[type-arg]
    async def main():  # type: ignore[no-untyped-def]
        config = build_config(probe_streams=D, chunk_size=B, target=url, inject_every_s=0.5, prefill_tokens=P,
                              listen_host="127.0.0.1", listen_port=0)
        seen: list = []  # type: ignore[type-arg]
        runner = Runner(config, ExternalLauncher(url, B), on_window=seen.append)
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        deadline = time.monotonic() + 240
        while len(seen) < windows and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        stop.set()
        await task
        return seen

    return asyncio.run(main())


def test_run_against_sim_serve_agrees_with_the_in_process_engine(tmp_path: Path) -> None:
    penalty, prefill = _in_process(tmp_path / "in-process")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdexporter", "sim", "serve", "--port", str(port), "--max-num-batched-tokens", str(B)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        windows = _live(f"http://127.0.0.1:{port}", 5)
    finally:
        stop_process(proc)
    assert len(windows) >= 5
    assert {w.rep.interference.num_chunks_source for w in windows} == {"cadence"}  # no step log over HTTP
    live_penalty = statistics.median(w.rep.derived.tpot_penalty_ms for w in windows)
    live_prefill = statistics.median(w.rep.interference.prefill_duration_ms for w in windows)
    print(f"\npenalty in process {penalty:.2f} ms, over HTTP {live_penalty:.2f} ms; "
          f"prefill {prefill:.1f} vs {live_prefill:.1f} ms")
    assert live_penalty == pytest.approx(penalty, rel=0.03)
    assert live_prefill == pytest.approx(prefill, rel=0.03)
