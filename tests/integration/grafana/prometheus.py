"""A real Prometheus (Debian's /usr/bin/prometheus) started by a test, with its own config and data dir."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str | float) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
            return json.loads(resp.read())

    def api(self, path: str, **params: str | float) -> Any:
        """GET /api/v1/...; returns `data`, raises with Prometheus's own error text."""
        try:
            body = self.get(path, **params)
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> Any:
        return self.api("/api/v1/query", query=expr, time=at if at is not None else time.time())

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)["result"]
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.5)


@contextmanager
def running_prometheus(tmp: Path, scrape_targets: list[str], interval: str = "1s") -> Iterator[Prometheus]:
    port = free_port()
    targets = json.dumps(scrape_targets)
    (tmp / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
        f"scrape_configs:\n  - job_name: pdexporter\n    static_configs:\n      - targets: {targets}\n"
    )
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    prom = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {(tmp / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
