"""Real parts for the exporter's integration tests: a Prometheus server, an OTLP/HTTP receiver.

- `PrometheusServer`: Debian's `/usr/bin/prometheus`, started with its own scrape config (1 s
  interval) pointing at the exporter, its TSDB in a temp dir, on a free port; queried over its
  HTTP API.
- `OtlpReceiver`: an aiohttp server on `/v1/traces` that decodes the OTLP protobuf payload
  (`ExportTraceServiceRequest`, opentelemetry-proto) exactly as a collector would.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    def __init__(self, workdir: Path, targets: list[str], scrape_interval: str = "1s") -> None:
        self.port = free_port()
        self.workdir = workdir
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {scrape_interval}\n"
            f"  evaluation_interval: {scrape_interval}\n"
            "scrape_configs:\n"
            "  - job_name: pdexporter\n"
            f"    static_configs:\n      - targets: {json.dumps(targets)}\n"
        )
        self.log = workdir / "prometheus.log"
        self._log_handle = self.log.open("wb")
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=5) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)["result"]

    def targets_up(self) -> list[dict[str, Any]]:
        return [t for t in self.api("targets")["activeTargets"] if t["health"] == "up"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_handle.close()


@dataclass
class OtlpReceiver:
    """Decodes every POST to /v1/traces; `spans` are (resource attributes, scope name, span proto)."""

    port: int = 0
    requests: int = 0
    spans: list[tuple[dict[str, Any], str, Any]] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stop: asyncio.Event | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.content_types.add(request.headers.get("Content-Type", ""))
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        self.requests += 1
        for resource_spans in message.resource_spans:
            resource = {kv.key: _any_value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append((resource, scope_spans.scope.name, span))
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def start(self) -> OtlpReceiver:
        ready = threading.Event()

        async def main() -> None:
            app = web.Application()
            app.router.add_post("/v1/traces", self._handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            ready.set()
            await self._stop.wait()
            await runner.cleanup()

        self._thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        self._thread.start()
        assert ready.wait(10)
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(5)


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def attributes(span: Any) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in span.attributes}


