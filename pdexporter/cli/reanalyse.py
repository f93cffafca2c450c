"""`pdexporter reanalyse RESULTS_DIR`: rebuild every record from its raw timestamps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from pdexporter.cli._common import console
from pdexporter.errors import ConfigError
from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.measure.store import ResultsStore, load_record_file
from pdexporter.sweep.reanalyse import reanalyse_record


def register(app: typer.Typer) -> None:
    app.command("reanalyse")(reanalyse)


def reanalyse(
    results: Annotated[Path, typer.Argument(help="Results directory ({chunk}/D{d}_P{p}.json + raw/).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report what would change; write nothing.")] = False,
) -> None:
    """Recompute every record's numbers from its raw timestamps with the current window maths."""
    store = ResultsStore(results)
    paths = list(store.iter_record_paths())
    if not paths:
        raise ConfigError(f"{results}: no records (expected {{chunk}}/D{{d}}_P{{p}}.json)")
    settings = ProtocolSettings()
    changed = reps = 0
    with Progress(TextColumn("[bold]reanalyse"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console) as bar:
        task = bar.add_task("records", total=len(paths))
        for path in paths:
            record = load_record_file(path)
            result = reanalyse_record(store, record, settings)
            reps += result.reps
            changed += result.changed
            if not dry_run:
                store.save_record(result.record)
            bar.advance(task)
    verb = "would change" if dry_run else "changed"
    console.print(f"{len(paths)} records, {reps} repetitions: {changed} {verb}")
