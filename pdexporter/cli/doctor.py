"""`pdexporter doctor [--target URL]`: check what the numbers will rest on, one line per check
(`pdexporter.doctor.job`)."""

from __future__ import annotations

from typing import Annotated

import typer

from pdexporter._internal.bounds import MAX_SECONDS
from pdexporter.cli._common import (
    DEFAULT_PROFILE,
    ApiKeyFileOpt,
    EngineOpt,
    ModelOpt,
    ProfileOpt,
    TargetOpt,
    console,
    make_console,
    run_async,
    show,
)
from pdexporter.cli._vocab import B_FLAGS
from pdexporter.doctor import failed
from pdexporter.exporter.receiver import DEFAULT_TRACES_PORT


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
    options = dict(locals())
    from pdexporter.doctor.job import checks_sheet, doctor_job

    job = doctor_job(**options)
    with console.status(job.asking):
        facts, arrival = run_async(job.engine())
    with console.status("checking the endpoints and the engine's tracing imports ..."):
        checks = job.checks(facts, arrival)
    show(checks_sheet(checks, facts), make_console())
    if failed(checks):
        raise typer.Exit(1)
