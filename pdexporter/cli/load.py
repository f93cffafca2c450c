"""`pdexporter load`: synthetic production traffic against an engine (pdexporter.load)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from pdexporter.cli._common import ApiKeyFileOpt, ModelOpt, console, duration_option


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
    options = dict(locals())
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from pdexporter.load.job import load_job, summary_line

    job = load_job(**options)
    console.print(job.announce, highlight=False)
    with Progress(TextColumn("[bold]load"), BarColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                  TextColumn("{task.fields[status]}"), console=console, transient=True) as bar:
        task = bar.add_task("load", total=job.seconds, status="")

        def on_sent(elapsed: float, result: Any) -> None:
            bar.update(task, completed=min(job.seconds, elapsed), status=f"{result.sent} sent, {len(result.open)} open")

        summary = asyncio.run(job.run(on_sent))
    console.print(summary_line(summary), highlight=False)
