"""The analysis' integration tests: a real Prometheus (`tests.prometheus_server`) and a test double of the exporter."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pdexporter.exporter.metrics import ExporterMetrics, grid_labels, publish_window
from pdexporter.exporter.server import metrics_app, start_metrics_server
from pdexporter.measure.records import RepRecord, RunRecord
from tests.prometheus_server import PrometheusServer


class ExporterDouble:
    """A test double of `pdexporter run`: the exporter's own metrics (`ExporterMetrics`), its own
    window publishing (`publish_window`) and its own aiohttp exposition (`metrics_app`), but the
    windows come from records handed in by the test instead of from live probe streams."""

    def __init__(self) -> None:
        self.metrics = ExporterMetrics()
        self.failing = threading.Event()  # set: /metrics answers 503, a scrape that fails (a fault a test injects)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="exporter-double", daemon=True)
        self._thread.start()
        app = metrics_app(self.metrics.registry)
        app.middlewares.append(self._gate)
        started = asyncio.run_coroutine_threadsafe(start_metrics_server(app, "127.0.0.1", 0), self._loop)
        self._runner, self.port = started.result(timeout=10)

    @web.middleware
    async def _gate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.failing.is_set() and request.path == "/metrics":
            return web.Response(status=503, text="scrapes fail on purpose (the test's fault)\n")
        return await handler(request)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def publish(self, record: RunRecord, rep: RepRecord) -> None:
        c = record.config
        publish_window(
            self.metrics, grid_labels(c.chunk_size, c.decode_batch_size, c.new_prefill_tokens, engine=c.engine), rep
        )

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture
def exporter_double() -> Iterator[ExporterDouble]:
    double = ExporterDouble()
    yield double
    double.close()


@pytest.fixture
def prometheus_for(tmp_path):
    """Start a real Prometheus scraping the given targets every second; stopped afterwards."""
    started: list[PrometheusServer] = []

    def start(targets: list[str]) -> PrometheusServer:
        server = PrometheusServer(tmp_path / f"prom{len(started)}", targets)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def sim_records(grid: list[tuple[int, int, int]], reps: int, out: Path,
                profile: str = "h200-qwen3-coder-30b-a3b") -> list:
    """Records measured on the embedded engine (SimDriver) on virtual time: the real protocol,
    window maths and record code, against the engine's modelled step times. Seconds, not hours."""
    from pdexporter._internal.vloop import run_virtual
    from pdexporter.measure.point import PointSpec, measure_point
    from pdexporter.measure.protocol import ProtocolSettings, warm_prefix
    from pdexporter.measure.sim_driver import SimDriver
    from pdexporter.measure.store import ResultsStore

    settings = ProtocolSettings()
    store = ResultsStore(out)

    async def sweep() -> list:
        records = []
        for b in sorted({g[0] for g in grid}):
            async with SimDriver.create(profile=profile, chunk_size=b) as driver:
                await warm_prefix(driver, settings)
                for chunk, d, p in grid:
                    if chunk == b:
                        records.append(await measure_point(driver, PointSpec(b, d, p), settings, store, reps=reps))
        return records

    return run_virtual(sweep())


@pytest.fixture
def make_sim_records():
    """`sim_records(grid, reps, out)`: records from the embedded engine on virtual time."""
    return sim_records
