"""`pdexporter reanalyse RESULTS_DIR`: rebuild every record from its raw timestamps
(`pdexporter.sweep.reanalyse.reanalyse_directory`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from pdexporter.cli._common import console, show


def register(app: typer.Typer) -> None:
    app.command("reanalyse")(reanalyse)


def reanalyse(
    results: Annotated[Path, typer.Argument(help="Results directory ({chunk}/D{d}_P{p}.json + raw/).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report what would change; write nothing.")] = False,
) -> None:
    """Recompute every record's numbers from its raw timestamps with the current window maths and
    the window settings of the sweep that wrote the directory (its sweep.json; else the seed's);
    `run --passive` events from their quiet-period baselines (one nothing can rebuild is kept)."""
    from pdexporter.sweep.reanalyse import reanalyse_directory

    job = reanalyse_directory(results, dry_run=dry_run)
    with Progress(TextColumn("[bold]reanalyse"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console) as bar:
        task = bar.add_task("records", total=len(job.paths))
        lines = job.run(lambda: bar.advance(task))
    show(lines)
