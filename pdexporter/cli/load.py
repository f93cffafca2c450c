"""`pdexporter load`: synthetic production traffic against an engine (pdexporter.load)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from pdexporter._internal.redact import redact_url
from pdexporter.cli._common import ApiKeyFileOpt, ModelOpt, api_key, console, duration_option
from pdexporter.errors import ConfigError


def register(app: typer.Typer) -> None:
    app.command("load")(load)


def load(
    target: Annotated[str | None, typer.Option("--target", help="Base URL of the engine (required).")] = None,
    rate: Annotated[float, typer.Option("--rate", help="Requests per second (Poisson arrivals).")] = 1.0,
    duration: Annotated[str, duration_option("--duration", "How long to send")] = "5m",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the schedule and the prompts.")] = 0,
    mix: Annotated[str, typer.Option("--mix", help="The prompt mix: sharegpt-like or documents-heavy.")] = (
        "sharegpt-like"),
    model: ModelOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write a JSON summary here.")] = None,
) -> None:
    """Send Poisson arrivals of ShareGPT-like requests (cold token-id prompts) to --target."""
    from pdexporter._internal.atomic import atomic_write_json
    from pdexporter._internal.durations import parse_duration
    from pdexporter._internal.writable import check_writable
    from pdexporter.load.mix import MIXES, LoadSpec, schedule

    if target is None or not target.startswith(("http://", "https://")):
        raise ConfigError(f"--target {target!r}: expected the engine's http:// or https:// URL")
    if out is not None:
        check_writable(out, directory=False)
    if mix not in MIXES:
        raise ConfigError(f"--mix {mix!r}: expected one of {', '.join(MIXES)}")
    seconds = parse_duration(duration, "--duration")
    try:
        spec = LoadSpec(rate=rate, duration_s=seconds, seed=seed, mix=MIXES[mix])
    except ValueError as exc:
        raise ConfigError(f"--rate {rate:g} / --duration {duration}: {exc}") from None
    requests = schedule(spec)
    console.print(f"pdexporter load: {len(requests)} requests over {seconds:g} s at {rate:g}/s to {redact_url(target)}",
                  highlight=False)
    summary = asyncio.run(_load(target, requests, seconds, model, api_key(api_key_file)))
    summary.update(rate=rate, duration_s=seconds, seed=seed, mix=mix, target=redact_url(target))
    console.print(
        f"sent {summary['sent']}, finished {summary['finished']}, failed {summary['failed']}, "
        f"{summary['prompt_tokens']} prompt tokens, worst send lag {summary['late_s']:.3f} s",
        highlight=False,
    )
    if out is not None:
        atomic_write_json(out, summary)


async def _load(target: str, requests: list, seconds: float, model: str | None, token: str | None) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from pdexporter.launch import EngineHandle
    from pdexporter.load.drive import drive
    from pdexporter.measure.driver import http_driver

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    async with http_driver(EngineHandle(url=target.rstrip("/"), chunk_size=None), model=model, api_key=token) as driver:
        with Progress(TextColumn("[bold]load"), BarColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                      TextColumn("{task.fields[status]}"), console=console, transient=True) as bar:
            task = bar.add_task("load", total=seconds, status="")

            def on_sent(result) -> None:
                bar.update(task, completed=min(seconds, time.monotonic() - started),
                           status=f"{result.sent} sent, {len(result.open)} open")

            result = await drive(driver, requests, stop=stop, on_sent=on_sent, drain_s=60.0)
    return {"sent": result.sent, "finished": result.finished, "failed": result.failed,
            "prompt_tokens": result.prompt_tokens, "output_tokens": result.output_tokens,
            "late_s": round(result.late_s, 4), "open_at_end": len(result.open)}
