"""A real Prometheus for the integration tests: Debian's `prometheus`, started with its own scrape
config (pointing at the exporter), its TSDB in a temp dir, on a free port, queried over its HTTP
API. One class for every test that needs it (exporter, analysis, dashboards)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port, stop_process

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def require_prometheus() -> None:
    """A missing server fails the test (it is a real part of what is tested), it does not skip it."""
    if not Path(PROMETHEUS).exists():
        pytest.fail(f"{PROMETHEUS} is missing: scripts/test.sh installs Debian's prometheus package")


class PrometheusServer:
    def __init__(
        self, workdir: Path, targets: list[str], scrape_interval: str = "1s", ready_timeout_s: float = 30
    ) -> None:
        require_prometheus()
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {scrape_interval}\n"
            f"  scrape_timeout: {scrape_interval}\n"
            f"  evaluation_interval: {scrape_interval}\n"
            "scrape_configs:\n"
            "  - job_name: pdexporter\n"
            f"    static_configs:\n      - targets: {json.dumps(targets)}\n"
        )
        self.log = workdir / "prometheus.log"
        self._log_handle = self.log.open("wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log_handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + ready_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/{path}; returns `data`, or fails with Prometheus's own error text."""
        url = f"{self.url}/api/v1/{path.lstrip('/')}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (evaluated now, or at `at`)."""
        return self.api("query", query=expr, time=f"{time.time() if at is None else at:.3f}")["result"]

    def wait_for(self, expr: str, predicate: Callable[[list[dict[str, Any]]], bool] = bool,
                 timeout: float = 30.0) -> list[dict[str, Any]]:
        """Query until `predicate(result)` holds; fails naming the query and its last result."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus never satisfied the wait on {expr} in {timeout:g} s: last {result}")
            time.sleep(0.2)

    def targets_up(self) -> list[dict[str, Any]]:
        return [t for t in self.api("targets")["activeTargets"] if t["health"] == "up"]

    def stop(self) -> None:
        stop_process(self.proc)
        self._log_handle.close()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
