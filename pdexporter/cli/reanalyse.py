"""`pdexporter reanalyse RESULTS_DIR`: rebuild every record from its raw timestamps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from pdexporter.cli._common import console
from pdexporter.errors import ConfigError
from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.measure.records import RunRecord
from pdexporter.measure.store import ResultsStore, load_record_file
from pdexporter.sweep.reanalyse import reanalyse_record


def register(app: typer.Typer) -> None:
    app.command("reanalyse")(reanalyse)


def reanalyse(
    results: Annotated[Path, typer.Argument(help="Results directory ({chunk}/D{d}_P{p}.json + raw/).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report what would change; write nothing.")] = False,
) -> None:
    """Recompute every record's numbers from its raw timestamps with the current window maths
    (records of `run --passive` are kept as measured)."""
    store = ResultsStore(results)
    paths = list(store.iter_record_paths())
    if not paths:
        raise ConfigError(f"{results}: no records (expected {{chunk}}/D{{d}}_P{{p}}.json)")
    settings = ProtocolSettings()
    changed = reps = kept = written = 0
    with Progress(TextColumn("[bold]reanalyse"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console) as bar:
        task = bar.add_task("records", total=len(paths))
        for path in paths:
            record = load_record_file(path)
            if record.config.mode == "passive":  # the exporter's windows: see the note below
                kept += 1
                bar.advance(task)
                continue
            result = reanalyse_record(store, record, settings)
            reps += result.reps
            changed += result.changed
            if not dry_run and _differs(record, result.record):
                store.save_record(result.record)
                written += 1
            bar.advance(task)
    verb = "would change" if dry_run else "changed"
    console.print(f"{len(paths) - kept} records, {reps} repetitions: {changed} {verb}"
                  + ("" if dry_run else f"; {written} record files rewritten (the others are left as they were)"))
    if kept:
        console.print(
            f"{kept} passive record(s) (run --passive) kept as measured: each event's baseline is the quiet "
            "period before it and its D and P the engine's, which no Phase 1 file holds; "
            "export-table --mode passive re-derives the table and the model from them"
        )


def _differs(old: RunRecord, new: RunRecord) -> bool:
    """Whether re-analysis changed anything but the provenance (when and where it was written) and
    the schema version it would be written with: a
    record whose numbers are what they were is not rewritten, so a re-derivation of committed
    results changes only what moved."""
    keep = {"provenance", "schema_version"}  # an older record is read as it is; its numbers decide
    return old.model_dump(exclude=keep) != new.model_dump(exclude=keep)
