"""Prometheus exposition over aiohttp: a thin adapter over prometheus_client's pure core.

`/metrics` (text format, or OpenMetrics when the scraper asks for it), three health endpoints and
a small landing page at `/`. Used by `pdexporter run` and by `pdexporter sweep --listen`.

- `/livez`: 200 whenever the server's event loop answers. It depends on nothing else, the engine
  least of all: a liveness probe on it never kills an exporter whose engine is still loading.
- `/readyz`: 200 while `/metrics` can be served (the registry collects), 503 with the error if
  not. It stays 200 while the engine is down, so Prometheus keeps scraping `pdexporter_up 0`.
- `/healthz`: the caller's `healthy()` (for `pdexporter run`: the probe thread is alive); 503 when
  it says no.
- `/thresholds.yaml` (`run --passive --decision FILE`): the llm-d decider configuration for the
  current load, its age and the events behind it (`exporter.passive_live`); 503 until computed.
- A bearer token (`token`, `run --metrics-token-file`) guards `/metrics`, `/thresholds.yaml` and `/`; the health
  paths stay open (kubelet probes carry no token, and they say nothing but ok).

`pdexporter run --passive` also serves the OTLP trace receiver, on a port of its own
(`exporter.receiver`); `start_server` serves either app, over TLS when given a context
(`tls_context`). docs/security.md is the exposure model.
"""

from __future__ import annotations

import html
import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from pdexporter import __version__
from pdexporter._internal.httplog import quiet_malformed_requests
from pdexporter.errors import ConfigError
from pdexporter.exporter.receiver import bearer_ok

__all__ = [
    "OPEN_PATHS", "THRESHOLDS_PATH", "metrics_app", "parse_listen", "start_metrics_server", "start_server",
    "tls_context",
]

OPEN_PATHS = frozenset({"/livez", "/readyz", "/healthz"})  # served without the token
THRESHOLDS_PATH = "/thresholds.yaml"  # run --passive --decision: the llm-d decider configuration, live


def metrics_app(
    registry: CollectorRegistry,
    *,
    title: str = "pdexporter",
    healthy: Callable[[], bool] = lambda: True,
    links: dict[str, str] | None = None,
    token: str | None = None,
    thresholds: Callable[[], tuple[int, str, dict[str, str]]] | None = None,
) -> web.Application:
    """`thresholds()`: (status, YAML text, headers) of `GET /thresholds.yaml` (`run --passive
    --decision`: the llm-d decider configuration for the current load), guarded like /metrics."""
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

    @web.middleware
    async def guard(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if request.path not in OPEN_PATHS and not bearer_ok(request, token):
            return web.Response(status=401, text="a bearer token is required (Authorization: Bearer ...)\n",
                                headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    app = web.Application(client_max_size=64 * 1024, middlewares=[guard] if token is not None else [])
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", landing)
    if thresholds is not None:
        provider = thresholds

        async def thresholds_yaml(_: web.Request) -> web.Response:
            status, text, headers = provider()
            return web.Response(status=status, text=text, content_type="application/yaml" if status == 200
                                else "text/plain", headers=headers)

        app.router.add_get(THRESHOLDS_PATH, thresholds_yaml)
    return app


async def start_server(app: web.Application, host: str, port: int,
                       tls: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (call `cleanup()` to stop) and the bound port. aiohttp's
    own request decompression is off: the trace receiver inflates with a limit (`exporter.receiver`);
    a malformed request is answered 400 without a traceback on stderr (`quiet_malformed_requests`)."""
    quiet_malformed_requests()
    runner = web.AppRunner(app, access_log=None, auto_decompress=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    # port 0 -> the port the OS chose; aiohttp types its server AbstractServer, it is an asyncio.Server
    sockets = site._server.sockets if site._server else ()  # type: ignore[attr-defined]
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)


start_metrics_server = start_server  # the name its callers know


def tls_context(cert_file: str | None, key_file: str | None) -> ssl.SSLContext | None:
    """A server TLS context from PEM files (`--tls-cert-file`, `--tls-key-file`), or None without them."""
    if cert_file is None and key_file is None:
        return None
    if cert_file is None or key_file is None:
        raise ConfigError("--tls-cert-file and --tls-key-file go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as exc:
        raise ConfigError(f"--tls-cert-file {cert_file} / --tls-key-file {key_file}: {exc.strerror} "
                          f"({exc.filename or ''})") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"--tls-cert-file {cert_file} / --tls-key-file {key_file}: not a PEM certificate "
                          f"and its key ({getattr(exc, 'reason', None) or exc})") from None
    return context


def parse_listen(value: str, option: str = "--listen") -> tuple[str, int]:
    """`HOST:PORT` or `:PORT` or `PORT`."""
    host, _, port = value.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{option} {value!r}: expected HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"{option} {value!r}: port out of range")
    return (host or "0.0.0.0").strip("[]"), number
