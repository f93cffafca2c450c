"""Records -> the interference table: one row per (chunk size, D, P), medians over repetitions.

The table's first columns are exactly the seed's (`SEED_COLUMNS`); the extras follow. Every value
is the p50 over repetitions, as the seed asks ("report p50 over 5 runs"), recomputed here from the
record's `reps` rather than trusted from its top level (which `measure.records.aggregate` wrote
the same way; `top_level_mismatches` says where the two disagree). A record without `reps` (a
hand-written seed-format file) contributes its top level as its single repetition.

The same rows come from Prometheus (`exporter.prometheus`): there each analysed window is one
repetition. Both sources meet in `ConfigSamples`, so one function builds the table.

Columns: the key columns, then every quantity `pdexporter.measure.quantities` declares with a
table column (the seed's six first, in its order; `docs/metrics.md` lists them all with their
record keys and meanings), then the CVs over repetitions and where the numbers come from, and
last a 95 % bootstrap confidence interval of the median (`analysis.bootstrap`, seeded per grid
point) for the penalty, the prefill duration and the aggregate interference.
"""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from pdexporter._internal.atomic import atomic_write_bytes, atomic_write_text
from pdexporter.analysis.bootstrap import bootstrap_ci, point_seed
from pdexporter.engines import DEFAULT_ENGINE, adapter, largest_graph, registered
from pdexporter.measure.quantities import seed_columns, tabulated
from pdexporter.measure.records import BaselineBlock, DerivedBlock, InterferenceBlock, RunRecord, counted_reps, cv

__all__ = [
    "ARM_COLUMNS", "ARM_VALUES", "CI_COLUMNS", "CI_VALUES", "COLUMNS", "ChunkSteps", "ConfigSamples", "DIGITS",
    "EXTRA_COLUMNS", "EXTRA_REP_VALUES", "IDENTITY_COLUMNS", "INT_VALUES", "KEY_COLUMNS", "OFFLOADED_COLUMNS",
    "REP_VALUES", "SEED_COLUMNS", "TABLE_CSV", "TABLE_PARQUET", "aggregate_reps", "any_modelled", "build_table",
    "parquet_available", "rep_values", "samples_from_record", "table_row", "top_level_mismatches", "write_table",
]

KEY_COLUMNS = ("chunk_size", "decode_batch_size", "new_prefill_tokens")
SEED_COLUMNS = KEY_COLUMNS + seed_columns()
# Per-repetition values medianed into the table (the seed's value columns first): every quantity
# `measure.quantities` declares with a table column.
REP_VALUES = tuple(q.column for q in tabulated() if q.column)
EXTRA_REP_VALUES = REP_VALUES[len(SEED_COLUMNS) - len(KEY_COLUMNS):]
INT_VALUES = frozenset(q.column for q in tabulated("offloaded") if q.column and q.integer)
# What the records say about where the numbers come from, one value per grid point.
IDENTITY_COLUMNS = ("modelled", "engine", "gpu", "model")
EXTRA_COLUMNS = (
    ("reps", "cv_tpot_penalty", "cv_prefill_duration", "cv_aggregate_interference")
    + EXTRA_REP_VALUES
    + IDENTITY_COLUMNS
)
# 95 % bootstrap intervals of the medians (after every other column, so no existing one moves).
CI_VALUES = ("tpot_penalty_ms", "prefill_duration_ms", "aggregate_interference_ms")
CI_COLUMNS = tuple(f"{name}_ci95_{end}" for name in CI_VALUES for end in ("low", "high"))
COLUMNS = SEED_COLUMNS + EXTRA_COLUMNS + CI_COLUMNS
# The offloaded arm's table (records of a P/D pair's decode instance, docs/disaggregation.md)
# carries these after all of the above: which arm and connector, and the routed request's numbers.
ARM_VALUES = tuple(q.column for q in tabulated("offloaded") if q.column and q.arm == "offloaded")
ARM_COLUMNS = ("arm", "kv_connector") + ARM_VALUES
OFFLOADED_COLUMNS = COLUMNS + ARM_COLUMNS
TABLE_CSV = "interference_table.csv"
TABLE_PARQUET = "interference_table.parquet"
DIGITS = 4


@dataclass(frozen=True)
class ChunkSteps:
    """One repetition's slow (mixed) step times in order, with the baseline they are compared to."""

    baseline_ms: float
    step_times_ms: tuple[float, ...]


@dataclass(frozen=True)
class ConfigSamples:
    """Everything the analysis needs about one grid point, whatever it came from."""

    chunk_size: int
    decode_batch_size: int
    new_prefill_tokens: int
    reps: tuple[Mapping[str, float | int | None], ...]
    steps: tuple[ChunkSteps, ...] = ()
    top_level: Mapping[str, float | int | None] | None = None
    modelled: bool = False
    engine: str = DEFAULT_ENGINE
    gpu: str | None = None
    model: str | None = None
    note: str | None = None
    source: str = ""
    arm: str = "colocated"  # "offloaded": a P/D pair's decode instance (records' config.arm)
    kv_connector: str | None = None
    profile: str | None = None  # the embedded engine's profile, where it made these (records' config.profile)
    passive: bool = False  # production prefills (`run --passive`): the key is a bin (analysis.passive)
    # `reps`' own chunk steps, one per repetition in `reps` (None: that one has none); `steps` keeps
    # every repetition's, the re-run attempts a sweep did not aggregate included (`analysis.cv_causes`)
    rep_steps: tuple[ChunkSteps | None, ...] = ()
    # every step size the engine captured a CUDA graph for, where its command line says (records'
    # config.engine_command, read by the engine's adapter: `graph_sizes`); None: unknown, its rule's default
    graph_sizes: tuple[int, ...] | None = None

    @property
    def graph_max_tokens(self) -> int | None:
        """The largest step it replayed as a CUDA graph (0: none; None: its command line does not say)."""
        return None if self.graph_sizes is None else largest_graph(self.graph_sizes)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.chunk_size, self.decode_batch_size, self.new_prefill_tokens)


def pooled(first: ConfigSamples, other: ConfigSamples, source: str | None = None) -> ConfigSamples:
    """One grid point measured twice (two sessions, two directories) as one: the repetitions of both,
    their chunk steps where each side has them for every repetition, no top-level values (the
    table's medians come from the pooled repetitions)."""
    steps = first.steps + other.steps if len(first.steps) == len(first.reps) and \
        len(other.steps) == len(other.reps) else ()
    rep_steps = first.rep_steps + other.rep_steps if len(first.rep_steps) == len(first.reps) and \
        len(other.rep_steps) == len(other.reps) else ()
    return replace(first, reps=first.reps + other.reps, steps=steps, rep_steps=rep_steps, top_level=None,
                   source=first.source if source is None else source)


def rep_values(
    baseline: BaselineBlock, interference: InterferenceBlock, derived: DerivedBlock, decode_batch_size: int
) -> dict[str, float | int | None]:
    """One repetition (or a record's top level) as the table's value columns."""
    blocks = {"baseline": baseline, "interference": interference, "derived": derived}
    values = {q.column: getattr(blocks[q.block], q.field, None) for q in tabulated("offloaded") if q.column}
    total = values.get("total_interference_ms")
    if values.get("aggregate_interference_ms") is None and total is not None:
        values["aggregate_interference_ms"] = total * decode_batch_size  # records written before it existed
    # Records written before the headline penalty was the token-weighted mean: the same definition
    # from the mean they carry (measure.window, "Penalty"); a record with the seed's keys alone (its
    # example) has the p50 only, which then stands in.
    if values.get("tpot_interference_ms") is None and values.get("tpot_interference_p50_ms") is not None:
        values["tpot_interference_ms"] = values["tpot_interference_p50_ms"]
        values["tpot_penalty_ms"] = values.get("tpot_penalty_p50_ms")
    mean, base = values.get("tpot_interference_ms"), values.get("tpot_baseline_ms")
    if values.get("tpot_penalty_ms") is None and mean is not None and base is not None:
        values["tpot_penalty_ms"] = mean - base
        if base:
            values["penalty_ratio"] = (mean - base) / base
    return values


def samples_from_record(record: RunRecord, source: str = "") -> ConfigSamples:
    c = record.config
    d = c.decode_batch_size
    top = rep_values(record.baseline, record.interference, record.derived, d)
    # A sweep that re-ran a noisy configuration keeps every repetition but summarises one attempt
    # (`summary.aggregated_reps`); the table follows the record. Step times use every repetition.
    chosen = (record.summary.model_extra or {}).get("aggregated_reps") if record.summary else None
    if record.reps:
        used = counted_reps([r for r in record.reps if chosen is None or r.rep in chosen])
        reps = tuple(rep_values(r.baseline, r.interference, r.derived, d) for r in used)
        blocks = [(r.baseline, r.interference) for r in record.reps]
        rep_steps = tuple(_chunk_steps(r.baseline, r.interference) for r in used)
    else:
        reps = (top,)
        blocks = [(record.baseline, record.interference)]
        rep_steps = (_chunk_steps(record.baseline, record.interference),)
    steps = tuple(s for s in (_chunk_steps(b, i) for b, i in blocks) if s is not None)
    return ConfigSamples(
        chunk_size=c.chunk_size, decode_batch_size=d, new_prefill_tokens=c.new_prefill_tokens,
        reps=reps, steps=steps, top_level=top, modelled=c.modelled, engine=c.engine, gpu=c.gpu,
        model=c.model, note=c.note, source=source, arm=c.arm, kv_connector=c.kv_connector, profile=c.profile,
        passive=c.mode == "passive", rep_steps=rep_steps, graph_sizes=_graph_sizes(record),
    )


def _graph_sizes(record: RunRecord) -> tuple[int, ...] | None:
    """Every size the engine that measured the record captured a CUDA graph for (a step is padded to the next), where
    its command line says; None where there is none to read."""
    c = record.config
    if not c.engine_command or c.engine not in registered():
        return None
    return adapter(c.engine).graph_sizes(c.engine_command, c.chunk_size)


def _chunk_steps(baseline: BaselineBlock, interference: InterferenceBlock) -> ChunkSteps | None:
    if baseline.tpot_p50_ms is None or not interference.chunk_step_times_ms:
        return None
    return ChunkSteps(baseline.tpot_p50_ms, tuple(interference.chunk_step_times_ms))


def _median(values: Sequence[float | int | None], integer: bool) -> float | int | None:
    present = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not present:
        return None
    med = statistics.median(present)
    # The record's own aggregation rounds medians of integers the same way (records._median_block).
    return int(round(med)) if integer else round(med, DIGITS)


def _cv(values: Sequence[float | int | None]) -> float | None:
    value = cv([None if v is None else float(v) for v in values])
    return None if value is None else round(value, DIGITS)


def aggregate_reps(reps: Sequence[Mapping[str, float | int | None]],
                   names: Sequence[str] = REP_VALUES) -> dict[str, float | int | None]:
    """The seed's aggregation: p50 over repetitions, column by column."""
    return {name: _median([r.get(name) for r in reps], name in INT_VALUES) for name in names}


def table_row(s: ConfigSamples) -> dict[str, Any]:
    row: dict[str, Any] = dict(zip(KEY_COLUMNS, s.key))
    row.update(aggregate_reps(s.reps))
    row["reps"] = len(s.reps)
    row["cv_tpot_penalty"] = _cv([r.get("tpot_penalty_ms") for r in s.reps])
    row["cv_prefill_duration"] = _cv([r.get("prefill_duration_ms") for r in s.reps])
    row["cv_aggregate_interference"] = _cv([r.get("aggregate_interference_ms") for r in s.reps])
    row.update(modelled=bool(s.modelled), engine=s.engine, gpu=s.gpu, model=s.model)
    row.update(arm=s.arm, kv_connector=s.kv_connector)
    row.update(aggregate_reps(s.reps, ARM_VALUES))
    for name in CI_VALUES:
        low, high = bootstrap_ci([r.get(name) for r in s.reps], seed=point_seed(s.key, name))
        row[f"{name}_ci95_low"] = None if low is None else round(low, DIGITS)
        row[f"{name}_ci95_high"] = None if high is None else round(high, DIGITS)
    return row


def build_table(samples: Iterable[ConfigSamples]) -> pd.DataFrame:
    """One row per grid point, sorted by (chunk size, D, P), columns in `COLUMNS` order (and
    `ARM_COLUMNS` after them when any record is of the offloaded arm)."""
    samples = list(samples)
    rows = [table_row(s) for s in samples]
    offloaded = any(s.arm == "offloaded" for s in samples)
    columns = OFFLOADED_COLUMNS if offloaded else COLUMNS
    frame = pd.DataFrame(rows, columns=list(columns))
    for name in KEY_COLUMNS + ("reps",):
        frame[name] = frame[name].astype("int64")
    for name in INT_VALUES:
        if name in frame:
            frame[name] = frame[name].astype("Int64")
    for name in columns:
        if name not in INT_VALUES and name not in KEY_COLUMNS and name not in ("reps", *IDENTITY_COLUMNS,
                                                                                 "arm", "kv_connector"):
            frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("float64")
    frame["modelled"] = frame["modelled"].astype(bool)
    return frame.sort_values(list(KEY_COLUMNS), kind="stable").reset_index(drop=True)


def top_level_mismatches(samples: Iterable[ConfigSamples], rel_tol: float = 1e-3) -> list[str]:
    """Grid points whose record top level differs from the medians of its reps (should be none)."""
    out: list[str] = []
    for s in samples:
        if s.top_level is None or len(s.reps) < 1:
            continue
        again = aggregate_reps(s.reps)
        for name in REP_VALUES:
            a, b = again.get(name), s.top_level.get(name)
            if a is None and b is None:
                continue
            if a is None or b is None or not math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-3):
                out.append(f"B={s.chunk_size} D={s.decode_batch_size} P={s.new_prefill_tokens}: {name} "
                           f"top level {b!r} vs median of reps {a!r}")
    return out


def any_modelled(table: pd.DataFrame) -> bool:
    return bool(table["modelled"].any()) if len(table) else False


def write_table(table: pd.DataFrame, out_dir: str | Path, *, parquet: bool = True) -> list[Path]:
    """interference_table.csv (and .parquet when pyarrow is importable), written atomically."""
    out = Path(out_dir)
    written = [atomic_write_text(out / TABLE_CSV, table.to_csv(index=False))]
    if parquet and parquet_available():
        buffer = io.BytesIO()
        table.to_parquet(buffer, index=False)
        written.append(atomic_write_bytes(out / TABLE_PARQUET, buffer.getvalue()))
    return written


def parquet_available() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True
