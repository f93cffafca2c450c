"""Recompute records from their raw timestamps, after the window maths changed or was fixed.

Every repetition keeps the raw file it was computed from (`reps[k].raw`: probe and prefill event
times, the engine's step lines and /metrics around the window) and Phase 1's streams sit in
`raw/D{d}_baseline.json.gz`, so a record can be rebuilt without the engine: the same
`protocol.analyse_traces` and record builders as a live run, nothing re-measured.

A record of `run --passive` (a production prefill's event) has no Phase 1 file: its baseline is
the quiet period before the event, kept in the repetition's baseline block with the slow-step
threshold its window used (`BaselineStats.from_record`), and its D and P are the engine's
(`passive` block). Each event keeps what the exporter decided live (its run of slow steps as
t_inject / t_first, D, P, attribution, baseline) and gets its window numbers again; its joint and
merged events (`joint/`, `merged/` beside the published ones) likewise.

The window settings are the sweep's: a directory a sweep wrote keeps its spec in `sweep.json`, and its
`protocol` block (the warm-up tokens a window skips, its recovery intervals, the slow-step rule) is what
the records are re-derived with. A `measure` or `run` output keeps the settings it ran with in
`window.json`; one written before that file existed is re-derived with the seed's defaults, which those
commands always ran with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pdexporter.engines import adapter
from pdexporter.errors import ConfigError, RecordError
from pdexporter.measure.passive import JOINT_DIR, MERGED_DIR
from pdexporter.measure.pd import RouteTiming, offload_numbers
from pdexporter.measure.protocol import (
    ProtocolSettings,
    StreamTrace,
    analyse_traces,
    chunks_expected,
    chunks_from_steps,
    expected_schedule,
    logged_injection_problem,
    prompt_tokens_check,
    raw_int,
)
from pdexporter.measure.records import (
    RecordConfig,
    RepRecord,
    RunRecord,
    aggregate,
    derived_block,
    interference_block,
)
from pdexporter.measure.store import WINDOW_FILE, ResultsStore
from pdexporter.measure.window import BaselineStats, baseline_stats, derive

__all__ = [
    "Aggregate", "DirectoryJob", "Reanalysed", "SourceComparison", "compare_sources", "keep_shape", "phase1_stats",
    "reanalyse_directory", "reanalyse_passive_record", "reanalyse_record", "reanalyse_rep",
    "records_are_the_log_analysis",
]

Aggregate = Callable[[RecordConfig, list[RepRecord], RunRecord], RunRecord]


@dataclass(frozen=True)
class Reanalysed:
    record: RunRecord
    reps: int
    changed: int  # repetitions whose derived numbers moved
    kept: int = 0  # passive events left as measured (nothing to re-derive them from)


def _probes(raw: dict[str, Any], path: Path, d: int, what: str) -> list[StreamTrace]:
    """The decode streams of a raw file: one line naming the file where they are not there to
    re-derive from (a file of D > 0 decodes with none gave that repetition null numbers, and
    `reanalyse` wrote them over the measured ones)."""
    probes = raw.get("probes", [])
    if not isinstance(probes, list):
        raise RecordError(f"{path}: probes: must be a list of streams (got {type(probes).__name__})")
    if d > 0 and not probes:
        raise RecordError(f"{path}: probes: empty, but {what} ran D={d} decodes: the raw file is damaged and "
                          "cannot re-derive it")
    return [StreamTrace.from_raw(p, where=f"{path}: probes[{i}]") for i, p in enumerate(probes)]


def phase1_stats(store: ResultsStore, chunk_size: int, d: int, settings: ProtocolSettings) -> BaselineStats | None:
    if d == 0:
        return None
    path = store.baseline_raw_path(chunk_size, d)
    if not path.exists():
        raise RecordError(f"{path}: Phase 1 timestamps missing; the record cannot be re-analysed")
    raw = store.load_raw(path)
    probes = _probes(raw, path, d, "Phase 1")
    return baseline_stats([p.token_times() for p in probes], settings.window)


def reanalyse_rep(store: ResultsStore, record: RunRecord, rep: RepRecord, baseline: BaselineStats | None,
                  settings: ProtocolSettings, *, use_engine_log: bool = True) -> RepRecord:
    """`use_engine_log=False` analyses the window as if the engine's step log had not been read
    (what an engine someone else runs gives): chunk steps from the schedule and the cadence. Which
    repetitions count (`injection_check`, from the log when there is one) is the same either way, so
    the two analyses compare the same repetitions."""
    c = record.config
    if rep.raw is None:
        raise RecordError(f"{store.record_path(*record.key)}: repetition {rep.rep} has no raw timestamps")
    path = store.chunk_dir(c.chunk_size) / rep.raw
    raw = store.load_raw(path)
    probes = _probes(raw, path, c.decode_batch_size, f"repetition {rep.rep}")
    if "prefill" not in raw:
        raise RecordError(f"{path}: prefill: required field is missing")
    prefill = StreamTrace.from_raw(raw["prefill"], where=f"{path}: prefill")
    t_inject, t_first = raw_int(raw, "t_inject_ns", str(path), 0), raw_int(raw, "t_first_ns", str(path))
    # the raw file keeps the engine's step lines in its own format: its adapter reads them back
    logged = adapter(c.engine).parse_step_log(raw["engine_steps"]) if raw.get("engine_steps") else None
    steps = logged if use_engine_log else None
    schedule = expected_schedule(c.engine, c.new_prefill_tokens, c.chunk_size, c.decode_batch_size)
    window = analyse_traces(probes, t_inject, t_first, baseline, settings.window, steps, schedule, engine=c.engine,
                            prompt_tokens=c.new_prefill_tokens)
    chunks = chunks_from_steps(steps, c.new_prefill_tokens)
    route = RouteTiming.from_raw(raw["offload"], raw.get("t_inject_clock_ns", 0)) if raw.get("offload") else None
    return rep.model_copy(update={
        "interference": interference_block(
            window, num_chunks_expected=chunks_expected(c.engine, schedule),
            engine_chunks=chunks or None, prefill_prompt_tokens=prefill.prompt_tokens,
            offload=offload_numbers(route, rep.engine_metrics),
            prompt_tokens_check=prompt_tokens_check(prefill.prompt_tokens, c.new_prefill_tokens),
            injection_check=logged_injection_problem(logged, c.decode_batch_size),
        ),
        "derived": derived_block(derive(baseline, window, c.decode_batch_size)),
    })


def _passive_rep(store: ResultsStore, record: RunRecord, rep: RepRecord, settings: ProtocolSettings) -> RepRecord:
    """One production prefill's event (module docs) through the window maths again."""
    c = record.config
    info = (rep.model_extra or {}).get("passive") or {}
    b, theta = rep.baseline, rep.interference.slow_step_threshold_ms
    if (rep.raw is None or "decode_batch_size" not in info or "prompt_tokens" not in info or b is None
            or b.tpot_p50_ms is None or theta is None):
        return rep  # nothing to re-derive from: kept as measured
    base = BaselineStats.from_record(b.tpot_p50_ms, b.tpot_p90_ms, b.tpot_p99_ms, b.tpot_mean_ms, b.n_intervals,
                                     theta, settings.window)
    if abs(base.slow_threshold_ms(settings.window) - theta) > 1e-3:
        return rep  # analysed with other window settings than these: kept as measured
    path = store.chunk_dir(c.chunk_size) / rep.raw
    raw = store.load_raw(path)
    d, p = int(info["decode_batch_size"]), int(info["prompt_tokens"])
    probes = _probes(raw, path, d, f"event {rep.rep}")
    schedule = expected_schedule(c.engine, p, c.chunk_size, d)
    t_inject, t_first = raw_int(raw, "t_inject_ns", str(path), 0), raw_int(raw, "t_first_ns", str(path))
    window = analyse_traces(probes, t_inject, t_first, base, settings.window.beside_traffic(), None, schedule,
                            engine=c.engine)
    return rep.model_copy(update={
        "interference": interference_block(
            window, num_chunks_expected=chunks_expected(c.engine, schedule), engine_chunks=None,
            prefill_prompt_tokens=p, prompt_tokens_check=rep.interference.prompt_tokens_check),
        "derived": derived_block(derive(base, window, d)),
    })


def reanalyse_passive_record(store: ResultsStore, record: RunRecord, settings: ProtocolSettings) -> Reanalysed:
    """A `run --passive` record's events re-derived from their raw timestamps (module docs)."""
    reps = [_passive_rep(store, record, rep, settings) for rep in record.reps]
    changed = sum(new.derived != old.derived for new, old in zip(reps, record.reps))
    kept = sum(new is old for new, old in zip(reps, record.reps))
    rebuilt = aggregate(record.config, reps).model_copy(update={"provenance": record.provenance})
    return Reanalysed(rebuilt, len(reps), changed, kept)


def keep_shape(config: RecordConfig, reps: list[RepRecord], old: RunRecord) -> RunRecord:
    """A sweep's record (attempts, CV re-runs) is summarised as the sweep does; others by median."""
    summary = old.summary.model_dump() if old.summary else {}
    if "attempts" in summary:
        from pdexporter.sweep.plan import summarise_attempts
        from pdexporter.sweep.spec import CvSpec

        # The sweep's re-run budget is not in the record; the attempts it made are. A record the sweep
        # finished stays finished: its last attempt above the threshold is still `flagged` (with the
        # default budget a sweep of `max_reruns: 0` read as "a re-run to come", not flagged).
        cv = CvSpec(threshold=summary.get("cv_threshold", CvSpec().threshold),
                    max_reruns=max(0, int(summary.get("attempts") or 1) - 1))
        return summarise_attempts(config, reps, config.reps_planned, cv)
    return aggregate(config, reps)


def reanalyse_record(store: ResultsStore, record: RunRecord, settings: ProtocolSettings,
                     aggregate: Aggregate = keep_shape, *, use_engine_log: bool = True,
                     baselines: dict[tuple[int, int], BaselineStats | None] | None = None) -> Reanalysed:
    """`aggregate(config, reps, old_record)` rebuilds the top level (plain medians, or a sweep's
    attempts), so the record keeps the shape its producer gave it. `baselines`, where given, keeps
    Phase 1's statistics by (chunk size, D) for the next record of the same D (the same settings)."""
    c = record.config
    key = (c.chunk_size, c.decode_batch_size)
    if baselines is not None and key in baselines:
        baseline = baselines[key]
    else:
        baseline = phase1_stats(store, c.chunk_size, c.decode_batch_size, settings)
        if baselines is not None:
            baselines[key] = baseline
    reps = [reanalyse_rep(store, record, rep, baseline, settings, use_engine_log=use_engine_log) for rep in record.reps]
    changed = sum(new.derived != old.derived for new, old in zip(reps, record.reps))
    return Reanalysed(aggregate(c, reps, record), len(reps), changed)


# ---------------------------------------------------------------------------------------------
# With and without the engine's step log, on the same repetitions


@dataclass(frozen=True)
class SourceComparison:
    """One configuration analysed twice: with the engine log (exact) and from the cadence alone."""

    key: tuple[int, int, int]
    penalty_log_ms: float | None
    penalty_cadence_ms: float | None
    cv_log: float | None
    cv_cadence: float | None
    reps: int
    reps_same_steps: int  # repetitions whose located chunk steps are the log's

    @property
    def relative_difference(self) -> float | None:
        a, b = self.penalty_log_ms, self.penalty_cadence_ms
        return None if a is None or b is None or a == 0 else (b - a) / abs(a)

    def penalty_agrees(self, rel: float = 0.05, abs_ms: float = 2.0, small_ms: float = 40.0) -> bool:
        """Within `rel` of the log's penalty, or within `abs_ms` where that is under `small_ms`."""
        a, b = self.penalty_log_ms, self.penalty_cadence_ms
        if a is None or b is None:
            return a is None and b is None
        return abs(b - a) <= (abs_ms if abs(a) < small_ms else rel * abs(a))

    def cv_agrees(self, points: float = 0.03) -> bool:
        if self.cv_cadence is None or self.cv_log is None:
            return self.cv_cadence is None
        return self.cv_cadence <= self.cv_log + points


class _RawsReadOnce:
    """A store whose raw files are read (and checked) once each while they are kept (a sweep's all
    would not fit in memory: `forget_all_but` between records); everything else is the store's."""

    def __init__(self, store: ResultsStore) -> None:
        self._store = store
        self._raws: dict[Path, dict[str, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def forget_all_but(self, *keep: Path) -> None:
        self._raws = {path: raw for path, raw in self._raws.items() if path in keep}

    def load_raw(self, path: Path) -> dict[str, Any]:
        if path not in self._raws:
            self._raws[path] = self._store.load_raw(path)
        return self._raws[path]


def compare_sources(
    store: ResultsStore, records: list[RunRecord], settings: ProtocolSettings, *, logged: str = "reanalyse"
) -> list[SourceComparison]:
    """Re-analyse every record without its engine log, and with it (nothing is written).

    `logged="recorded"` takes the with-log side from the records as given instead of deriving it
    again: right for records a sweep or `reanalyse` wrote with the window maths as it stands (half
    the work; `records_are_the_log_analysis` checks a sample of them is)."""
    if logged not in ("reanalyse", "recorded"):
        raise ValueError(f"logged={logged!r}: must be 'reanalyse' or 'recorded'")
    out = []
    raws = _RawsReadOnce(store)  # both analyses of a record read its raw files once, Phase 1's once per D
    once = cast(ResultsStore, raws)
    baselines: dict[tuple[int, int], BaselineStats | None] = {}  # Phase 1's statistics, once per D
    for record in records:
        c = record.config
        if c.decode_batch_size == 0:
            continue  # no decodes, no penalty
        raws.forget_all_but(store.baseline_raw_path(c.chunk_size, c.decode_batch_size))
        with_log = (record if logged == "recorded"
                    else reanalyse_record(once, record, settings, baselines=baselines).record)
        without = reanalyse_record(once, record, settings, use_engine_log=False, baselines=baselines).record
        same = sum(
            a.interference.chunk_step_times_ms == b.interference.chunk_step_times_ms
            for a, b in zip(with_log.reps, without.reps)
        )
        out.append(SourceComparison(
            key=record.key,
            penalty_log_ms=with_log.derived.tpot_penalty_ms,
            penalty_cadence_ms=without.derived.tpot_penalty_ms,
            cv_log=with_log.summary.cv_tpot_penalty if with_log.summary else None,
            cv_cadence=without.summary.cv_tpot_penalty if without.summary else None,
            reps=len(with_log.reps),
            reps_same_steps=same,
        ))
    return out


def records_are_the_log_analysis(store: ResultsStore, records: list[RunRecord],
                                 settings: ProtocolSettings) -> list[str]:
    """The records (with D >= 1) whose numbers the window maths as it stands, with the engine's log,
    would not give again: their keys and what moved (empty: they are its analysis)."""
    moved = []
    baselines: dict[tuple[int, int], BaselineStats | None] = {}
    for record in records:
        if record.config.decode_batch_size == 0:
            continue
        now = reanalyse_record(store, record, settings, baselines=baselines).record
        what = [name for name, a, b in (
            ("derived", record.derived, now.derived),
            ("summary", record.summary, now.summary),
            ("chunk steps", [r.interference.chunk_step_times_ms for r in record.reps],
             [r.interference.chunk_step_times_ms for r in now.reps]),
        ) if a != b]
        if what:
            moved.append(f"{record.key}: {', '.join(what)}")
    return moved


@dataclass
class DirectoryJob:
    """`pdexporter reanalyse RESULTS_DIR`: every record of a results directory rebuilt from its raw
    timestamps (`reanalyse_directory`); a record whose numbers did not move is not rewritten."""

    paths: list  # (the store a record belongs to, its path)
    dry_run: bool
    settings: ProtocolSettings = ProtocolSettings()  # the window settings the records were made with

    def run(self, tick: Callable[[], None]) -> list[str]:
        from pdexporter.measure.store import load_record_file

        settings = self.settings
        baselines: dict[tuple[int, int], BaselineStats | None] = {}  # Phase 1's statistics, once per D
        changed = reps = written = passive = kept = 0
        done: list[tuple[ResultsStore, RunRecord, Reanalysed]] = []
        # Every record is re-derived before any is written: a raw file that cannot re-derive its
        # repetition stops the command with the directory as it was (no half-rewritten directory).
        for store, path in self.paths:
            try:
                record = load_record_file(path)
                if record.config.mode == "passive":
                    passive += 1
                    result = reanalyse_passive_record(store, record, settings)
                else:
                    result = reanalyse_record(store, record, settings, baselines=baselines)
            except RecordError as exc:
                raise RecordError(f"{exc} (no record was rewritten)") from None
            done.append((store, record, result))
            reps += result.reps
            changed += result.changed
            kept += result.kept
            tick()
        for store, record, result in done:
            if not self.dry_run and _differs(record, result.record):
                store.save_record(result.record)
                written += 1
        verb = "would change" if self.dry_run else "changed"
        kinds = f" ({passive} of them run --passive events)" if passive else ""
        lines = [f"{len(self.paths)} records{kinds}, {reps} repetitions: {changed} {verb}"
                 + ("" if self.dry_run else f"; {written} record files rewritten (the others are left as they were)")]
        if kept:
            lines.append(f"{kept} passive event(s) kept as measured: no raw file, D or P, or a slow-step threshold "
                         "these window settings give back")
        return lines


def reanalyse_directory(results: str | Path, *, dry_run: bool = False) -> DirectoryJob:
    """The records of `results`, and of its `joint/` and `merged/` where a passive run wrote them."""
    root = Path(results)
    subs = [root / sub for sub in (JOINT_DIR, MERGED_DIR) if (root / sub).is_dir()]
    stores = [ResultsStore(root)] + [ResultsStore(sub) for sub in subs]
    paths = [(store, path) for store in stores for path in store.iter_record_paths()]
    if not paths:
        raise ConfigError(f"{results}: no records (expected {{chunk}}/D{{d}}_P{{p}}.json)")
    return DirectoryJob(paths, dry_run, sweep_settings(root))


def _protocol_settings(fields: Any, where: str) -> ProtocolSettings:
    """`ProtocolSettings(**fields)`, a validation failure one line that starts with `where` (the file and its
    block) and names the field."""
    from pydantic import ValidationError

    from pdexporter._internal.validation import format_validation_error

    try:
        return ProtocolSettings(**fields)
    except ValidationError as exc:
        sep = "." if exc.errors()[0]["loc"] else ": "  # a field's error, or one of the whole block
        raise ConfigError(f"{where}{sep}{format_validation_error(exc, ProtocolSettings)}") from None


def sweep_settings(root: Path) -> ProtocolSettings:
    """The window settings of the sweep that wrote `root` (its `sweep.json`'s `spec.protocol`), or of the
    `measure` / `run` that wrote it (`window.json`); the seed's defaults where neither says (a directory
    written before window.json existed). A file that does not read is one line naming it."""
    import json

    from pdexporter.sweep.spec import SWEEP_STATE

    path = root / SWEEP_STATE
    if not path.is_file():
        window = ResultsStore(root).load_window()  # `measure` and `run` keep theirs in window.json
        if window is None:
            return ProtocolSettings()
        known = {k: v for k, v in window.items() if k in ProtocolSettings.WINDOW_FIELDS}
        return _protocol_settings(known, f"{root / WINDOW_FILE}: window")
    try:
        return _protocol_settings(json.loads(path.read_text())["spec"].get("protocol", {}), f"{path}: spec.protocol")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a sweep's state file ({type(exc).__name__}: {exc})") from None


def _differs(old: RunRecord, new: RunRecord) -> bool:
    """Whether re-analysis changed anything but the provenance (when and where it was written) and
    the schema version it would be written with: a
    record whose numbers are what they were is not rewritten, so a re-derivation of committed
    results changes only what moved."""
    keep = {"provenance", "schema_version"}  # an older record is read as it is; its numbers decide
    return old.model_dump(exclude=keep) != new.model_dump(exclude=keep)
