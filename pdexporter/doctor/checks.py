"""What the numbers will rest on, judged: pure functions from what was seen to one verdict per check.

`gather` (the I/O edge) asks the engine, Prometheus and the OTLP receiver and writes down what
they answered (`EngineFacts`, `EndpointFacts`); `evaluate` turns that into `Check`s: one line
each, `ok`, `warn` (the numbers can be had, but rest on an assumption or an estimate), `fail`
(they cannot be had, or would be wrong) or `skip` (not asked for, or not reachable past an
earlier failure). A failed check makes `pdexporter doctor` exit non-zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pdexporter._internal.text import plural
from pdexporter.client.metrics import parse_exposition
from pdexporter.engines import UNIDENTIFIED, EngineAdapter, adapter
from pdexporter.errors import EngineError

__all__ = [
    "ENGINE_CHECKS",
    "LARGEST_GRID_PROMPT",
    "OTEL_WHEELS",
    "Check",
    "EndpointFacts",
    "EngineFacts",
    "Status",
    "TraceArrival",
    "TracingImports",
    "endpoint_check",
    "engine_checks",
    "evaluate",
    "failed",
    "trace_arrival_check",
    "tracing_imports_check",
    "wheel_for",
]

Status = Literal["ok", "warn", "fail", "skip"]

# The spec's grid goes up to P = 32768 (docs/spec.md, sweeps/seed.yaml); a prompt must leave room
# for the one token the injected prefill asks for.
LARGEST_GRID_PROMPT = 32768


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    why: str


@dataclass(frozen=True)
class EngineFacts:
    """What the engine answered (None where it was not asked or did not answer)."""

    url: str
    embedded: bool  # pdexporter started its embedded engine for this
    health_error: str | None = None
    health_ms: float | None = None
    # who it is: the adapter that recognised its identity answer (None: none did), the answer and
    # where it came from (vLLM's /version, SGLang's /server_info), or why none answered
    engine: str | None = None
    identity: Mapping[str, Any] | None = None
    identity_path: str | None = None
    identity_error: str | None = None
    engine_claimed: str | None = None  # --engine, or the launcher's engine
    models: Sequence[Mapping[str, Any]] | None = None
    models_error: str | None = None
    model_wanted: str | None = None  # --model
    metrics_text: str | None = None
    metrics_error: str | None = None
    stream_error: str | None = None
    stream_tokens: int = 0
    stream_ms: float | None = None
    chunk_size: int | None = None  # --chunk-size, or what the embedded engine was started with
    step_log: str | None = None  # the engine's log file, when pdexporter can read it
    step_log_steps: int | None = None  # steps it logged for the test request
    cuda_graphs: bool | None = None  # known only when pdexporter knows how the engine was started
    cudagraph_max_tokens: int | None = None


@dataclass(frozen=True)
class EndpointFacts:
    """A Prometheus or OTLP endpoint: where it came from and what it answered."""

    kind: Literal["prometheus", "otlp"]
    url: str | None
    source: str = ""  # the flag or variable that named it
    error: str | None = None
    detail: str = ""  # what it said when it answered (Prometheus' version, the HTTP status)
    extra: dict[str, Any] = field(default_factory=dict)


# module prefix -> the wheel that brings it (longest prefix wins): the fix a missing import names.
OTEL_WHEELS: dict[str, str] = {
    "opentelemetry.exporter.otlp.proto.grpc": "opentelemetry-exporter-otlp-proto-grpc",
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry.exporter.otlp.proto.common": "opentelemetry-exporter-otlp-proto-common",
    "opentelemetry.exporter.otlp.common": "opentelemetry-exporter-otlp-common",
    "opentelemetry.exporter.http.transport": "opentelemetry-exporter-http-transport",
    "opentelemetry.proto": "opentelemetry-proto",
    "opentelemetry.semconv": "opentelemetry-semantic-conventions",
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry": "opentelemetry-api",
    "grpc": "grpcio",
    "google.rpc": "googleapis-common-protos",
    "google.protobuf": "protobuf",
    "requests": "requests",
    "urllib3": "urllib3",
}


def wheel_for(module: str) -> str:
    """The wheel that provides `module` (OpenTelemetry's split packages), else the module's top name."""
    for prefix in sorted(OTEL_WHEELS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return OTEL_WHEELS[prefix]
    return module.split(".")[0]


@dataclass(frozen=True)
class TracingImports:
    """The engine's OpenTelemetry imports, tried in its own Python (`gather.tracing_imports`)."""

    python: str | None  # the interpreter; None: the engine runs elsewhere (or is the embedded one)
    source: str = ""  # where the interpreter came from (--engine-python, --engine-command)
    embedded: bool = False
    ok: bool = False
    failed_import: str | None = None  # the import statement's module that failed
    missing: str | None = None  # the module Python could not find (ModuleNotFoundError.name)
    error: str | None = None
    api_version: str | None = None  # opentelemetry-api in that Python, to match the other wheels to
    run_error: str | None = None  # the interpreter could not be run
    check_command: str = ""  # what to run on the engine's host instead


@dataclass(frozen=True)
class TraceArrival:
    """One short request's span, awaited at an OTLP receiver (`gather.trace_arrival`)."""

    receiver: str | None  # where the engine's --otlp-traces-endpoint points; None: not asked
    how: str = ""  # "listened" (doctor's own receiver) or "exporter" (a running exporter's counters)
    delay_s: float | None = None  # request end -> its span at the receiver
    waited_s: float = 0.0
    error: str | None = None  # the request or the receiver failed


def tracing_imports_check(f: TracingImports) -> Check:
    name = "tracing imports"
    if f.embedded and f.python is None:
        return Check(name, "ok", "the embedded engine exports its spans with pdexporter's own OpenTelemetry SDK")
    if f.python is None:
        return Check(name, "warn", "cannot check from here (the engine runs elsewhere): before turning on "
                                   "--otlp-traces-endpoint, run in the engine's Python on its host: "
                                   f"{f.check_command} (or pass --engine-python / --engine-command)")
    if f.run_error is not None:
        return Check(name, "fail", f"{f.source} {f.python}: {f.run_error}")
    if f.ok:
        version = f" (opentelemetry-api {f.api_version})" if f.api_version else ""
        return Check(name, "ok", f"{f.python} imports everything vLLM 0.22's tracing needs, both OTLP exporters"
                                 f"{version}: --otlp-traces-endpoint is safe")
    wheel = wheel_for(f.missing or f.failed_import or "opentelemetry")
    every = f"opentelemetry-exporter-otlp{'==' + f.api_version if f.api_version else ''}"
    return Check(name, "fail", f"{f.python} cannot import {f.failed_import} ({f.error}): missing {wheel}. With "
                               "--otlp-traces-endpoint vLLM 0.22 would start healthy, then answer every request "
                               f"with HTTP 500 and shut down. Fix: pip install {wheel} (or every OTLP exporter "
                               f"with its dependencies, matching opentelemetry-api: pip install {every})")


def trace_arrival_check(f: TraceArrival) -> Check:
    name = "traces arrive"
    if f.receiver is None:
        return Check(name, "skip", "not asked (--traces: send one request and wait for its span)")
    if f.error is not None:
        return Check(name, "fail", f"{f.receiver}: {f.error}")
    if f.delay_s is None:
        return Check(name, "fail", f"no span of the test request reached {f.receiver} within {f.waited_s:.0f} s: "
                                   "is the engine's --otlp-traces-endpoint this receiver's /v1/traces, with "
                                   "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf in its environment (vLLM "
                                   "defaults to gRPC, which pdexporter does not speak)?")
    at = "pdexporter's receiver" if f.how == "listened" else "the running exporter"
    return Check(name, "ok", f"the test request's span reached {at} at {f.receiver} {f.delay_s:.1f} s after the "
                             "request ended (the engine batches spans: passive attribution waits for them)")


def evaluate(engine: EngineFacts, endpoints: Sequence[EndpointFacts] = (),
             tracing: TracingImports | None = None, arrival: TraceArrival | None = None) -> list[Check]:
    """One check per thing the numbers rest on, in the order a user would fix them."""
    checks = engine_checks(engine)
    if tracing is not None:
        checks.append(tracing_imports_check(tracing))
    if arrival is not None:
        checks.append(trace_arrival_check(arrival))
    checks += [endpoint_check(e) for e in endpoints]
    return checks


def engine_checks(f: EngineFacts) -> list[Check]:
    where = "the embedded engine" if f.embedded else f.url
    if f.health_error is not None:
        return [
            Check("engine reachable", "fail", f.health_error),
            Check("engine checks", "skip", f"not checked, the engine did not answer: {', '.join(ENGINE_CHECKS[1:])}"),
        ]
    checks = [Check("engine reachable", "ok", f"{where} answered /health"
                    + (f" in {f.health_ms:.0f} ms" if f.health_ms is not None else ""))]
    rule = adapter(f.engine or f.engine_claimed or UNIDENTIFIED)
    identity = f.identity or {}
    checks.append(_version(f, rule))
    checks.append(_settings(f, rule, identity))
    checks.append(_model(f))
    checks.append(_max_model_len(f))
    checks.append(_streaming(f))
    checks.append(_metrics(f, rule))
    checks.append(_chunk_size(f, rule, identity))
    checks.append(_step_log(f, rule))
    checks.append(_prefix_caching(f, rule, identity))
    checks.append(_cuda_graphs(f))
    return checks


ENGINE_CHECKS = ("engine reachable", "version", "engine settings", "model", "max_model_len", "streaming", "metrics",
                 "chunk size", "step log", "prefix caching", "CUDA graphs")


def _version(f: EngineFacts, rule: EngineAdapter) -> Check:
    identity = f.identity
    if f.engine is None:
        said = (f"{f.identity_path} says {identity.get('version', '?')!r}, which no engine adapter recognises"
                if identity is not None else f"nothing says which engine it is ({f.identity_error or 'no answer'})")
        if f.engine_claimed:
            return Check("version", "warn", f"{said}: taken as {f.engine_claimed} (--engine)")
        return Check("version", "warn", f"{said}: engine unknown, vLLM's rules assumed (recorded as {UNIDENTIFIED}; "
                                        "--engine NAME says which)")
    version = (identity or {}).get("version", "?")
    if (identity or {}).get("modelled") is True:
        return Check(
            "version",
            "warn",
            f"{f.engine} {version}, profile "
            f"{(identity or {}).get('profile', '?')}: its numbers are MODELLED, not measured",
        )
    return Check("version", "ok", f"{f.engine} {version}" + (f" ({f.identity_path})" if f.identity_path != "/version"
                                                             else ""))


def _settings(f: EngineFacts, rule: EngineAdapter, identity: Mapping[str, Any]) -> Check:
    if set(identity) <= {"version"}:
        return Check("engine settings", "skip", "the engine publishes no settings")
    problems = rule.setup_problems(identity)
    if problems:
        return Check("engine settings", "warn", "; ".join(problems))
    return Check("engine settings", "ok", f"nothing in its {f.identity_path} stands in the way")


def _metrics(f: EngineFacts, rule: EngineAdapter) -> Check:
    if f.metrics_text is None:
        return Check("metrics", "warn", f"/metrics {f.metrics_error or 'did not answer'}: windows are measured without "
                                        "the engine's counters")
    try:
        snapshot = parse_exposition(f.metrics_text, rule)
    except EngineError as exc:
        return Check("metrics", "warn", str(exc))
    found = len(snapshot.sources)
    if snapshot.missing:
        return Check("metrics", "warn", f"{found} of the {rule.name} series pdexporter reads; missing: "
                                        f"{', '.join(snapshot.missing)}")
    return Check("metrics", "ok", f"{plural(found, 'series', 'series')} pdexporter reads, under {rule.name}'s names")


def _served(f: EngineFacts) -> list[str]:
    return [str(m.get("id")) for m in f.models or ()]


def _model(f: EngineFacts) -> Check:
    if f.models is None:
        return Check("model", "fail", f"/v1/models: {f.models_error or 'no answer'}")
    served = _served(f)
    if not served:
        return Check("model", "fail", "/v1/models lists no model")
    if f.model_wanted is not None and f.model_wanted not in served:
        return Check(
            "model", "fail", f"--model {f.model_wanted!r} is not served; the engine serves {', '.join(served)}"
        )
    chosen = f.model_wanted or served[0]
    others = f" (of {plural(len(served), 'model')} served)" if len(served) > 1 else ""
    return Check("model", "ok", f"{chosen}{others}")


def _max_model_len(f: EngineFacts) -> Check:
    if f.models is None:
        return Check("max_model_len", "skip", "no model list")
    chosen = f.model_wanted or next(iter(_served(f)), None)
    entry = next((m for m in f.models if str(m.get("id")) == chosen), None)
    value = entry.get("max_model_len") if entry else None
    if not isinstance(value, int):
        return Check("max_model_len", "warn", "not in /v1/models: a prompt too long for the engine fails only "
                                              "when it is sent")
    if value <= LARGEST_GRID_PROMPT:
        return Check("max_model_len", "warn", f"{value} tokens: the spec grid's {LARGEST_GRID_PROMPT}-token "
                                              f"prompts do not fit (keep P below {value})")
    return Check("max_model_len", "ok", f"{value} tokens (the spec grid's largest prompt, "
                                        f"{LARGEST_GRID_PROMPT}, fits)")


def _streaming(f: EngineFacts) -> Check:
    if f.stream_error is not None:
        return Check("streaming", "fail", f"a 4-token streamed completion failed: {f.stream_error}")
    if f.stream_ms is None:
        return Check("streaming", "skip", "no model to ask")
    if f.stream_tokens < 1:
        return Check("streaming", "fail", "a streamed completion ended without a token")
    return Check("streaming", "ok", f"a streamed completion gave {plural(f.stream_tokens, 'token')} in "
                                    f"{f.stream_ms:.0f} ms (token ids in, SSE out)")


def _chunk_size(f: EngineFacts, rule: EngineAdapter, identity: Mapping[str, Any]) -> Check:
    published = rule.served_chunk_size(identity)
    if f.chunk_size is not None:
        how = "the embedded engine was started with it" if f.embedded else "given with --chunk-size"
        if published is not None and published != f.chunk_size and not f.embedded:
            return Check("chunk size", "fail", f"{f.chunk_size} given with --chunk-size, but the engine says "
                                               f"{published} ({f.identity_path})")
        return Check("chunk size", "ok", f"{f.chunk_size} ({how})")
    if published is not None:
        return Check("chunk size", "ok", f"{published} (the engine publishes it, {f.identity_path})")
    return Check("chunk size", "warn", f"unknown (the engine does not publish it): assumed "
                                       f"{rule.default_chunk_size}, the engine's default, checked by the cadence "
                                       "window by window; pass --chunk-size")


def _step_log(f: EngineFacts, rule: EngineAdapter) -> Check:
    if f.step_log is None:
        return Check("step log", "warn", "not readable (the engine runs elsewhere): chunk steps are estimated "
                                         "from the probes' cadence, not counted from the engine's log")
    log = "the embedded engine's log" if f.embedded else f.step_log
    if not f.step_log_steps:
        flags = rule.chunk_size_flags(rule.default_chunk_size)[2:]  # past the chunk flag and its value
        return Check("step log", "warn", f"{log} logged no step for the test request: chunk steps will be "
                                         f"estimated ({rule.name} logs them when started with {' '.join(flags)})")
    return Check("step log", "ok", f"{log} logs every step ({plural(f.step_log_steps, 'step')} for the "
                                   "test request): chunk steps are exact")


def _prefix_caching(f: EngineFacts, rule: EngineAdapter, identity: Mapping[str, Any]) -> Check:
    cached = rule.prefix_caching(identity, f.metrics_text)
    if cached is None:
        if f.metrics_text is None and rule.cache_config_metric:
            return Check("prefix caching", "warn", f"cannot tell: /metrics {f.metrics_error or 'did not answer'}")
        where = f"/metrics has no {rule.cache_config_metric}" if rule.cache_config_metric else "its settings do not say"
        return Check("prefix caching", "warn", f"cannot tell: {where}")
    if cached:
        return Check("prefix caching", "ok", "on (probes share a cached prefix; every injected prompt is salted, "
                                             "so P is all new tokens)")
    return Check("prefix caching", "warn", "off: each probe stream prefills its whole context, a load the "
                                           "engine's default (on) does not have; the numbers describe that setup")


def _cuda_graphs(f: EngineFacts) -> Check:
    if f.cuda_graphs is None:
        return Check("CUDA graphs", "warn", "cannot tell: the engine does not publish its capture sizes (vLLM "
                                            "captures up to 512 tokens unless told otherwise; steps above run "
                                            "eagerly and cost more launch time)")
    if not f.cuda_graphs:
        return Check("CUDA graphs", "warn", "off (eager mode): every step pays its CPU launch")
    if f.cudagraph_max_tokens is not None:
        return Check("CUDA graphs", "ok", f"captured up to {f.cudagraph_max_tokens} tokens per step; larger steps "
                                          "(prefill chunks) run without")
    return Check("CUDA graphs", "ok", "on (capture sizes unknown)")


def endpoint_check(e: EndpointFacts) -> Check:
    name = "Prometheus" if e.kind == "prometheus" else "OTLP"
    if e.url is None:
        hint = "--prometheus URL" if e.kind == "prometheus" else "--otlp URL or OTEL_EXPORTER_OTLP_ENDPOINT"
        return Check(name, "skip", f"not configured ({hint})")
    if e.error is not None:
        said = e.error if e.url.rstrip("/") in e.error else f"{e.url}: {e.error}"
        return Check(name, "fail", f"{e.source}: {said}")
    return Check(name, "ok", f"{e.source}: {e.url} {e.detail}".strip())


def failed(checks: Sequence[Check]) -> bool:
    return any(c.status == "fail" for c in checks)
