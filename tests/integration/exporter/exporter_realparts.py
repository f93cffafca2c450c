"""Real parts for the exporter's integration tests beside `tests.prometheus_server`:

- `OtlpReceiver`: an aiohttp server on `/v1/traces` that decodes the OTLP protobuf payload
  (`ExportTraceServiceRequest`, opentelemetry-proto) exactly as a collector would.
"""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.helpers import stop_process

ROOT = Path(__file__).resolve().parents[3]


class OtlpReceiver:
    """An OTLP/HTTP trace receiver in its own process (its protobuf decoding must not share the
    exporter's GIL): `python -m tests.integration.exporter.exporter_realparts otlp-receiver DIR`.
    It decodes every POST to /v1/traces as `ExportTraceServiceRequest` (400 if that fails, like a
    collector) and keeps the decompressed body in DIR; `spans()` decodes them again here."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        port_file = workdir / "port"
        self._log = (workdir / "receiver.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.exporter.exporter_realparts", "otlp-receiver", str(workdir)],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"OTLP receiver did not start: {(workdir / 'receiver.log').read_text()}")
            time.sleep(0.05)
        time.sleep(0.05)
        self.port = int(port_file.read_text())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self) -> list[tuple[str, bytes]]:
        """(content type, decompressed body) of every export request received so far."""
        out = []
        for path in sorted(self.workdir.glob("req-*.pb"), key=lambda p: int(p.stem.split("-")[1])):
            out.append((path.with_suffix(".type").read_text(), path.read_bytes()))
        return out

    def spans(self) -> list[tuple[dict[str, Any], str, Any]]:
        """(resource attributes, scope name, span) for every span received."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        spans = []
        for _, body in self.requests():
            message = ExportTraceServiceRequest()
            message.ParseFromString(body)
            for resource_spans in message.resource_spans:
                resource = {kv.key: _any_value(kv.value) for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        spans.append((resource, scope_spans.scope.name, span))
        return spans

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


def _serve_otlp(workdir: Path) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    count = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal count
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        try:
            message.ParseFromString(body)
        except Exception as exc:  # noqa: BLE001 - a collector answers 400 to a bad payload
            return web.Response(status=400, text=f"not an ExportTraceServiceRequest: {exc}")
        path = workdir / f"req-{count}.pb"
        path.with_suffix(".type").write_text(request.headers.get("Content-Type", ""))
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(body)
        tmp.replace(path)
        count += 1
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        (workdir / "port.tmp").write_text(str(port))
        (workdir / "port.tmp").replace(workdir / "port")
        await asyncio.Event().wait()

    asyncio.run(main())


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def attributes(span: Any) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in span.attributes}




if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "otlp-receiver":
        _serve_otlp(Path(sys.argv[2]))
    else:
        raise SystemExit("usage: python -m tests.integration.exporter.exporter_realparts otlp-receiver DIR")
