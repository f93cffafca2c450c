"""`pdexporter run`: the live exporter (probes, prefill windows, /metrics, OTLP spans); the work is
`pdexporter.exporter.job`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pdexporter._internal.writable import check_writable
from pdexporter.cli._common import (
    ApiKeyFileOpt,
    EngineCommandOpt,
    EngineOpt,
    ModelOpt,
    ProfileOpt,
    ReadTimeoutOpt,
    TargetOpt,
    api_key,
    console,
    duration_option,
)
from pdexporter.cli._vocab import B_FLAGS, D_FLAGS, P_FLAGS
from pdexporter.exporter.config import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_INJECT_EVERY_S,
)
from pdexporter.exporter.job import (
    METRICS_TOKEN_ENV,
    TRACES_TOKEN_ENV,
    bearer_token,
    load_live_decision,
    parse_run_options,
    serve,
)
from pdexporter.exporter.job import RunOptions as RUN
from pdexporter.exporter.receiver import DEFAULT_TRACES_PORT
from pdexporter.exporter.server import tls_context

if TYPE_CHECKING:
    from pdexporter.exporter.runner import Runner

__all__ = ["load_live_decision", "parse_run_options", "register", "run"]


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def run(
    decode_batch_size: Annotated[int, typer.Option(
        *D_FLAGS, help="Probe decode streams kept running (D, requests; >= 1).")] = RUN.decode_batch_size,
    target: TargetOpt = RUN.target,
    engine: EngineOpt = RUN.engine,
    engine_command: EngineCommandOpt = RUN.engine_command,
    chunk_size: Annotated[int | None, typer.Option(
        *B_FLAGS, help="The engine's chunk size (tokens per step: vLLM's max_num_batched_tokens, SGLang's "
        "chunked_prefill_size). With --target, if not given: what the engine publishes (SGLang), else its default, "
        f"assumed and checked against every window; embedded engine default {DEFAULT_CHUNK_SIZE}.")
    ] = RUN.chunk_size,
    inject_every: Annotated[str | None, duration_option(
        "--inject-every", "Prefill perturbation period, or 'off' for none; default: "
        f"{DEFAULT_INJECT_EVERY_S:g}s on the embedded engine, off with --target")] = RUN.inject_every,
    new_prefill_tokens: Annotated[int, typer.Option(
        *P_FLAGS, help="Tokens of each injected cold prefill (P).")] = RUN.new_prefill_tokens,
    listen: Annotated[str, typer.Option("--listen", help="Where /metrics is served, HOST:PORT.")] = RUN.listen,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write each window as a repetition of DIR/{B}/D{D}_P{P}.json.")] = RUN.out,
    model: ModelOpt = RUN.model,
    api_key_file: ApiKeyFileOpt = None,
    profile: ProfileOpt = RUN.profile,
    duration: Annotated[str | None, duration_option(
        "--duration", "Stop after this long; default: until SIGTERM/SIGINT")] = RUN.duration,
    scrape_interval: Annotated[str, duration_option(
        "--scrape-interval", "Engine /metrics scrape period")] = RUN.scrape_interval,
    decode_context_tokens: Annotated[int, typer.Option(
        help="Shared probe prefix length (tokens).")] = RUN.decode_context_tokens,
    decode_output_tokens: Annotated[int, typer.Option(
        help="Tokens each probe stream decodes before restarting.")] = RUN.decode_output_tokens,
    passive: Annotated[bool, typer.Option(
        "--passive", help="Inject nothing: measure the production prefills the probes see (docs/exporter.md, "
        "'Passive mode'); the engine's request traces can be sent to POST /v1/traces.")] = RUN.passive,
    attribution_wait: Annotated[str, duration_option(
        "--attribution-wait", "Passive mode: longest wait for a request's trace (it comes when the request "
        "finishes)")] = RUN.attribution_wait,
    engine_wait: Annotated[str, duration_option(
        "--engine-wait", "How long to wait for the engine at start-up, exporting pdexporter_up 0 meanwhile: "
        "'forever' or a duration")] = RUN.engine_wait,
    read_timeout: ReadTimeoutOpt = RUN.read_timeout,
    traces_listen: Annotated[str | None, typer.Option(
        "--traces-listen", help=f"Where the OTLP trace receiver (POST /v1/traces) listens, HOST:PORT, or 'off'; "
        f"default: the --listen host, port {DEFAULT_TRACES_PORT}, with --passive only (docs/security.md).")
    ] = RUN.traces_listen,
    traces_max_rate: Annotated[float, typer.Option(
        "--traces-max-rate", help="Spans a second the trace receiver takes; more are answered 429.")
    ] = RUN.traces_max_rate,
    metrics_token_file: Annotated[Path | None, typer.Option(
        "--metrics-token-file", help=f"Require this bearer token on /metrics (else ${METRICS_TOKEN_ENV}, if set); "
        "the health paths stay open.")] = None,
    traces_token_file: Annotated[Path | None, typer.Option(
        "--traces-token-file", help=f"Require this bearer token on POST /v1/traces (else ${TRACES_TOKEN_ENV}, if "
        "set).")] = None,
    tls_cert_file: Annotated[Path | None, typer.Option(
        "--tls-cert-file", help="Serve both ports over TLS with this PEM certificate (and --tls-key-file).")
    ] = RUN.tls_cert_file,
    tls_key_file: Annotated[Path | None, typer.Option(
        "--tls-key-file", help="The certificate's PEM key.")] = RUN.tls_key_file,
    decision: Annotated[Path | None, typer.Option(
        "--decision", help="Passive mode: a two-arm decision.json (export-table --offloaded); the router thresholds "
        "are then kept up to date from the production prefills (pdexporter_offload_threshold_tokens, "
        "GET /thresholds.yaml).")] = RUN.decision,
    threshold_every: Annotated[str, duration_option(
        "--threshold-every", "With --decision: how often the live thresholds are recomputed")
    ] = RUN.threshold_every,
) -> None:
    """Keep D probe decode streams on an engine, perturb them with prefills, export what they see."""
    options = dict(locals())
    secrets = {flag: options.pop(flag) for flag in ("api_key_file", "metrics_token_file", "traces_token_file")}
    config = parse_run_options(**options)
    decision_doc = load_live_decision(config.decision_file)
    token = api_key(secrets["api_key_file"])
    metrics_token = bearer_token(metrics_token_file, "--metrics-token-file", METRICS_TOKEN_ENV)
    traces_token = bearer_token(traces_token_file, "--traces-token-file", TRACES_TOKEN_ENV)
    tls_context(*(None if f is None else str(f) for f in (tls_cert_file, tls_key_file)))  # a bad file: one line now
    if out is not None:
        check_writable(out)  # now, not at the first window
    asyncio.run(serve(config, log=lambda line: console.print(line, highlight=False, soft_wrap=True), api_key=token,
                      metrics_token=metrics_token, traces_token=traces_token, decision=decision_doc,
                      progress=_progress))


async def _progress(runner: Runner, duration_s: float) -> None:
    """With --duration: a bar with the time left, the windows so far and the tokens received."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    await runner.ready.wait()
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"), console=console, refresh_per_second=2, transient=True,
    ) as bar:
        task = bar.add_task("pdexporter run", total=duration_s, status="")
        start = asyncio.get_running_loop().time()
        while True:
            tokens = runner.metrics.probe_tokens._value.get()
            bar.update(task, completed=min(duration_s, asyncio.get_running_loop().time() - start),
                       status=f"{runner.windows_seen} window(s), {tokens:.0f} probe tokens")
            await asyncio.sleep(0.5)
