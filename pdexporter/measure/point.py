"""One grid point end to end: Phase 1 (or a given baseline), Phase 2 x reps, records on disk.

After every repetition its raw timestamps are written, then the record is rewritten with the
repetition added (both atomically), so a killed run loses at most the repetition in flight and a
rerun continues where it stopped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pdexporter._internal.bounds import (
    MAX_REPS,
    MAX_RETRIES,
    MAX_TOKENS,
    decode_batch_problem,
    out_of_bounds,
    prompt_fit_problem,
)
from pdexporter._internal.redact import engine_flags
from pdexporter.engines import adapter
from pdexporter.errors import ConfigError, EngineError, EngineHTTPError, EngineRefused, MeasurementError
from pdexporter.measure.driver import EngineDriver, EngineInfo
from pdexporter.measure.pd import offload_numbers
from pdexporter.measure.probesets import FixedBaseline, FreshProbes
from pdexporter.measure.protocol import (
    BaselineRun,
    InterferenceRun,
    ProtocolSettings,
    chunks_expected,
    logged_injection_problem,
    prompt_tokens_check,
    run_baseline,
    run_window,
    settle_engine,
)
from pdexporter.measure.records import (
    RecordConfig,
    RepRecord,
    RunRecord,
    aggregate,
    baseline_block,
    derived_block,
    interference_block,
)
from pdexporter.measure.store import ResultsStore
from pdexporter.measure.window import BaselineStats, derive

__all__ = [
    "DEFAULT_RETRIES", "PointSpec", "append_rep", "check_reps", "check_resumable", "check_retries", "flag_mismatch",
    "measure_point", "now_iso", "phase1", "record_config", "rep_record", "resumable_reps", "retrying",
    "window_retryable",
]

_T = TypeVar("_T")

# How often Phase 1 or a repetition is run again after a transient failure (`window_retryable`),
# for `measure`, a sweep file and `measure_point` alike: an engine starved of CPU for a second (a
# loaded host, the embedded engine on a busy laptop) gives probes that never reach the seed's
# steady state, and one such window must not stop a point.
DEFAULT_RETRIES = 2


def window_retryable(exc: BaseException) -> bool:
    """Whether a failed run (a Phase 1 baseline, a repetition) is run again: measurement errors,
    and engine errors of one run (a 5xx, a stall, a connection lost, a broken stream). Not an
    engine that refuses connections (it is gone: the command stops, and its rerun resumes) nor one
    that rejects the request (4xx: every run would)."""
    if isinstance(exc, MeasurementError):
        return True
    if isinstance(exc, EngineRefused):
        return False
    if isinstance(exc, EngineHTTPError):
        return exc.status >= 500 or exc.status == 429
    return isinstance(exc, EngineError)


async def retrying(attempt: Callable[[int], Awaitable[_T]], retries: int,
                   on_retry: Callable[[int, BaseException], Awaitable[None] | None] = lambda k, exc: None,
                   settle: Callable[[], Awaitable[None]] | None = None) -> _T:
    """`attempt(k)` for k = 0, 1, ...: again after a `window_retryable` failure, at most `retries`
    times more; the last failure (or one not worth repeating) is raised. Nothing a failed run
    measured is kept: each attempt starts with fresh probes, once `settle()` says the engine is
    ready for it (`protocol.settle_engine`: the failed run's streams gone from the engine)."""
    for k in range(retries + 1):
        try:
            return await attempt(k)
        except (MeasurementError, EngineError) as exc:
            if not window_retryable(exc) or k == retries:
                raise
            waiting = on_retry(k, exc)
            if waiting is not None:
                await waiting
            if settle is not None:
                await settle()
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class PointSpec:
    chunk_size: int
    decode_batch_size: int
    new_prefill_tokens: int

    def validate(self) -> PointSpec:
        """Each number within its bound (`_internal.bounds`), one line naming the option."""
        if self.new_prefill_tokens < 1:
            raise ConfigError(f"-P/--new-prefill-tokens {self.new_prefill_tokens}: must be >= 1")
        d_problem = decode_batch_problem(self.decode_batch_size)
        if d_problem:
            raise ConfigError(f"-D/--decode-batch-size {self.decode_batch_size}: {d_problem}")
        if self.chunk_size < 1:
            raise ConfigError(f"--chunk-size {self.chunk_size}: must be >= 1")
        for name, value, low, high in (("-P/--new-prefill-tokens", self.new_prefill_tokens, 1, MAX_TOKENS),
                                       ("--chunk-size", self.chunk_size, 1, MAX_TOKENS)):
            problem = out_of_bounds(value, low, high)
            if problem:
                raise ConfigError(f"{name} {value}: {problem}")
        return self

    def check_budget(self, engine: str) -> PointSpec:
        """Refuse, in one line, a point whose D leaves the engine's prefill no budget at this B."""
        problem = adapter(engine).budget_problem(self.chunk_size, self.decode_batch_size)
        if problem:
            raise ConfigError(f"-D {self.decode_batch_size} with --chunk-size {self.chunk_size}: {problem} ({engine})")
        return self

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.chunk_size, self.decode_batch_size, self.new_prefill_tokens)

    def check_fits(self, settings: ProtocolSettings, max_model_len: int | None, field: str = "-P") -> None:
        """Refuse, in one line, a point whose requests exceed the engine's max_model_len."""
        problem = prompt_fit_problem(self.new_prefill_tokens, settings.prefill_max_tokens,
                                     settings.decode_context_tokens, settings.decode_output_tokens, max_model_len)
        if problem:
            raise ConfigError(f"{field} {self.new_prefill_tokens}: {problem}")


def check_retries(retries: int, name: str = "--retries") -> int:
    """Retries within `bounds.MAX_RETRIES` (one line naming the option)."""
    problem = out_of_bounds(retries, 0, MAX_RETRIES)
    if problem:
        raise ConfigError(f"{name} {retries}: {problem}")
    return retries


def check_reps(reps: int, name: str = "--reps") -> int:
    """Repetitions within `bounds.MAX_REPS` (one line naming the option)."""
    problem = out_of_bounds(reps, 1, MAX_REPS)
    if problem:
        raise ConfigError(f"{name} {reps}: {problem}")
    return reps


def record_config(spec: PointSpec, info: EngineInfo, settings: ProtocolSettings, *, reps: int, mode: str,
                  chunk_size_source: str = "given") -> RecordConfig:
    kv = adapter(info.kind).kv
    prefill = info.prefill_engine
    return RecordConfig(
        decode_batch_size=spec.decode_batch_size,
        new_prefill_tokens=spec.new_prefill_tokens,
        chunk_size=spec.chunk_size,
        model=info.model,
        gpu=info.gpu or "unknown",
        engine=info.kind,
        engine_version=info.version,
        engine_url=info.url,
        modelled=info.modelled,
        note=info.note,
        profile=info.profile,
        cuda_graphs=info.cuda_graphs,
        decode_context_tokens=settings.decode_context_tokens,
        decode_output_tokens=settings.decode_output_tokens,
        prefill_max_tokens=settings.prefill_max_tokens,
        mode=mode,
        reps_planned=reps,
        engine_command=list(info.command) if info.command else None,
        chunk_size_source=chunk_size_source,
        arm=kv.arm,
        kv_connector=kv.connector,
        prefill_engine=None if prefill is None else {
            "engine": prefill.kind, "url": prefill.url, "version": prefill.version, "gpu": prefill.gpu,
            "chunk_size": prefill.chunk_size, "command": list(prefill.command) if prefill.command else None,
        },
    )


def rep_record(
    rep: int,
    run: InterferenceRun,
    spec: PointSpec,
    *,
    raw: str | None,
    started_at: str | None = None,
    fields: Mapping[str, Any] | None = None,
) -> RepRecord:
    """One repetition's record blocks, from the window and the baseline it was compared with;
    `fields`: further RepRecord fields (an interleaved sweep's `block`, `block_position`)."""
    baseline = run.baseline
    deltas = run.engine_metric_deltas
    return RepRecord(
        rep=rep,
        baseline=baseline_block(baseline, run.baseline_rule),
        interference=interference_block(
            run.window,
            num_chunks_expected=chunks_expected(run.engine or "", run.schedule),
            engine_chunks=run.engine_chunks,
            prefill_prompt_tokens=run.prefill.prompt_tokens,
            offload=offload_numbers(run.offload, deltas),
            prompt_tokens_check=prompt_tokens_check(run.prefill.prompt_tokens, spec.new_prefill_tokens),
            injection_check=logged_injection_problem(run.engine_steps, spec.decode_batch_size),
        ),
        derived=derived_block(derive(baseline, run.window, spec.decode_batch_size)),
        raw=raw,
        retries=int(run.extra.get("retries", 0)),
        engine_metrics=deltas,
        started_at=started_at,
        **(fields or {}),
    )


_RESUME_KEYS = ("model", "engine", "decode_context_tokens", "decode_output_tokens", "prefill_max_tokens", "mode",
                "arm")


def check_resumable(existing: RunRecord | None, fields: dict[str, object], path: str) -> None:
    """Refuse to add repetitions to a record measured another way (one line naming the field)."""
    if existing is None:
        return
    for key, new in fields.items():
        old = getattr(existing.config, key, None)
        if old != new:
            raise ConfigError(
                f"{path}: recorded with {key}={old!r}, this run has {key}={new!r}; "
                "use another --out directory or remove the old record"
            )


# Flags that say where an engine listens, not how it runs: they may differ between resumed runs.
_PLACEMENT_FLAGS = frozenset({"host", "port", "ready-file"})


def flag_mismatch(recorded: list[str] | None, now: list[str] | None) -> str | None:
    """The first engine flag two command lines disagree on (`--name=old` vs `--name=new`), if any.
    Nothing is compared where either run did not start its engine (an external one)."""
    if not recorded or not now:
        return None
    old, new = engine_flags(recorded), engine_flags(now)
    for name in sorted((set(old) | set(new)) - _PLACEMENT_FLAGS):
        if old.get(name) != new.get(name):
            def show(flags: dict[str, str], name: str = name) -> str:
                return f"--{name}={flags[name]}" if name in flags else f"no --{name}"

            return f"engine flag {show(old)}, this run has {show(new)}"
    return None


def resumable_reps(existing: RunRecord | None, config: RecordConfig, path: str) -> list[RepRecord]:
    """Repetitions already on disk for this point, if they were measured the same way: the same
    protocol settings, engine and model, and the same engine flags (when both runs started it)."""
    check_resumable(existing, {key: getattr(config, key) for key in _RESUME_KEYS}, path)
    if existing is None:
        return []
    mismatch = flag_mismatch(existing.config.engine_command, config.engine_command)
    if mismatch:
        raise ConfigError(f"{path}: recorded with {mismatch}; use another --out directory or remove the old record")
    return list(existing.reps)


async def measure_point(
    driver: EngineDriver,
    spec: PointSpec,
    settings: ProtocolSettings,
    store: ResultsStore,
    *,
    reps: int = 1,
    mode: str = "faithful",
    baseline: BaselineRun | None = None,
    resume: bool = True,
    on_rep: Callable[[RepRecord], None] | None = None,
    interfere: Callable[[int, BaselineRun], Awaitable[InterferenceRun]] | None = None,
    summarise: Callable[[RecordConfig, list[RepRecord]], RunRecord] = aggregate,
    rep_fields: Mapping[str, Any] | None = None,
    retries: int = DEFAULT_RETRIES,
    on_retry: Callable[[str, BaseException], None] = lambda what, exc: None,
    chunk_size_source: str = "given",
) -> RunRecord:
    """Measure repetitions `len(recorded) .. reps - 1` of one point.

    `interfere(rep, baseline)` replaces the default Phase 2 run (fresh probe streams); the sweep
    uses it for its fast mode (long-lived probes) and to stop between repetitions at a deadline
    (it may raise before sending anything: what was recorded stays), and retries it itself.
    Otherwise Phase 1 and each repetition are run again after a transient failure (`retrying`),
    at most `retries` times, `on_retry(what, error)` told each time, each re-run once the failed
    run's streams are ended and the engine runs nothing (`protocol.settle_engine`); a repetition
    says in its record how often it and its Phase 1 were run again (`retries`,
    `baseline_retries`). `summarise` turns the repetitions into the record (default:
    medians over all of them).
    """
    spec.validate().check_budget(driver.info.kind)
    config = record_config(spec, driver.info, settings, reps=reps, mode=mode, chunk_size_source=chunk_size_source)
    path = store.record_path(spec.chunk_size, spec.decode_batch_size, spec.new_prefill_tokens)
    done = resumable_reps(store.load_record(*_key(spec)) if resume else None, config, str(path))
    if len(done) >= reps:
        return summarise(config, done[:reps])

    def settle() -> Awaitable[None]:
        return settle_engine(driver, settings)

    if baseline is None:
        baseline = await retrying(lambda k: phase1(driver, spec.decode_batch_size, settings, k), retries,
                                  lambda k, exc: on_retry("Phase 1", exc), settle)
        if baseline.probes:
            store.save_raw(store.baseline_raw_path(spec.chunk_size, spec.decode_batch_size), baseline.to_raw())
    fields = {"baseline_retries": baseline.retries, **(rep_fields or {})}
    record: RunRecord | None = None
    for rep in range(len(done), reps):
        started = now_iso()
        if interfere is not None:
            run = await interfere(rep, baseline)
        else:
            stats = baseline.stats

            async def window(k: int, stats: BaselineStats | None = stats) -> InterferenceRun:
                run = await run_window(
                    driver, spec.decode_batch_size, spec.new_prefill_tokens, settings, FreshProbes(settings),
                    FixedBaseline(stats), chunk_size=spec.chunk_size, exclusive=True,
                )
                if k:
                    run.extra["retries"] = k
                return run

            def told(k: int, exc: BaseException, what: str = f"repetition {rep}") -> None:
                on_retry(what, exc)

            run = await retrying(window, retries, told, settle)
        record = append_rep(store, spec, config, done, run, started, summarise, fields)
        if on_rep is not None:
            on_rep(done[-1])
    assert record is not None
    return record


async def phase1(driver: EngineDriver, d: int, settings: ProtocolSettings, k: int) -> BaselineRun:
    """Phase 1's attempt `k` (`retrying`): the run says how often it was run again."""
    run = await run_baseline(driver, d, settings)
    run.retries = k
    return run


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def append_rep(store: ResultsStore, spec: PointSpec, config: RecordConfig, done: list[RepRecord],
               run: InterferenceRun, started_at: str | None,
               summarise: Callable[[RecordConfig, list[RepRecord]], RunRecord] = aggregate,
               fields: Mapping[str, Any] | None = None) -> RunRecord:
    """Add one repetition to the point's record: its raw file first, then the record (both atomic),
    so a record never points at a missing file. `done` (the repetitions so far) grows by one."""
    raw_path = store.raw_path(*_key(spec), len(done))
    store.save_raw(raw_path, run.to_raw())
    done.append(rep_record(len(done), run, spec, raw=store.relative(spec.chunk_size, raw_path), started_at=started_at,
                           fields=fields))
    record = summarise(config, done)
    store.save_record(record)
    return record


def _key(spec: PointSpec) -> tuple[int, int, int]:
    return (spec.chunk_size, spec.decode_batch_size, spec.new_prefill_tokens)
