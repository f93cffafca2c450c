"""Prometheus exposition over aiohttp: a thin adapter over prometheus_client's pure core.

`/metrics` (text format, or OpenMetrics when the scraper asks for it), three health endpoints and
a small landing page at `/`. Used by `pdexporter run` and by `pdexporter sweep --listen`.

- `/livez`: 200 whenever the server's event loop answers. It depends on nothing else, the engine
  least of all: a liveness probe on it never kills an exporter whose engine is still loading.
- `/readyz`: 200 while `/metrics` can be served (the registry collects), 503 with the error if
  not. It stays 200 while the engine is down, so Prometheus keeps scraping `pdexporter_up 0`.
- `/healthz`: the caller's `healthy()` (for `pdexporter run`: the probe thread is alive); 503 when
  it says no.
- `POST /v1/traces` (when the caller takes traces: `pdexporter run`): an OTLP/HTTP trace receiver
  for the engine's per-request spans (vLLM: `--otlp-traces-endpoint http://pdexporter:18742/v1/traces`
  with `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`, or a collector forwarding to it). The
  body is decoded by `engine.traces.decode_traces` and handed to `traces_sink`; the answer is an
  empty `ExportTraceServiceResponse` (200), or 400 / 415 with the reason, as a collector answers.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from pdexporter import __version__

if TYPE_CHECKING:
    from pdexporter.engine.traces import RequestTrace

__all__ = [
    "metrics_app", "parse_listen", "start_metrics_server",
]

_EMPTY_EXPORT_RESPONSE = b""  # ExportTraceServiceResponse() serialises to no bytes: full success


def metrics_app(
    registry: CollectorRegistry,
    *,
    title: str = "pdexporter",
    healthy: Callable[[], bool] = lambda: True,
    links: dict[str, str] | None = None,
    traces_sink: Callable[[list[RequestTrace]], None] | None = None,
    on_export: Callable[[bool], None] | None = None,
    engine: str | None = None,
) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def healthz(_: web.Request) -> web.Response:
        ok = healthy()
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "unhealthy\n")

    async def livez(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        try:
            for _family in registry.collect():  # what /metrics does, without encoding the text
                pass
        except Exception as exc:  # noqa: BLE001 - any failure means /metrics would fail too
            return web.Response(status=503, text=f"not ready: /metrics fails: {type(exc).__name__}: {exc}\n")
        return web.Response(text="ready\n")

    async def landing(_: web.Request) -> web.Response:
        extra = "".join(
            f'<li><a href="{html.escape(href)}">{html.escape(name)}</a></li>' for name, href in (links or {}).items()
        )
        page = (
            f"<!doctype html><html><head><title>{html.escape(title)}</title></head><body>"
            f"<h1>{html.escape(title)} {html.escape(__version__)}</h1>"
            "<ul>"
            + "".join(f'<li><a href="{path}">{path}</a></li>' for path in ("/metrics", "/healthz", "/livez", "/readyz"))
            + f"{extra}</ul>"
            "</body></html>"
        )
        return web.Response(text=page, content_type="text/html")

    async def traces(request: web.Request) -> web.Response:
        from pdexporter.engine.traces import PROTOBUF, TraceDecodeError, decode_traces

        content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != PROTOBUF:
            if on_export is not None:
                on_export(False)
            return web.Response(status=415, text=f"expected Content-Type {PROTOBUF} (OTLP/HTTP protobuf), "
                                                 f"got {content_type or 'none'}\n")
        try:
            # aiohttp has already undone a gzip/deflate Content-Encoding (auto_decompress)
            decoded = decode_traces(await request.read(), engine=engine)
        except TraceDecodeError as exc:
            if on_export is not None:
                on_export(False)
            return web.Response(status=400, text=f"{exc}\n")
        if on_export is not None:
            on_export(True)
        assert traces_sink is not None
        traces_sink(decoded)
        return web.Response(body=_EMPTY_EXPORT_RESPONSE, content_type=PROTOBUF)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    if traces_sink is not None:
        app.router.add_post("/v1/traces", traces)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", landing)
    return app


async def start_metrics_server(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (call `cleanup()` to stop) and the bound port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = site._server.sockets if site._server else ()  # port 0 -> the port the OS chose
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` or `:PORT` or `PORT`."""
    from pdexporter.errors import ConfigError

    host, _, port = value.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"--listen {value!r}: expected HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"--listen {value!r}: port out of range")
    return (host or "0.0.0.0").strip("[]"), number
