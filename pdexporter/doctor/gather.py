"""The I/O edge of `pdexporter doctor`: ask the engine, Prometheus and the OTLP receiver, and write
down what they answered (`checks.EngineFacts`, `checks.EndpointFacts`); `checks` judges it."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from pdexporter._internal.redact import redact_url
from pdexporter._internal.text import body_reason
from pdexporter.client.client import (
    COMPLETIONS_PATH,
    ClientTimeouts,
    EngineClient,
    completion_request,
    encode_body,
)
from pdexporter.client.identity import ask_identity, settle_engine
from pdexporter.client.iterlog import IterationLogTail
from pdexporter.client.stream import TokenStream
from pdexporter.doctor.checks import EndpointFacts, EngineFacts, TraceArrival, TracingImports
from pdexporter.engines import DEFAULT_ENGINE, adapter
from pdexporter.errors import EngineError, PdexporterError
from pdexporter.exporter.tracing import ENDPOINT_VARS
from pdexporter.launch import EngineHandle

__all__ = [
    "STEP_LOG_WAIT_S", "TEST_PROMPT", "TEST_TOKENS", "TIMEOUTS", "TraceListener", "check_command", "engine_facts",
    "engine_python", "listen_for_traces", "otlp_facts", "otlp_url", "prometheus_facts", "trace_arrival",
    "tracing_imports",
]

TIMEOUTS = ClientTimeouts(connect_s=3.0, read_s=60.0, request_s=10.0)
TEST_PROMPT = tuple(range(1000, 1016))  # 16 token ids: any vocabulary has them
TEST_TOKENS = 4
STEP_LOG_WAIT_S = 2.0  # the engine writes its step lines a moment after the tokens


async def engine_facts(handle: EngineHandle, *, embedded: bool, model: str | None = None,
                       api_key: str | None = None, chunk_size: int | None = None,
                       cudagraph_max_tokens: int | None = None) -> EngineFacts:
    """Everything `checks.engine_checks` needs, asked of the engine at `handle.url`."""
    facts: dict[str, Any] = {"url": redact_url(handle.url), "embedded": embedded, "model_wanted": model,
                             "chunk_size": chunk_size, "cuda_graphs": handle.cuda_graphs,
                             "cudagraph_max_tokens": cudagraph_max_tokens if handle.cuda_graphs else None,
                             "engine_claimed": handle.kind}
    async with EngineClient(handle.url, api_key=api_key, timeouts=TIMEOUTS, retries=1) as client:
        started = time.perf_counter()
        try:
            await client.get_text("/health", retry=False)
        except EngineError as exc:
            return EngineFacts(**facts, health_error=str(exc))
        facts["health_ms"] = (time.perf_counter() - started) * 1e3
        identity = await ask_identity(client)
        facts.update(identity=dict(identity.payload) if identity.path else None, identity_path=identity.path,
                     identity_error="; ".join(identity.errors) or None,
                     engine=identity.found.name if identity.found else None)
        settled: str | None
        try:
            settled = settle_engine(handle.kind, identity.found, handle.url)
        except PdexporterError as exc:  # told one engine, answering as another: said by the version check
            facts["identity_error"] = str(exc)
            settled = (handle.kind or identity.found.name) if identity.found else handle.kind
        if identity.found is not None and settled:
            facts["engine"] = settled
        try:
            facts["models"] = await _models(client)
        except EngineError as exc:
            facts["models_error"] = str(exc)
        served = [str(m.get("id")) for m in facts.get("models") or ()]
        chosen = model if model in served else (served[0] if served and model is None else None)
        if chosen is not None:
            rule = adapter(settled) if settled else None
            log = (IterationLogTail(handle.iteration_log, rule.parse_step_log)
                   if handle.iteration_log and rule is not None else None)
            mark = log.mark() if log else 0
            facts.update(await _stream(client, chosen))
            if log is not None:
                facts["step_log"] = str(handle.iteration_log)
                facts["step_log_steps"] = await _steps_logged(log, mark)
        # after the test request: an engine that creates its series on first use (SGLang) shows them now
        try:
            facts["metrics_text"] = await client.get_text("/metrics", retry=False)
        except EngineError as exc:
            facts["metrics_error"] = str(exc)
    return EngineFacts(**facts)


async def _models(client: EngineClient) -> list[dict[str, Any]]:
    return await client.model_entries(retry=False)


async def _stream(client: EngineClient, model: str) -> dict[str, Any]:
    stream = TokenStream("doctor-0", "doctor")
    body = encode_body(completion_request(model, TEST_PROMPT, TEST_TOKENS))
    started = time.perf_counter()
    try:
        await client.stream_into(COMPLETIONS_PATH, body, stream)
    except EngineError as exc:
        return {"stream_error": str(exc)}
    return {"stream_tokens": stream.n_tokens, "stream_ms": (time.perf_counter() - started) * 1e3}


async def _steps_logged(log: IterationLogTail, mark: int) -> int:
    deadline = time.monotonic() + STEP_LOG_WAIT_S
    while True:
        steps = [s for s in log.read_since(mark) if s.context_tokens or s.generation_tokens]
        if steps or time.monotonic() > deadline:
            return len(steps)
        await asyncio.sleep(0.05)


def prometheus_facts(url: str | None) -> EndpointFacts:
    from pdexporter.exporter.prometheus import PrometheusAPI

    if url is None:
        return EndpointFacts("prometheus", None)
    try:
        api = PrometheusAPI(url, timeout_s=5.0)
        info = api.build_info()
        exporters = api.query("count(pdexporter_build_info)")
    except PdexporterError as exc:
        return EndpointFacts("prometheus", url, "--prometheus", error=str(exc))
    count = int(float(exporters[0]["value"][1])) if exporters else 0
    scraped = (f"scrapes {count} pdexporter exporter(s)" if count
               else "holds no pdexporter series yet (export-table --prometheus needs the exporter scraped)")
    return EndpointFacts("prometheus", url, "--prometheus",
                         detail=f"answered: Prometheus {info.get('version', '?')}, {scraped}",
                         extra={"exporters": count})


def otlp_url(given: str | None, env: Mapping[str, str] = os.environ) -> tuple[str | None, str]:
    """The OTLP/HTTP traces URL the exporter would send to, and what named it."""
    if given:
        return _traces_path(given), "--otlp"
    if env.get(ENDPOINT_VARS[0], "").strip():
        return env[ENDPOINT_VARS[0]].strip(), ENDPOINT_VARS[0]  # the full traces URL, as the SDK takes it
    if env.get(ENDPOINT_VARS[1], "").strip():
        return _traces_path(env[ENDPOINT_VARS[1]].strip()), ENDPOINT_VARS[1]
    return None, ""


def _traces_path(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


def otlp_facts(given: str | None, env: Mapping[str, str] = os.environ, timeout_s: float = 5.0) -> EndpointFacts:
    """POST an empty ExportTraceServiceRequest (zero bytes of protobuf): a receiver accepts it
    with 2xx and stores nothing."""
    url, source = otlp_url(given, env)
    if url is None:
        return EndpointFacts("otlp", None)
    if not url.startswith(("http://", "https://")):
        return EndpointFacts("otlp", url, source, error="expected an http:// or https:// URL (OTLP/HTTP)")
    request = urllib.request.Request(url, data=b"", method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (user-given URL)
            status = response.status
    except urllib.error.HTTPError as exc:
        return EndpointFacts("otlp", url, source, error=f"answered HTTP {exc.code}: {body_reason(exc.read())}")
    except urllib.error.URLError as exc:
        return EndpointFacts("otlp", url, source, error=f"cannot connect ({_os_reason(exc.reason)})")
    except (TimeoutError, OSError) as exc:
        return EndpointFacts("otlp", url, source, error=f"cannot connect ({_os_reason(exc)})")
    except http.client.HTTPException as exc:  # a server that does not speak HTTP (BadStatusLine, ...)
        return EndpointFacts("otlp", url, source, error=f"not an HTTP answer ({_os_reason(exc)})")
    return EndpointFacts("otlp", url, source, detail=f"accepted an empty trace export (HTTP {status})")


def _os_reason(reason: object) -> str:
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return " ".join(str(reason).split()) or type(reason).__name__


# --- tracing: the engine's OpenTelemetry imports, and one span awaited at a receiver -------------

# Run in the engine's Python: its tracing imports (`EngineAdapter.tracing_imports`; vLLM 0.22's), in
# order, stopping at the first failure; one JSON line out.
_PROBE = """
import importlib, json, sys
out = {"ok": True}
for module, names in json.loads(sys.argv[1]):
    try:
        loaded = importlib.import_module(module)
        for name in names:
            getattr(loaded, name)
    except Exception as exc:
        out = {"ok": False, "failed_import": module, "missing": getattr(exc, "name", None),
               "error": type(exc).__name__ + ": " + str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
        break
try:
    from importlib import metadata
    out["api_version"] = metadata.version("opentelemetry-api")
except Exception:
    out["api_version"] = None
print(json.dumps(out))
"""


def check_command(engine: str) -> str:
    """The one line to run in the engine's Python on its host (what the import check runs)."""
    modules = ", ".join(module for module, _ in adapter(engine).tracing_imports)
    return f'python3 -c "import {modules}"'


def engine_python(command: str) -> str | None:
    """The interpreter an engine command runs in: its first word when that is a Python, else the
    shebang of the script it names (`vllm serve ...` -> the Python `vllm` was installed for)."""
    import shlex
    import shutil

    words = [w for w in shlex.split(command) if "=" not in w.split("/")[0]]  # skip VAR=value prefixes
    if not words:
        return None
    first = words[0]
    if os.path.basename(first).startswith("python"):
        return shutil.which(first) or first
    path = shutil.which(first)
    if path is None:
        return None
    try:
        with open(path, "rb") as script:
            line = script.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not line.startswith("#!"):
        return None
    parts = line[2:].split()
    if parts and os.path.basename(parts[0]) == "env" and len(parts) > 1:
        return shutil.which(parts[1]) or parts[1]
    return parts[0] if parts else None


def tracing_imports(python: str | None, source: str = "", engine: str = DEFAULT_ENGINE, *, embedded: bool = False,
                    timeout_s: float = 60.0) -> TracingImports:
    """The engine's tracing imports (its adapter's; vLLM 0.22's), tried in `python` (None: cannot be
    checked from here)."""
    import subprocess

    if python is None:
        return TracingImports(None, source, embedded=embedded, check_command=check_command(engine))
    spec = json.dumps([[m, list(n)] for m, n in adapter(engine).tracing_imports])
    try:
        done = subprocess.run([python, "-c", _PROBE, spec], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return TracingImports(python, source, embedded=embedded, run_error=f"cannot run it ({reason})")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return TracingImports(python, source, embedded=embedded,
                              run_error=f"not a Python that runs the check (exit {done.returncode}: {tail})")
    got = json.loads(lines[-1])
    return TracingImports(python, source, embedded=embedded, ok=bool(got.get("ok")),
                          failed_import=got.get("failed_import"), missing=got.get("missing"),
                          error=got.get("error"), api_version=got.get("api_version"))


async def trace_arrival(url: str, model: str, receiver: tuple[str, int], engine: str, *, api_key: str | None = None,
                        wait_s: float = 15.0, listener: TraceListener | None = None) -> TraceArrival:
    """Send one short request to the engine at `url` and wait for its span at `receiver` (host,
    port): pdexporter's own OTLP receiver (`exporter.receiver`, the exporter's code) listening there
    (`listener`, when the caller had to listen before the engine started), or, when something
    already listens there, the request-trace counters on that exporter's /metrics."""
    from pdexporter.client.traces import RequestTrace

    host, port = receiver
    spans: list[tuple[float, RequestTrace]] = []
    own = None
    if listener is None:
        with contextlib.suppress(OSError):
            own = listener = await listen_for_traces(host, port)
    if listener is not None:
        listener.engine = engine  # whose spans it decodes
        port = listener.port
        listener.sink = lambda traces: spans.extend((time.perf_counter(), t) for t in traces)
    where = f"http://{host}:{port}/v1/traces"
    how = "listened" if listener is not None else "exporter"
    before = _exporter_spans(host, port) if listener is None else None
    if listener is None and before is None:
        return TraceArrival(where, how, error="the port is taken by something that is not a pdexporter exporter")
    try:
        async with EngineClient(url, api_key=api_key, timeouts=TIMEOUTS, retries=1) as client:
            result = await _stream(client, model)
        if "stream_error" in result:
            return TraceArrival(where, how, error=f"the test request failed: {result['stream_error']}")
        ended = time.perf_counter()
        while time.perf_counter() < ended + wait_s:
            if listener is not None:
                hit = [t for t, span in spans if span.prompt_tokens == len(TEST_PROMPT)
                       and span.max_tokens in (None, TEST_TOKENS)]
                if hit:
                    return TraceArrival(where, how, delay_s=max(0.0, hit[0] - ended), waited_s=wait_s)
            else:
                now = await asyncio.to_thread(_exporter_spans, host, port)
                if now is not None and before is not None and now > before:
                    return TraceArrival(where, how, delay_s=time.perf_counter() - ended, waited_s=wait_s)
            await asyncio.sleep(0.1 if listener is not None else 0.5)
        return TraceArrival(where, how, waited_s=wait_s)
    finally:
        if own is not None:
            await own.stop()


class TraceListener:
    """pdexporter's OTLP/HTTP receiver (`exporter.receiver.traces_app`, the exporter's own code) on
    a port of its own, handing decoded spans to `sink`; it decodes them as `engine`'s (its adapter's
    span names; an export before the engine is known is answered 503, which exporters retry)."""

    def __init__(self, runner: Any, port: int, engine: str | None = None) -> None:
        self.runner, self.port, self.engine = runner, port, engine
        self.sink: Callable[[list[Any]], None] = lambda traces: None

    async def stop(self) -> None:
        await self.runner.cleanup()


async def listen_for_traces(host: str, port: int, engine: str | None = None) -> TraceListener:
    from pdexporter.exporter.receiver import traces_app
    from pdexporter.exporter.server import start_server

    holder: list[TraceListener] = []
    app = traces_app(lambda t: holder[0].sink(t), engine=lambda: holder[0].engine if holder else None)
    runner, bound = await start_server(app, host, port)
    listener = TraceListener(runner, bound, engine)
    holder.append(listener)
    return listener


def _exporter_spans(host: str, port: int) -> float | None:
    """All request spans a running exporter's trace receiver at host:port counted (its own
    /metrics: `exporter.receiver.RECEIVER_SERIES`; None: not an exporter there)."""
    from prometheus_client.parser import text_string_to_metric_families

    from pdexporter.exporter.metrics import REQUEST_TRACES

    name = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    try:
        with urllib.request.urlopen(f"http://{name}:{port}/metrics", timeout=3.0) as response:  # noqa: S310
            text = response.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError, http.client.HTTPException):
        return None
    total, seen = 0.0, False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == REQUEST_TRACES:
                total += sample.value
                seen = True
    return total if seen else None
