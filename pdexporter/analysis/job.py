"""The batch job, wired: samples -> table -> fits -> decision -> criteria -> plots -> files.

`analyse` is pure (data in, an `Analysis` out). `load_results` and `write_outputs` are the thin
I/O edges; the CLI commands (`export-table`, `report`, `decide`) call these and nothing else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
from pdexporter.analysis.breakeven import DECISION_JSON, DEFAULT_TRANSFER_MS, decision_document
from pdexporter.analysis.criteria import CRITERIA_JSON, Criterion, criteria_document, evaluate_criteria
from pdexporter.analysis.models import FitReport, fit_data, fit_models
from pdexporter.analysis.table import (
    ConfigSamples,
    build_table,
    pooled,
    samples_from_record,
    top_level_mismatches,
    write_table,
)
from pdexporter.engines import DEFAULT_ENGINE
from pdexporter.errors import RecordError
from pdexporter.measure.store import ResultsStore, load_record_file

__all__ = [
    "FITS_JSON",
    "PLOTS_DIR",
    "Analysis",
    "Arms",
    "Tick",
    "analyse",
    "analyse_passive",
    "injected_values",
    "joined_out_dir",
    "load_joined",
    "load_passive_events",
    "request_prompts",
    "load_results",
    "progress_steps",
    "record_paths",
    "validate_campaigns",
    "write_outputs",
]

FITS_JSON = "fits.json"
PLOTS_DIR = "plots"

Tick = Callable[[str], None]


@dataclass
class Arms:
    """The offloaded arm beside the colocated one (docs/disaggregation.md)."""

    samples: list[ConfigSamples]
    table: pd.DataFrame  # the offloaded arm's own table
    transfer: Any  # arms.TransferModel | None
    thresholds: Any  # analysis.thresholds.ThresholdSet | None: what `pdexporter thresholds` computes by default
    source: str


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
    arms: Arms | None = None  # with an offloaded arm: `table` is the colocated table joined with it
    passive: Any = None  # passive_model.PassiveAnswer: the event-fitted model (export-table --mode passive)

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


def load_joined(results_dirs: Sequence[str | Path], tick: Tick | None = None, *,
                pool: bool = False) -> list[ConfigSamples]:
    """Every record of several results directories as one grid (a sweep split over Kubernetes
    pods, one directory per chunk size). A grid point in two of them is refused: which of the
    two measurements is the table's would be a guess. With `pool`, its repetitions are pooled
    instead (the same point measured in two sessions of one engine, GPU and model: both are
    measurements of it, and the spread between sessions belongs in its intervals)."""
    from pdexporter.analysis.campaigns import check_fit_inputs

    check_fit_inputs(results_dirs)
    samples: dict[tuple[int, int, int], ConfigSamples] = {}
    seen: dict[tuple[int, int, int], Path] = {}
    for directory in results_dirs:
        for sample in load_results(directory, tick):
            where = Path(directory)
            b, d, p = sample.key
            if sample.key in seen:
                first = samples[sample.key]
                if not pool:
                    raise RecordError(f"B={b} D={d} P={p} is in both {seen[sample.key]} and {where}: "
                                      "join results directories of different grid points (or pool them)")
                for attr in ("engine", "gpu", "model", "arm", "kv_connector"):
                    if getattr(first, attr) != getattr(sample, attr):
                        raise RecordError(f"B={b} D={d} P={p}: {attr} {getattr(first, attr)!r} in "
                                          f"{seen[sample.key]} but {getattr(sample, attr)!r} in {where}: "
                                          "only measurements of one setup pool")
                samples[sample.key] = pooled(first, sample, f"{first.source} + {sample.source}")
                continue
            seen[sample.key] = where
            samples[sample.key] = sample
    return list(samples.values())


def joined_out_dir(results_dirs: Sequence[str | Path]) -> Path:
    """Where a join's outputs go by default: the one directory, or the directories' common parent."""
    if len(results_dirs) == 1:
        return Path(results_dirs[0])
    return Path(os.path.commonpath([os.path.abspath(d) for d in results_dirs]))


def analyse(samples: Sequence[ConfigSamples], transfer_ms: float = DEFAULT_TRANSFER_MS, source: str = "",
            tick: Tick | None = None, *, offloaded: Sequence[ConfigSamples] | None = None,
            offloaded_source: str = "", transfer: Any = None,
            passive_events: Mapping[tuple[int, int, int], int] | None = None,
            min_events: int | None = None,
            campaign_variation: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None,
            thresholds: bool = True) -> Analysis:
    """`offloaded`: the offloaded arm's samples; the table then carries both arms (`arms.join_arms`),
    and decision.json the two-arm verdict's models; `transfer` a given `arms.TransferModel` (the
    measured one, fitted on the offloaded arm, wins). `min_events` (passive tables): add the event
    counts, the too-few mark and the bootstrap intervals (`analysis.passive`); `passive_events`
    counts events whose values were lost. `campaign_variation`: (variation, headline) of
    `pdexporter validate` (`campaigns.load_variation`), carried into decision.json's intervals.
    `thresholds=False`: no router thresholds for a two-arm table (`validate`'s fits read only decision.json)."""
    if not samples:
        raise RecordError(f"{source or 'input'}: nothing to analyse")
    if offloaded is not None:
        wrong = sorted({s.arm for s in samples if s.arm != "colocated"})
        if wrong:
            raise RecordError(f"{source}: records of the {', '.join(wrong)} arm where the colocated arm is expected")
        if not offloaded or any(s.arm != "offloaded" for s in offloaded):
            raise RecordError(f"--offloaded {offloaded_source}: expected records of the offloaded arm "
                              "(config.arm = offloaded: DecodeBenchConnector or a P/D pair's decode instance)")
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
        decision = decision_document(fits, table, transfer_ms, source=source, data=data)
        if campaign_variation is not None:
            from pdexporter.analysis.campaigns import fold_variation

            decision = fold_variation(decision, *campaign_variation)
    else:
        notes.append("no grid point with D >= 1 and a measured cost: no cost model fitted, no decision.json")
    if tick:
        tick("fits")
    criteria = evaluate_criteria(table, fits, transfer_ms, samples=samples)
    if tick:
        tick("criteria")
    arms = None
    if offloaded is not None:
        from pdexporter.analysis.arms import fit_transfer, join_arms, two_arm_section
        from pdexporter.analysis.thresholds import compute_thresholds

        off_table = build_table(offloaded)
        measured = fit_transfer(offloaded)
        model = measured or transfer
        thresholds_doc = None
        if decision is not None:
            section = two_arm_section(samples, offloaded, model, decision, source=offloaded_source)
            if section is None:
                notes.append("the offloaded arm has too few points for the two-arm models; decision.json keeps the "
                             "seed's rule only")
            else:
                decision["two_arm"] = section
                decision["rule"] = "two-arm (see two_arm.rule); the seed's: offload when cost_ms > transfer_ms"
                thresholds_doc = compute_thresholds(decision) if thresholds else None
        table = join_arms(table, off_table)
        arms = Arms(list(offloaded), off_table, model, thresholds_doc, offloaded_source)
    return Analysis(list(samples), table, fits, decision, criteria, top_level_mismatches(samples), transfer_ms,
                    source, notes, arms)


def write_outputs(analysis: Analysis, out_dir: str | Path, *, plots: bool = True, parquet: bool = True,
                  tick: Tick | None = None) -> list[Path]:
    """interference_table.csv (+ .parquet), fits.json, decision.json, criteria.json, plots/*.png|svg."""
    out = Path(out_dir)
    written = write_table(analysis.table, out, parquet=parquet)
    written.append(atomic_write_json(out / FITS_JSON, analysis.fits_document()))
    if analysis.decision is not None:
        written.append(atomic_write_json(out / DECISION_JSON, analysis.decision))
    if analysis.arms is not None and analysis.arms.thresholds is not None:
        from pdexporter.analysis.thresholds import THRESHOLDS_JSON

        written.append(atomic_write_json(out / THRESHOLDS_JSON, analysis.arms.thresholds.to_dict()))
    written.append(atomic_write_json(out / CRITERIA_JSON, criteria_document(analysis.criteria)))
    if analysis.passive is not None:
        from pdexporter.analysis.passive_model import PASSIVE_MODEL_JSON, PASSIVE_TABLE_CSV

        written.append(atomic_write_text(out / PASSIVE_TABLE_CSV, analysis.passive.table().to_csv(index=False)))
        written.append(atomic_write_json(out / PASSIVE_MODEL_JSON, analysis.passive.to_dict()))
    if tick:
        tick("tables")
    if plots:
        from pdexporter.analysis.plots import FORMATS, all_plots, passive_convergence, write_plots

        model = analysis.fits.best.model if analysis.fits else None
        extra = [passive_convergence(analysis.passive.convergence, analysis.modelled)] if analysis.passive else []
        for plot in all_plots(analysis.table, model, analysis.transfer_ms) + extra:
            written += write_plots([plot], out / PLOTS_DIR, FORMATS)
            plot.figure.clear()
            if tick:
                tick(plot.name)
    return written


def request_prompts(results_dirs: Sequence[str | Path]) -> dict[str, int]:
    """Request id -> prompt tokens of every production prefill the traces told, from each passive
    directory's `REQUESTS_LOG` (requests.jsonl, `run --passive --out`) where it is there: where a joint
    event's record predates its `prompt_sizes`, its prompts by its request ids
    (`analysis.passive_model.joint_prompts`). Lines that do not parse are skipped."""
    from pdexporter.measure.passive import REQUESTS_LOG

    out: dict[str, int] = {}
    for directory in results_dirs:
        path = Path(directory) / REQUESTS_LOG
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("request_id"), str) \
                    and isinstance(row.get("prompt_tokens"), int):
                out[row["request_id"]] = row["prompt_tokens"]
    return out


def load_passive_events(results_dirs: Sequence[str | Path]) -> list[Any]:
    """The published events of the passive records under these directories, and their joint ones
    (`JOINT_DIR`), each at its exact (D, P) (`analysis.passive_model.events_from_records`; a joint
    event's prompts from its record, else from the directory's requests.jsonl: `request_prompts`)."""
    from pdexporter.analysis.passive_model import events_from_records
    from pdexporter.measure.passive import JOINT_DIR

    paths = [path for directory in results_dirs for path in record_paths(directory)]
    paths += [path for directory in results_dirs
              for path in ResultsStore(Path(directory) / JOINT_DIR).iter_record_paths()]
    return events_from_records((load_record_file(path) for path in paths), request_prompts(results_dirs))


def injected_values(results_dir: str | Path) -> dict[tuple[int, int, int], float]:
    """The injected table's aggregate interference per grid point (the passive model's reference)."""
    table = build_table([s for s in load_results(results_dir) if not s.passive])
    if not len(table):
        raise RecordError(f"{results_dir}: no injected (active) records to compare the passive model with")
    rows = table[table["aggregate_interference_ms"].notna()]
    return {(int(b), int(d), int(p)): float(v) for b, d, p, v in
            zip(rows["chunk_size"], rows["decode_batch_size"], rows["new_prefill_tokens"],
                rows["aggregate_interference_ms"])}


def analyse_passive(analysis: Analysis, events: Sequence[Any], *, decode_batch_sizes: Sequence[int] | None = None,
                    prefill_tokens: Sequence[int] | None = None,
                    injected: Mapping[tuple[int, int, int], float] | None = None,
                    campaign_variation: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None) -> Analysis:
    """Passive records: the model fitted on their events (`analysis.passive_model`), its table and
    convergence, and decision.json from it (`mode: passive`). Without a usable event the analysis
    is returned as it was, with a note. `campaign_variation` as for `analyse`: carried into the
    table's intervals and decision.json."""
    from pdexporter.analysis.passive_model import DEFAULT_D, DEFAULT_P, Grid, answer, passive_decision

    chunks = tuple(sorted({e.chunk_size for e in events}))
    grid = Grid(chunks, tuple(d for d in (decode_batch_sizes or DEFAULT_D) if d >= 1),
                tuple(prefill_tokens or DEFAULT_P))
    variation = campaign_variation[0] if campaign_variation is not None else None
    result = answer(events, grid, injected=injected, variation=variation) if chunks else None
    if result is None:
        analysis.notes.append(f"passive: {len(events)} published events with their exact D and P, too few inside "
                              "the grid's prompt span to fit the event model; decision.json is the cells' fit")
        return analysis
    analysis.passive = result
    engines = sorted({s.engine for s in analysis.samples}) or [DEFAULT_ENGINE]
    analysis.decision = passive_decision(result, analysis.transfer_ms, modelled=analysis.modelled,
                                         engine=engines[0], source=analysis.source)
    if campaign_variation is not None:
        from pdexporter.analysis.campaigns import fold_variation

        analysis.decision = fold_variation(analysis.decision, *campaign_variation)
    return analysis


def progress_steps(analysis_records: int, plots: bool = True) -> int:
    """Ticks a full run makes: one per record, table, fits, criteria, tables, and one per plot
    (matplotlib, behind analysis.plots, is imported only when there are plots to count)."""
    if not plots:
        return analysis_records + 4
    from pdexporter.analysis.plots import PLOTS_WITH_MODEL

    return analysis_records + 4 + PLOTS_WITH_MODEL


def validate_campaigns(colocated: Sequence[str | Path], offloaded: Sequence[str | Path] = (),
                       tick: Tick | None = None) -> dict[str, Any]:
    """`pdexporter validate`: leave one campaign out over the given results directories (each with
    its `campaign.yaml`; `analysis.campaigns`): the held-out points, each arm's error and coverage
    per campaign, and the campaign variation to carry into decision documents."""
    from pdexporter.analysis import campaigns as cps

    found = cps.find_campaigns([(d, "colocated") for d in colocated] + [(d, "offloaded") for d in offloaded])
    if not any(c.role == "fit" for c in found):
        raise RecordError("no fit campaign among the inputs: nothing to fit the models on")
    if len(found) < 2:  # nothing would be held out: an empty table written over the last one
        raise RecordError(f"one campaign among the inputs ({found[0].id}): leaving one out needs two or more "
                          "(directories of one campaign.yaml id are one campaign)")
    samples = {c.id: {"colocated": [s for d in c.colocated for s in load_results(d)],
                      "offloaded": [s for d in c.offloaded for s in load_results(d)]} for c in found}

    def fit(col: Sequence[ConfigSamples], off: Sequence[ConfigSamples]) -> dict[str, Any] | None:
        return analyse(col, offloaded=list(off) or None, source="held-out fit", thresholds=False).decision

    return cps.held_out_document(found, cps.held_out_points(found, samples, fit, tick))
