"""`pdexporter run`: the live exporter (probes, prefill windows, /metrics, OTLP spans)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from pdexporter.cli._common import (
    DEFAULT_PROFILE,
    ApiKeyFileOpt,
    ModelOpt,
    ProfileOpt,
    ReadTimeoutOpt,
    TargetOpt,
    api_key,
    console,
    duration_option,
    make_launcher,
)
from pdexporter.cli._vocab import B_FLAGS, D_FLAGS, P_FLAGS
from pdexporter._internal.validation import format_validation_error
from pdexporter.engines import adapter
from pdexporter.errors import ConfigError
from pdexporter.exporter.config import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_INJECT_EVERY_S,
    DEFAULT_LISTEN,
    DEFAULT_PREFILL_TOKENS,
    ExporterConfig,
    build_config,
    parse_duration,
)
from pdexporter.engine.client import read_timeout_seconds
from pdexporter.exporter.server import parse_listen
from pdexporter.exporter.startup import parse_engine_wait
from pdexporter.exporter.runner import Runner
from pdexporter.measure.protocol import ProtocolSettings


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def run(
    decode_batch_size: Annotated[
        int, typer.Option(*D_FLAGS, help="Probe decode streams kept running (D, requests; >= 1).")
    ] = 4,
    target: TargetOpt = None,
    chunk_size: Annotated[
        int | None,
        typer.Option(*B_FLAGS, help="The engine's max_num_batched_tokens (tokens per step). With --target, "
                     "if not given, vLLM's default is assumed and checked against every window; embedded "
                     f"engine default {DEFAULT_CHUNK_SIZE}."),
    ] = None,
    inject_every: Annotated[
        str | None,
        duration_option("--inject-every", "Prefill perturbation period, or 'off' for none; default: "
                        f"{DEFAULT_INJECT_EVERY_S:g}s on the embedded engine, off with --target"),
    ] = None,
    new_prefill_tokens: Annotated[
        int, typer.Option(*P_FLAGS, help="Tokens of each injected cold prefill (P).")
    ] = DEFAULT_PREFILL_TOKENS,
    listen: Annotated[str, typer.Option("--listen", help="Where /metrics is served, HOST:PORT.")] = DEFAULT_LISTEN,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write each window as a repetition of DIR/{B}/D{D}_P{P}.json.")
    ] = None,
    model: ModelOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    profile: ProfileOpt = DEFAULT_PROFILE,
    duration: Annotated[
        str | None, duration_option("--duration", "Stop after this long; default: until SIGTERM/SIGINT")
    ] = None,
    scrape_interval: Annotated[str, duration_option("--scrape-interval", "Engine /metrics scrape period")] = "5s",
    decode_context_tokens: Annotated[int, typer.Option(help="Shared probe prefix length (tokens).")] = 4096,
    decode_output_tokens: Annotated[int, typer.Option(
        help="Tokens each probe stream decodes before restarting.")] = 256,
    passive: Annotated[bool, typer.Option(
        "--passive", help="Inject nothing: measure the production prefills the probes see (docs/exporter.md, "
        "'Passive mode'); the engine's request traces can be sent to POST /v1/traces.")] = False,
    attribution_wait: Annotated[str, duration_option(
        "--attribution-wait", "Passive mode: longest wait for a request's trace (it comes when the request "
        "finishes)")] = "30s",
    engine_wait: Annotated[str, duration_option(
        "--engine-wait", "How long to wait for the engine at start-up, exporting pdexporter_up 0 meanwhile: "
        "'forever' or a duration")] = "forever",
    read_timeout: ReadTimeoutOpt = None,
) -> None:
    """Keep D probe decode streams on an engine, perturb them with prefills, export what they see."""
    config = parse_run_options(
        decode_batch_size=decode_batch_size, target=target, chunk_size=chunk_size, inject_every=inject_every,
        new_prefill_tokens=new_prefill_tokens, listen=listen, out=out, model=model, profile=profile, duration=duration,
        scrape_interval=scrape_interval, decode_context_tokens=decode_context_tokens,
        decode_output_tokens=decode_output_tokens, passive=passive, attribution_wait=attribution_wait,
        engine_wait=engine_wait, read_timeout=read_timeout,
    )
    token = api_key(api_key_file)
    asyncio.run(_serve(config, token))


def parse_run_options(
    *,
    decode_batch_size: int,
    target: str | None,
    chunk_size: int | None,
    inject_every: str | None,
    new_prefill_tokens: int,
    listen: str,
    out: Path | None,
    model: str | None,
    profile: str,
    duration: str | None,
    scrape_interval: str,
    decode_context_tokens: int,
    decode_output_tokens: int,
    passive: bool = False,
    attribution_wait: str = "30s",
    engine_wait: str = "forever",
    read_timeout: str | None = None,
) -> ExporterConfig:
    """Every option checked before anything starts; each problem is one line naming the option."""
    if decode_batch_size < 1:
        raise ConfigError(f"--decode-batch-size {decode_batch_size}: must be >= 1")
    if new_prefill_tokens < 1:
        raise ConfigError(f"--new-prefill-tokens {new_prefill_tokens}: must be >= 1")
    if target is not None and not target.startswith(("http://", "https://")):
        raise ConfigError(f"--target {target!r}: expected an http:// or https:// URL")
    chunk_size_source = "given"
    if chunk_size is None:
        # vLLM does not publish max_num_batched_tokens; against an engine someone else runs we
        # assume vLLM's default for its OpenAI server on a >= 70 GB GPU, and every window checks
        # it against the probes' cadence (the runner says which sizes fit when it does not).
        chunk_size = adapter(None).default_chunk_size if target is not None else DEFAULT_CHUNK_SIZE
        chunk_size_source = "assumed" if target is not None else "given"
    if passive and inject_every is not None and inject_every.strip().lower() not in ("off", "0", "none"):
        raise ConfigError(f"--inject-every {inject_every}: --passive injects nothing; leave --inject-every out "
                          "(or set it to off)")
    if inject_every is None:
        inject_every_s: float | None = DEFAULT_INJECT_EVERY_S if target is None and not passive else None
    elif inject_every.strip().lower() in ("off", "0", "none"):
        inject_every_s = None
    else:
        inject_every_s = parse_duration(inject_every, "--inject-every")
        if inject_every_s <= 0:
            raise ConfigError(f"--inject-every {inject_every!r}: must be > 0 (or 'off')")
    host, port = parse_listen(listen)
    try:
        protocol = ProtocolSettings(decode_context_tokens=decode_context_tokens, decode_output_tokens=decode_output_tokens)
    except ValidationError as exc:
        raise ConfigError(f"--decode-output-tokens {decode_output_tokens}: "
                          f"{format_validation_error(exc, ProtocolSettings)}") from exc
    read_timeout_s = None if read_timeout is None else read_timeout_seconds(read_timeout)
    duration_s = None if duration is None else parse_duration(duration, "--duration")
    if duration_s is not None and duration_s <= 0:
        raise ConfigError(f"--duration {duration!r}: must be > 0")
    return build_config(
        probe_streams=decode_batch_size,
        chunk_size=chunk_size,
        chunk_size_source=chunk_size_source,
        target=target,
        inject_every_s=inject_every_s,
        prefill_tokens=new_prefill_tokens,
        listen_host=host,
        listen_port=port,
        out=out,
        model=model,
        profile=profile,
        duration_s=duration_s,
        scrape_interval_s=parse_duration(scrape_interval, "--scrape-interval"),
        protocol=protocol.with_read_timeout(read_timeout_s),
        passive=passive,
        attribution_wait_s=parse_duration(attribution_wait, "--attribution-wait"),
        engine_wait_s=parse_engine_wait(engine_wait),
        read_timeout_s=read_timeout_s,
    )


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
            tokens = runner.metrics.probe_tokens._value.get()  # type: ignore[attr-defined]
            bar.update(task, completed=min(duration_s, asyncio.get_running_loop().time() - start),
                       status=f"{runner.windows_seen} window(s), {tokens:.0f} probe tokens")
            await asyncio.sleep(0.5)


async def _serve(config: ExporterConfig, token: str | None) -> None:
    launcher = make_launcher(config.target, chunk_size=config.chunk_size, profile=config.profile)
    runner = Runner(config, launcher, api_key=token, log=lambda line: console.print(line, highlight=False, soft_wrap=True))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            console.print(f"{signal.Signals(signum).name}: finishing the window in flight, then stopping")
            stop.set()
        else:  # a second signal: do not wait for the window
            runner.abort_window()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    mode = "embedded engine (modelled)" if config.target is None else config.target
    injection = (
        f"a {config.prefill_tokens}-token prefill every {config.inject_every_s:g} s"
        if config.inject_every_s
        else "passive mode: the production prefills the probes see, traces on POST /v1/traces"
        if config.passive else "no prefill injection"
    )
    console.print(f"pdexporter run: {config.probe_streams} probe streams on {mode}, {injection}", highlight=False,
                  soft_wrap=True)
    bar = asyncio.create_task(_progress(runner, config.duration_s)) if config.duration_s else None
    try:
        await runner.run(stop)
    finally:
        if bar is not None:
            bar.cancel()
            await asyncio.gather(bar, return_exceptions=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    console.print(f"stopped after {runner.windows_seen} window(s)", highlight=False)
    sys.stdout.flush()
