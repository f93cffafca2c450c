"""Real binaries for the analysis' integration tests: Debian's Prometheus, a test double of the exporter."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdexporter.exporter.metrics import ExporterMetrics, grid_labels, publish_window
from pdexporter.exporter.server import metrics_app, start_metrics_server
from pdexporter.measure.records import RepRecord, RunRecord
from tests.helpers import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class ExporterDouble:
    """A test double of `pdexporter run`: the exporter's own metrics (`ExporterMetrics`), its own
    window publishing (`publish_window`) and its own aiohttp exposition (`metrics_app`), but the
    windows come from records handed in by the test instead of from live probe streams."""

    def __init__(self) -> None:
        self.metrics = ExporterMetrics()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="exporter-double", daemon=True)
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(
            start_metrics_server(metrics_app(self.metrics.registry), "127.0.0.1", 0), self._loop)
        self._runner, self.port = started.result(timeout=10)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def publish(self, record: RunRecord, rep: RepRecord) -> None:
        c = record.config
        publish_window(self.metrics, grid_labels(c.chunk_size, c.decode_batch_size, c.new_prefill_tokens), rep)

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


@dataclass
class PrometheusServer:
    url: str
    process: subprocess.Popen[bytes]

    def query(self, expr: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())["data"]["result"]

    def wait_for(self, expr: str, predicate, timeout_s: float = 20.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus never satisfied the wait on {expr}: last {result}")
            time.sleep(0.1)


def start_prometheus(tmp_path: Path, targets: list[str], scrape_interval: str = "1s") -> PrometheusServer:
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        f"  scrape_interval: {scrape_interval}\n"
        f"  scrape_timeout: {scrape_interval}\n"
        "scrape_configs:\n"
        "  - job_name: pdexporter\n"
        "    static_configs:\n"
        f"      - targets: {json.dumps(targets)}\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("prometheus not ready within 30 s")
        time.sleep(0.1)
    return PrometheusServer(url, process)


@pytest.fixture
def prometheus_for(tmp_path):
    """Start a real Prometheus scraping the given targets every second; stopped afterwards."""
    started: list[PrometheusServer] = []

    def start(targets: list[str]) -> PrometheusServer:
        home = tmp_path / f"prom{len(started)}"
        home.mkdir(parents=True, exist_ok=True)
        server = start_prometheus(home, targets)
        started.append(server)
        return server

    yield start
    for server in started:
        server.process.terminate()
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


def sim_records(grid: list[tuple[int, int, int]], reps: int, out: Path,
                profile: str = "h200-qwen3-coder-30b-a3b") -> list:
    """Records measured on the embedded engine (SimDriver) on virtual time: the real protocol,
    window maths and record code, against the engine's modelled step times. Seconds, not hours."""
    from pdexporter._internal.vloop import run_virtual
    from pdexporter.measure.point import PointSpec, measure_point
    from pdexporter.measure.protocol import ProtocolSettings, warm_prefix
    from pdexporter.measure.store import ResultsStore
    from pdexporter.sim.driver import SimDriver

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
