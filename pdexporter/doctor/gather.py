"""The I/O edge of `pdexporter doctor`: ask the engine, Prometheus and the OTLP receiver, and write
down what they answered (`checks.EngineFacts`, `checks.EndpointFacts`); `checks` judges it."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from pdexporter._internal.text import body_reason
from pdexporter.doctor.checks import EndpointFacts, EngineFacts
from pdexporter.engine.client import COMPLETIONS_PATH, ClientTimeouts, EngineClient, completion_request, encode_body
from pdexporter.engine.iterlog import IterationLogTail
from pdexporter.engine.stream import TokenStream
from pdexporter.engines import adapter, identify
from pdexporter.errors import EngineError, PdexporterError
from pdexporter.exporter.tracing import ENDPOINT_VARS
from pdexporter.launch import EngineHandle

__all__ = [
    "STEP_LOG_WAIT_S", "TEST_PROMPT", "TEST_TOKENS", "TIMEOUTS", "engine_facts", "otlp_facts", "otlp_url",
    "prometheus_facts",
]

TIMEOUTS = ClientTimeouts(connect_s=3.0, read_s=60.0, request_s=10.0)
TEST_PROMPT = tuple(range(1000, 1016))  # 16 token ids: any vocabulary has them
TEST_TOKENS = 4
STEP_LOG_WAIT_S = 2.0  # the engine writes its step lines a moment after the tokens


async def engine_facts(handle: EngineHandle, *, embedded: bool, model: str | None = None,
                       api_key: str | None = None, chunk_size: int | None = None,
                       cudagraph_max_tokens: int | None = None) -> EngineFacts:
    """Everything `checks.engine_checks` needs, asked of the engine at `handle.url`."""
    facts: dict[str, Any] = {"url": handle.url, "embedded": embedded, "model_wanted": model,
                             "chunk_size": chunk_size, "cuda_graphs": handle.cuda_graphs,
                             "cudagraph_max_tokens": cudagraph_max_tokens if handle.cuda_graphs else None}
    async with EngineClient(handle.url, api_key=api_key, timeouts=TIMEOUTS, retries=1) as client:
        started = time.perf_counter()
        try:
            await client.get_text("/health", retry=False)
        except EngineError as exc:
            return EngineFacts(**facts, health_error=str(exc))
        facts["health_ms"] = (time.perf_counter() - started) * 1e3
        try:
            payload = json.loads(await client.get_text("/version", retry=False))
            facts["version"] = payload if isinstance(payload, dict) else {"version": str(payload)}
        except (EngineError, ValueError) as exc:
            facts["version_error"] = str(exc) if isinstance(exc, EngineError) else "not JSON"
        try:
            facts["models"] = await _models(client)
        except EngineError as exc:
            facts["models_error"] = str(exc)
        try:
            facts["metrics_text"] = await client.get_text("/metrics", retry=False)
        except EngineError as exc:
            facts["metrics_error"] = str(exc)
        served = [str(m.get("id")) for m in facts.get("models") or ()]
        chosen = model if model in served else (served[0] if served and model is None else None)
        if chosen is not None:
            rule = identify(facts.get("version") or {}) or adapter(handle.kind)
            log = IterationLogTail(handle.iteration_log, rule.parse_step_log) if handle.iteration_log else None
            mark = log.mark() if log else 0
            facts.update(await _stream(client, chosen))
            if log is not None:
                facts["step_log"] = str(handle.iteration_log)
                facts["step_log_steps"] = await _steps_logged(log, mark)
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
    from pdexporter.analysis.prometheus import PrometheusAPI

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
    return EndpointFacts("otlp", url, source, detail=f"accepted an empty trace export (HTTP {status})")


def _os_reason(reason: object) -> str:
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return " ".join(str(reason).split()) or type(reason).__name__
