"""`--listen`: while sweeping, each window's gauges are on /metrics (the exporter's series)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdexporter._internal.vloop import run_virtual
from pdexporter.exporter.metrics import WINDOW_PENALTY, WINDOWS
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.controller import SweepController, SweepObserver
from pdexporter.sweep.job import WindowExporter
from pdexporter.sweep.providers import make_provider
from pdexporter.sweep.spec import parse_sweep

pytestmark = pytest.mark.integration


def test_windows_are_exported_while_sweeping(tmp_path: Path) -> None:
    spec = parse_sweep({
        "grid": {"chunk_sizes": [2048], "decode_batch_sizes": [0, 4], "new_prefill_tokens": [1024, 8192]},
        "reps": 2, "mode": "fast", "listen": "127.0.0.1:0",
        "launcher": {"kind": "sim", "clock": "virtual"},
    })
    store = ResultsStore(tmp_path)
    scrapes: list[str] = []

    async def main() -> None:
        observer = WindowExporter(SweepObserver())
        url = await observer.start(spec.listen or "")
        try:
            report = await SweepController(spec, store, make_provider(spec, store), observer=observer).run()
            assert report.complete
            async with aiohttp.ClientSession() as session, session.get(url) as resp:
                assert resp.status == 200
                scrapes.append(await resp.text())
        finally:
            await observer.stop()

    run_virtual(main())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scrapes[0]) for s in family.samples
    }
    for record in store.iter_records():
        labels = (("chunk_size", "2048"), ("decode_batch_size", str(record.config.decode_batch_size)),
                  ("engine", record.config.engine), ("mode", "active"),
                  ("new_prefill_tokens", str(record.config.new_prefill_tokens)))
        assert samples[(WINDOWS, labels)] == 2  # one window per repetition
        last = record.reps[-1].derived.tpot_penalty_ms
        if last is not None:
            assert samples[(WINDOW_PENALTY, labels)] == pytest.approx(last / 1000)
