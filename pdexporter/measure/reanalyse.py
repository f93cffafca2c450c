"""Recompute records from their raw timestamps, after the window maths changed or was fixed.

Every repetition keeps the raw file it was computed from (`reps[k].raw`: probe and prefill event
times, the engine's step lines and /metrics around the window) and Phase 1's streams sit in
`raw/D{d}_baseline.json.gz`, so a record can be rebuilt without the engine: the same
`protocol.analyse_traces` and record builders as a live run, nothing re-measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdexporter.engine.iterlog import parse_iteration_lines
from pdexporter.errors import RecordError
from pdexporter.measure.point import PointSpec
from pdexporter.measure.protocol import ProtocolSettings, StreamTrace, analyse_traces
from pdexporter.measure.records import RecordConfig, RepRecord, RunRecord, derived_block, interference_block
from pdexporter.measure.store import ResultsStore
from pdexporter.measure.window import BaselineStats, baseline_stats, derive

Aggregate = Callable[[RecordConfig, list[RepRecord], RunRecord], RunRecord]


@dataclass(frozen=True)
class Reanalysed:
    record: RunRecord
    reps: int
    changed: int  # repetitions whose derived numbers moved


def phase1_stats(store: ResultsStore, chunk_size: int, d: int, settings: ProtocolSettings) -> BaselineStats | None:
    if d == 0:
        return None
    path = store.baseline_raw_path(chunk_size, d)
    if not path.exists():
        raise RecordError(f"{path}: Phase 1 timestamps missing; the record cannot be re-analysed")
    raw = store.load_raw(path)
    return baseline_stats([StreamTrace.from_raw(p).token_times() for p in raw.get("probes", [])], settings.window)


def reanalyse_rep(store: ResultsStore, record: RunRecord, rep: RepRecord, baseline: BaselineStats | None,
                  settings: ProtocolSettings) -> RepRecord:
    c = record.config
    if rep.raw is None:
        raise RecordError(f"{store.record_path(*record.key)}: repetition {rep.rep} has no raw timestamps")
    raw = store.load_raw(store.chunk_dir(c.chunk_size) / rep.raw)
    probes = [StreamTrace.from_raw(p) for p in raw.get("probes", [])]
    prefill = StreamTrace.from_raw(raw["prefill"])
    steps = parse_iteration_lines(raw["engine_steps"]) if raw.get("engine_steps") else None
    window = analyse_traces(probes, raw.get("t_inject_ns", 0), raw["t_first_ns"], baseline, settings.window, steps)
    spec = PointSpec(c.chunk_size, c.decode_batch_size, c.new_prefill_tokens)
    chunks = tuple(s.context_tokens for s in steps if s.context_tokens > 0) if steps else None
    return rep.model_copy(update={
        "interference": interference_block(
            window, num_chunks_expected=spec.num_chunks_expected, engine_chunks=chunks or None,
            prefill_prompt_tokens=prefill.prompt_tokens,
        ),
        "derived": derived_block(derive(baseline, window, c.decode_batch_size)),
    })


def reanalyse_record(store: ResultsStore, record: RunRecord, settings: ProtocolSettings,
                     aggregate: Aggregate) -> Reanalysed:
    """`aggregate(config, reps, old_record)` rebuilds the top level (plain medians, or a sweep's
    attempts), so the record keeps the shape its producer gave it."""
    c = record.config
    baseline = phase1_stats(store, c.chunk_size, c.decode_batch_size, settings)
    reps = [reanalyse_rep(store, record, rep, baseline, settings) for rep in record.reps]
    changed = sum(new.derived != old.derived for new, old in zip(reps, record.reps))
    return Reanalysed(aggregate(c, reps, record), len(reps), changed)
