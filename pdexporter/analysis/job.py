"""The batch job, wired: samples -> table -> fits -> decision -> criteria -> plots -> files.

`analyse` is pure (data in, an `Analysis` out). `load_results` and `write_outputs` are the thin
I/O edges; the CLI commands (`export-table`, `report`, `decide`) call these and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pdexporter._internal.atomic import atomic_write_json
from pdexporter.analysis.breakeven import DECISION_JSON, DEFAULT_TRANSFER_MS, decision_document
from pdexporter.analysis.criteria import CRITERIA_JSON, Criterion, criteria_document, evaluate_criteria
from pdexporter.analysis.models import FitReport, fit_data, fit_models
from pdexporter.analysis.table import ConfigSamples, build_table, samples_from_record, top_level_mismatches, write_table
from pdexporter.errors import RecordError
from pdexporter.measure.store import ResultsStore, load_record_file

FITS_JSON = "fits.json"
PLOTS_DIR = "plots"

Tick = Callable[[str], None]


@dataclass
class Analysis:
    samples: list[ConfigSamples]
    table: pd.DataFrame
    fits: FitReport | None
    decision: dict[str, Any] | None
    criteria: list[Criterion]
    mismatches: list[str]
    transfer_ms: float
    source: str
    notes: list[str] = field(default_factory=list)

    @property
    def modelled(self) -> bool:
        return any(s.modelled for s in self.samples)

    @property
    def modelled_notes(self) -> list[str]:
        return sorted({s.note for s in self.samples if s.modelled and s.note})

    def fits_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.fits.to_dict() if self.fits else {"chosen": None, "models": {}}
        doc.update(source=self.source, modelled=self.modelled, top_level_mismatches=self.mismatches,
                   notes=self.notes)
        return doc


def record_paths(results_dir: str | Path) -> list[Path]:
    root = Path(results_dir)
    if not root.exists():
        raise RecordError(f"{root}: no such results directory")
    if not root.is_dir():
        raise RecordError(f"{root}: not a directory (give the results directory, e.g. results/)")
    paths = list(ResultsStore(root).iter_record_paths())
    if not paths:
        raise RecordError(f"{root}: no records found (expected {root}/<chunk_size>/D<d>_P<p>.json)")
    return paths


def load_results(results_dir: str | Path, tick: Tick | None = None) -> list[ConfigSamples]:
    """Every record under the directory; the first bad file stops us with its one-line error."""
    samples = []
    for path in record_paths(results_dir):
        samples.append(samples_from_record(load_record_file(path), source=str(path)))
        if tick:
            tick(path.name)
    return samples


def analyse(samples: Sequence[ConfigSamples], transfer_ms: float = DEFAULT_TRANSFER_MS, source: str = "",
            tick: Tick | None = None, *, passive_events: Mapping[tuple[int, int, int], int] | None = None,
            min_events: int | None = None) -> Analysis:
    """`min_events` (passive tables): add the event counts, the too-few mark and the bootstrap
    intervals (`analysis.passive`); `passive_events` counts events whose values were lost."""
    if not samples:
        raise RecordError(f"{source or 'input'}: nothing to analyse")
    table = build_table(samples)
    if min_events is not None:
        from pdexporter.analysis.passive import passive_columns

        table = passive_columns(table, samples, min_events=min_events, events=passive_events)
    if tick:
        tick("table")
    notes: list[str] = []
    data = fit_data(table, samples)
    fits: FitReport | None = None
    decision = None
    if len(data):
        fits = fit_models(data)
        decision = decision_document(fits, table, transfer_ms, source=source)
    else:
        notes.append("no grid point with D >= 1 and a measured cost: no cost model fitted, no decision.json")
    if tick:
        tick("fits")
    criteria = evaluate_criteria(table, fits, transfer_ms)
    if tick:
        tick("criteria")
    return Analysis(list(samples), table, fits, decision, criteria, top_level_mismatches(samples), transfer_ms,
                    source, notes)


def write_outputs(analysis: Analysis, out_dir: str | Path, *, plots: bool = True, parquet: bool = True,
                  tick: Tick | None = None) -> list[Path]:
    """interference_table.csv (+ .parquet), fits.json, decision.json, criteria.json, plots/*.png|svg."""
    out = Path(out_dir)
    written = write_table(analysis.table, out, parquet=parquet)
    written.append(atomic_write_json(out / FITS_JSON, analysis.fits_document()))
    if analysis.decision is not None:
        written.append(atomic_write_json(out / DECISION_JSON, analysis.decision))
    written.append(atomic_write_json(out / CRITERIA_JSON, criteria_document(analysis.criteria)))
    if tick:
        tick("tables")
    if plots:
        from pdexporter.analysis.plots import FORMATS, all_plots, write_plots

        model = analysis.fits.best.model if analysis.fits else None
        for plot in all_plots(analysis.table, model, analysis.transfer_ms):
            written += write_plots([plot], out / PLOTS_DIR, FORMATS)
            plot.figure.clear()
            if tick:
                tick(plot.name)
    return written


def progress_steps(analysis_records: int, plots: bool = True) -> int:
    """Ticks a full run makes: one per record, table, fits, criteria, tables, and one per plot."""
    from pdexporter.analysis.plots import PLOTS_WITH_MODEL

    return analysis_records + 4 + (PLOTS_WITH_MODEL if plots else 0)
