"""`pdexporter doctor [--target URL]`: check what the numbers will rest on, one line per check."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from pdexporter._internal.bounds import MAX_SECONDS
from pdexporter._internal.redact import redact_url
from pdexporter.cli._common import (
    DEFAULT_PROFILE,
    ApiKeyFileOpt,
    EngineOpt,
    ModelOpt,
    ProfileOpt,
    TargetOpt,
    api_key,
    console,
    make_console,
    run_async,
)
from pdexporter.cli._vocab import B_FLAGS
from pdexporter.doctor import Check, EndpointFacts, EngineFacts, evaluate, failed
from pdexporter.doctor.checks import TraceArrival
from pdexporter.engines import UNIDENTIFIED, adapter
from pdexporter.errors import ConfigError
from pdexporter.exporter.receiver import DEFAULT_TRACES_PORT
from pdexporter.exporter.server import parse_listen
from pdexporter.launch import TraceDirected
from pdexporter.launch.choose import make_launcher

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
EMBEDDED_CHUNK_SIZE = 8192


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(
    target: TargetOpt = None,
    engine: EngineOpt = None,
    chunk_size: Annotated[int | None, typer.Option(
        *B_FLAGS, min=1, help="The engine's chunk size (tokens per step), if you know it (vLLM does not publish its "
        "max_num_batched_tokens; SGLang publishes its chunked_prefill_size).")] = None,
    prometheus: Annotated[str | None, typer.Option(
        "--prometheus", help="Prometheus base URL to check (reachable, and whether it holds pdexporter series).")
    ] = None,
    otlp: Annotated[str | None, typer.Option(
        "--otlp", help="OTLP/HTTP endpoint to check (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
        "$OTEL_EXPORTER_OTLP_ENDPOINT, as `run` uses).")] = None,
    model: ModelOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    profile: ProfileOpt = DEFAULT_PROFILE,
    engine_python: Annotated[str | None, typer.Option(
        "--engine-python", help="The Python the engine runs in (on this host): doctor imports there exactly what "
        "vLLM 0.22's tracing imports, before you turn on --otlp-traces-endpoint.")] = None,
    engine_command: Annotated[str | None, typer.Option(
        "--engine-command", help="The command that starts the engine (e.g. a sweep file's launcher command, "
        "'vllm serve ...'): its Python is checked as --engine-python.")] = None,
    traces: Annotated[bool, typer.Option(
        "--traces", help="Send one short request and wait for its span at --traces-receiver (the address the "
        "engine's --otlp-traces-endpoint points at; doctor listens there, or reads the exporter already there).")
    ] = False,
    traces_receiver: Annotated[str, typer.Option(
        "--traces-receiver", help="HOST:PORT the engine sends its spans to (with --traces and --target).")
    ] = f"0.0.0.0:{DEFAULT_TRACES_PORT}",
    traces_wait: Annotated[float, typer.Option(
        "--traces-wait", min=1.0, max=MAX_SECONDS,
        help="Seconds to wait for the span (vLLM batches its spans every 5 s).")] = 15.0,
) -> None:
    """Check the engine (reachable, which engine, its settings, model, max_model_len, metrics, chunk
    size, step log, prefix caching, CUDA graphs, its tracing imports, that its spans arrive) and the
    Prometheus and OTLP endpoints; exit 1 if a check fails."""
    if target is not None and not target.startswith(("http://", "https://")):
        raise ConfigError(f"--target {target!r}: expected an http:// or https:// URL")
    if prometheus is not None and not prometheus.startswith(("http://", "https://")):
        raise ConfigError(f"--prometheus {prometheus!r}: expected an http:// or https:// URL")
    token = api_key(api_key_file)
    try:
        receiver = parse_listen(traces_receiver) if traces else None
    except ConfigError:
        raise ConfigError(f"--traces-receiver {traces_receiver!r}: expected HOST:PORT") from None
    with console.status("starting the embedded engine ..." if target is None else f"asking {redact_url(target)} ..."):
        facts, arrival = run_async(_engine(target, chunk_size, model, token, profile, receiver, traces_wait, engine))
    with console.status("checking the endpoints and the engine's tracing imports ..."):
        from pdexporter.doctor.gather import engine_python as python_of
        from pdexporter.doctor.gather import otlp_facts, prometheus_facts, tracing_imports

        endpoints: list[EndpointFacts] = [prometheus_facts(prometheus), otlp_facts(otlp)]
        python, source = engine_python, "--engine-python"
        if python is None and engine_command is not None:
            python, source = python_of(engine_command), "--engine-command"
            if python is None:
                raise ConfigError(f"--engine-command {engine_command!r}: cannot tell which Python it runs in (its "
                                  "first word is neither a Python nor a script with a #! line); give --engine-python")
        kind = facts.engine or facts.engine_claimed or UNIDENTIFIED
        # an engine whose traces pdexporter does not read (SGLang) has no imports to check
        imports = (tracing_imports(python, source, kind, embedded=target is None)
                   if adapter(kind).tracing_imports else None)
    checks = evaluate(facts, endpoints, imports, arrival)
    print_checks(checks, facts)
    if failed(checks):
        raise typer.Exit(1)


async def _engine(target: str | None, chunk_size: int | None, model: str | None, token: str | None,
                  profile: str, receiver: tuple[str, int] | None,
                  traces_wait: float, engine: str | None = None) -> tuple[EngineFacts, TraceArrival | None]:
    from pdexporter.doctor.gather import engine_facts, listen_for_traces, trace_arrival

    launcher = make_launcher(target, chunk_size=chunk_size, profile=profile, engine=engine)
    listener = None
    if receiver is not None and target is None and isinstance(launcher, TraceDirected):
        # the embedded engine is told where to send: doctor's own receiver on a free local port
        listener = await listen_for_traces("127.0.0.1", 0)
        receiver = ("127.0.0.1", listener.port)
        launcher.send_traces_to(f"http://127.0.0.1:{listener.port}/v1/traces")
    capture = None
    if target is None:
        from pdexporter.sim.profile import load_profile

        chunk_size = chunk_size or EMBEDDED_CHUNK_SIZE
        sizes = load_profile(profile).engine.capture_sizes(chunk_size)  # vLLM's rule, with this chunk size
        capture = max(sizes) if sizes else None
    try:
        handle = await launcher.start(chunk_size or EMBEDDED_CHUNK_SIZE)
        facts = await engine_facts(handle, embedded=target is None, model=model, api_key=token,
                                   chunk_size=chunk_size, cudagraph_max_tokens=capture)
        arrival = None
        if receiver is not None:
            served = [str(m.get("id")) for m in facts.models or ()]
            chosen = model if model in served else (served[0] if served else None)
            if facts.health_error is not None or chosen is None:
                arrival = TraceArrival(f"http://{receiver[0]}:{receiver[1]}/v1/traces",
                                       error="no request could be sent (see the engine checks)")
            else:
                kind = facts.engine or facts.engine_claimed or UNIDENTIFIED
                arrival = await trace_arrival(handle.url, chosen, receiver, kind, api_key=token,
                                              wait_s=traces_wait, listener=listener)
        return facts, arrival
    finally:
        if listener is not None:
            await listener.stop()
        await launcher.stop()


def print_checks(checks: list[Check], engine: EngineFacts) -> None:
    out = make_console()
    where = "the embedded engine (modelled)" if engine.embedded else engine.url
    table = Table(title=f"pdexporter doctor: {where}", title_justify="left", show_lines=False)
    table.add_column("check", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("why")
    for check in checks:
        table.add_row(check.name, f"[{STYLE[check.status]}]{check.status}[/]", check.why)
    out.print(table, highlight=False)
    counts = {s: sum(1 for c in checks if c.status == s) for s in STYLE}
    verdict = "FAIL" if counts["fail"] else ("OK, with warnings" if counts["warn"] else "OK")
    out.print(f"{verdict}: {counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail, {counts['skip']} skipped",
              highlight=False)
