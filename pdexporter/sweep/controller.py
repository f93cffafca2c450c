"""The sweep loop: the seed's Phase 3 over a grid, resumable, in faithful or fast mode.

    for chunk in grid.chunk_sizes (only those with work left), on the next free engine slot:
        engine start at that chunk size (or adopt one left running, or attach to an external
        one: no start-up to budget for); warm-up: shared prefix + one prefill per P
        blocked order (the seed's):
            for D: Phase 1 once (or the baseline recorded earlier for this chunk and D)
                for P: Phase 2 x reps (attempts re-run while the CV is above the threshold)
        interleaved order:
            for block k (repetition k of every configuration still to run; CV re-run attempts
                         are further blocks): D values and, within each D, P values in a seeded
                         random order (`plan.block_order`); Phase 1 once per (chunk, D)
        faithful: fresh D probes per repetition, then the cooldown (seed: 5 s)
        fast: the D probes of a `PooledProbes` per D (and per block), no idle wait
        engine stop

Engine slots: one provider per GPU (`launcher.gpus`) or embedded engine (`launcher.engines`);
each slot runs one chunk size at a time with its own engine, probes and records, and the chunk
sizes are handed out in file order (a slot first takes a chunk size whose engine it left running,
so a resumed sweep adopts every engine it can). With one slot this is the loop above, in order.

Every repetition is written (raw, then record) before the next starts, so a killed sweep loses
at most the run in flight and a rerun skips what is complete (`plan.config_status`). With a
deadline the loop stops *between* runs when the next one would not finish in time, and leaves an
engine it started running for the next invocation to adopt.

Phase timings are kept on two clocks: the event loop's (engine seconds; virtual time when the
embedded engine runs on a virtual clock) and the machine's (`time.monotonic`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pdexporter._internal.atomic import atomic_write_json
from pdexporter._internal.procs import process_start_ticks, same_process
from pdexporter.errors import (
    ConfigError,
    EngineError,
    MeasurementError,
    PdexporterError,
)
from pdexporter.launch.base import Adopting, Attaching, DeadlineReached, Preparing, Prestarting
from pdexporter.measure.driver import EngineDriver
from pdexporter.measure.point import PointSpec, check_resumable, measure_point, phase1, retrying, window_retryable
from pdexporter.measure.probesets import FixedBaseline, FreshProbes, PooledProbes
from pdexporter.measure.protocol import (
    BaselineRun,
    BusyAtInjection,
    InterferenceRun,
    ProtocolSettings,
    StreamTrace,
    injection_problem,
    run_window,
    settle_engine,
    warm_prefix,
    warm_shapes,
)
from pdexporter.measure.records import RecordConfig, RepRecord, RunRecord
from pdexporter.measure.store import ResultsStore
from pdexporter.measure.window import baseline_stats
from pdexporter.sweep.plan import ConfigStatus, RunTimes, block_order, config_status, median, summarise_attempts
from pdexporter.sweep.providers import EngineProvider, slot_label
from pdexporter.sweep.spec import SWEEP_STATE, SweepSpec

__all__ = [
    "ChunkReport", "Deadline", "Key", "PHASES", "SweepController", "SweepObserver", "SweepReport",
    "window_retryable",
]

PHASES = ("engine_start", "warmup", "phase1", "phase2", "cooldown")
Key = tuple[int, int, int]


class SweepObserver:
    """Progress hooks; the CLI draws a progress bar and exports gauges with them."""

    def on_plan(self, total: int, done: int, reps_to_run: int) -> None: ...

    def on_chunk(self, slot: int, label: str, chunk: int, reps_to_run: int) -> None:
        """Engine slot `slot` (`label`: "GPU 1", or "" with one engine) takes this chunk size."""

    def on_phase(self, phase: str, chunk: int, d: int | None = None, p: int | None = None) -> None: ...

    def on_rep(self, key: Key, rep: RepRecord, info: Any) -> None: ...

    def on_config(self, key: Key, record: RunRecord | None, status: ConfigStatus) -> None: ...

    def on_message(self, text: str) -> None: ...


@dataclass
class Deadline:
    """Stop between runs when the next one would end past `at` (a `time.monotonic` value)."""

    at: float | None
    margin_s: float = 5.0
    clock: Callable[[], float] = time.monotonic

    def left(self) -> float | None:
        return None if self.at is None else self.at - self.clock()

    def allows(self, estimate_s: float) -> bool:
        left = self.left()
        return left is None or left >= estimate_s + self.margin_s


@dataclass
class ChunkReport:
    chunk_size: int
    configs: int = 0
    configs_complete: int = 0
    reps_recorded: int = 0
    reps_run: int = 0
    flagged: list[Key] = field(default_factory=list)
    rerun: list[Key] = field(default_factory=list)
    median_penalty_ms: float | None = None
    engine_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    wall_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    engine_adopted: bool = False
    probe_sets: int = 0
    retries: int = 0
    failed: list[Key] = field(default_factory=list)
    injections_checked: int = 0  # with the engine's request gauges read just before the prefill
    busy_at_injection: int = 0  # ... of which the engine ran something besides our D probes
    slot: str = ""  # the engine slot (GPU) that ran it; "" with one engine
    probe_sets_cancelled: int = 0  # fast mode: sets ended by cancelling their unused tokens
    blocks: list[dict[str, Any]] = field(default_factory=list)  # interleaved: each block's order as run


@dataclass
class SweepReport:
    chunks: dict[int, ChunkReport]
    status: str  # "complete" | "incomplete" (configs failed) | "deadline" | "interrupted" | "error"
    mode: str
    total_configs: int
    complete_configs: int
    wall_s: float
    engine_s: float
    message: str | None = None
    order: dict[str, Any] = field(default_factory=lambda: {"kind": "blocked"})

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "mode": self.mode,
            "message": self.message,
            "total_configs": self.total_configs,
            "complete_configs": self.complete_configs,
            "wall_s": round(self.wall_s, 3),
            "engine_s": round(self.engine_s, 3),
            "order": self.order,
            "chunks": {
                str(b): {
                    "configs": c.configs,
                    "configs_complete": c.configs_complete,
                    "reps_recorded": c.reps_recorded,
                    "reps_run": c.reps_run,
                    "flagged": [list(k) for k in c.flagged],
                    "rerun": [list(k) for k in c.rerun],
                    "median_penalty_ms": c.median_penalty_ms,
                    "engine_s": {k: round(v, 3) for k, v in c.engine_s.items()},
                    "wall_s": {k: round(v, 3) for k, v in c.wall_s.items()},
                    "engine_adopted": c.engine_adopted,
                    "probe_sets": c.probe_sets,
                    "retries": c.retries,
                    "failed": [list(k) for k in c.failed],
                    "injections_checked": c.injections_checked,
                    "busy_at_injection": c.busy_at_injection,
                    "slot": c.slot,
                    "probe_sets_cancelled": c.probe_sets_cancelled,
                    **({"blocks": c.blocks} if c.blocks else {}),
                }
                for b, c in self.chunks.items()
            },
        }


class SweepController:
    def __init__(
        self,
        spec: SweepSpec,
        store: ResultsStore,
        provider: EngineProvider | Sequence[EngineProvider],
        *,
        observer: SweepObserver | None = None,
        deadline: Deadline | None = None,
        keep_engine: bool = False,
        points: Sequence[Key] | None = None,
        write_state: bool = True,
    ) -> None:
        """`provider`: one, or one per engine slot (`sweep.providers.make_providers`: chunk sizes
        run side by side, one per slot); `points`: only these configurations (default: the
        grid's); `write_state`: keep `sweep.json` beside the results (a prediction in a
        temporary directory needs none)."""
        self.spec = spec
        self.points = list(points) if points is not None else list(spec.points())
        self._warmed_mixed: set[Key] = set()  # (B, D, P) warmed beside D decodes on the engine in use
        self.write_state = write_state
        self.store = store.cached()  # the sweep is its results directory's only writer while it runs
        self.providers: list[EngineProvider] = list(provider) if isinstance(provider, Sequence) else [provider]
        if not self.providers:
            raise ValueError("a sweep needs at least one engine provider")
        self.observer = observer or SweepObserver()
        self.deadline = deadline or Deadline(None)
        self.keep_engine = keep_engine
        self.times = RunTimes()
        self.reports: dict[int, ChunkReport] = {b: ChunkReport(b) for b in spec.grid.chunk_sizes}
        self._noted = False
        self._queue: list[int] = []
        self._stopped: list[str] = []  # why slots stopped at the deadline

    @property
    def provider(self) -> EngineProvider:
        """The first (with one engine slot, the only) provider."""
        return self.providers[0]

    # --- what is left -----------------------------------------------------------------------

    def status(self, key: Key) -> ConfigStatus:
        return self._status_of(self.store.load_record(*key))

    def _status_of(self, record: RunRecord | None) -> ConfigStatus:
        return config_status(record.reps if record else [], self.spec.reps, self.spec.cv)

    def _summarise(self, config: RecordConfig, reps: list[RepRecord]) -> RunRecord:
        return summarise_attempts(config, reps, self.spec.reps, self.spec.cv)

    # --- timing -------------------------------------------------------------------------------

    @contextmanager
    def _phase(self, phase: str, chunk: int) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        t_loop, t_wall = loop.time(), time.monotonic()
        try:
            yield
        finally:
            report = self.reports[chunk]
            report.engine_s[phase] += loop.time() - t_loop
            report.wall_s[phase] += time.monotonic() - t_wall

    def _check(self, kind: str, key: tuple[int, ...], what: str) -> None:
        if not self.deadline.allows(self.times.estimate(kind, key)):
            left = self.deadline.left()
            raise DeadlineReached(
                f"stopped before {what}: {left:.0f} s left, it may take {self.times.estimate(kind, key):.0f} s"
            )

    # --- the loop -----------------------------------------------------------------------------

    async def run(self) -> SweepReport:
        loop = asyncio.get_running_loop()
        t0_loop, t0_wall = loop.time(), time.monotonic()
        removed = self.store.clean_stale()
        if removed:
            self.observer.on_message(f"removed {len(removed)} temporary file(s) a killed run left in {self.store.root}")
        # the records already here are checked first (a sweep that does not match them is refused before
        # it writes anything: sweep.json's spec is what `reanalyse` re-derives them with)
        records = {key: self.store.load_record(*key) for key in self.points}  # read once for both
        statuses = {key: self._status_of(record) for key, record in records.items()}
        if self.write_state:
            self._check_protocol(records)
            self._write_state(None)  # this invocation, "running", until it ends (or a later one finds it killed)
        for (b, _, _), st in statuses.items():
            self.reports[b].configs += 1
            self.reports[b].configs_complete += st.complete
        done = sum(st.complete for st in statuses.values())
        if done:
            self.observer.on_message(f"resuming: {done} of {len(statuses)} configurations already recorded in "
                                     f"{self.store.root}")
        self.observer.on_plan(len(statuses), done, sum(st.reps_to_run for st in statuses.values()))
        todo = {chunk: [k for k in statuses if k[0] == chunk and not statuses[k].complete]
                for chunk in self.spec.grid.chunk_sizes}
        self._queue = [chunk for chunk in self.spec.grid.chunk_sizes if todo[chunk]]
        status, message = "complete", None
        try:
            if len(self.providers) == 1:
                await self._slot_worker(0, todo)
            else:
                await self._run_slots(todo)
            if self._stopped:
                status, message = "deadline", "; ".join(self._stopped)
        except (KeyboardInterrupt, asyncio.CancelledError):
            status, message = "interrupted", "interrupted"
            raise
        except PdexporterError as exc:
            status, message = "error", str(exc)
            raise
        finally:
            failed = [k for r in self.reports.values() for k in r.failed]
            if status == "complete" and failed:
                status, message = "incomplete", f"{len(failed)} configuration(s) failed: " + ", ".join(
                    f"B={b} D={d} P={p}" for b, d, p in failed[:5]) + (" ..." if len(failed) > 5 else "")
            report = self._report(status, message, loop.time() - t0_loop, time.monotonic() - t0_wall)
            if self.write_state:
                self._write_state(report)
        return report

    async def _run_slots(self, todo: dict[int, list[Key]]) -> None:
        """One worker per engine slot; the first error ends the others (their engines are left
        for a rerun to adopt) and is raised as itself."""
        try:
            async with asyncio.TaskGroup() as group:
                for slot in range(len(self.providers)):
                    group.create_task(self._slot_worker(slot, todo))
        except BaseExceptionGroup as errors:
            first = errors.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None

    async def _slot_worker(self, slot: int, todo: dict[int, list[Key]]) -> None:
        """Run chunk sizes on this slot's engine until none is left for it (or the deadline)."""
        while (chunk := self._take(slot)) is not None:
            try:
                await self._run_chunk(slot, chunk, todo[chunk])
            except DeadlineReached as exc:
                label = slot_label(self.providers[slot])
                self._stopped.append(f"{label}: {exc}" if label else str(exc))
                return

    def _adoptable(self, slot: int, chunk: int) -> bool:
        launcher = self.providers[slot].launcher
        return isinstance(launcher, Adopting) and launcher.can_adopt(chunk)

    def _starts_engine(self, slot: int, chunk: int) -> bool:
        """Does opening this slot's engine at `chunk` start one (start-up time to budget for)? Not
        when it adopts one left running, nor when it attaches to an engine it does not run."""
        launcher = self.providers[slot].launcher
        if isinstance(launcher, Attaching) and launcher.attaches(chunk):
            return False
        return not self._adoptable(slot, chunk)

    def _take(self, slot: int) -> int | None:
        """The next chunk size for this slot: one whose engine it left running (adopting takes no
        start-up), else the first in file order that no other slot's engine is waiting for."""
        if not self._queue:
            return None
        if len(self.providers) == 1:
            return self._queue.pop(0)
        others = [j for j in range(len(self.providers)) if j != slot]
        mine = [c for c in self._queue if self._adoptable(slot, c)]
        free = mine or [c for c in self._queue if not any(self._adoptable(j, c) for j in others)]
        if not free:
            return None  # every chunk size left has its engine waiting on another slot
        self._queue.remove(free[0])
        return free[0]

    async def _run_chunk(self, slot: int, chunk: int, todo: list[Key]) -> None:
        spec = self.spec
        report = self.reports[chunk]
        provider = self.providers[slot]
        launcher = provider.launcher
        report.slot = slot_label(provider)
        try:
            if self._starts_engine(slot, chunk):
                self._check("engine_start", (chunk,), f"starting the engine at chunk size {chunk}")
        except DeadlineReached as exc:
            # No time to wait for it, but time to set it going: the next invocation adopts it
            # instead of paying the start-up again (local launcher).
            left = self.deadline.left()
            if isinstance(launcher, Prestarting) and left is not None and left > self.deadline.margin_s:
                await launcher.prestart(chunk)
                raise DeadlineReached(f"{exc}; it was started in the background for the next run to adopt") from None
            raise
        self.observer.on_chunk(slot, report.slot, chunk, sum(self.status(k).reps_to_run for k in todo))
        self.observer.on_phase("engine_start", chunk)
        stop_engine = True
        t_wall = time.monotonic()
        try:
            with self._phase("engine_start", chunk):
                if isinstance(launcher, Preparing) and len(self.providers) == 1 and self._queue:
                    # the next chunk size's engine starts now, beside this one's start, and waits
                    # before the GPU: its CPU part never runs beside a measured window (launch.overlap)
                    await launcher.prepare(self._queue[0])
                driver = await provider.open(chunk)
            self.times.observe("engine_start", (chunk,), time.monotonic() - t_wall)
            report.engine_adopted = isinstance(launcher, Adopting) and launcher.adopted
            for p in sorted({p for _, _, p in todo}):  # before any warm-up: one line, not a request that hangs
                driver.info.check_fits(PointSpec(chunk, 0, p), spec.protocol, "grid.new_prefill_tokens")
            if driver.info.modelled and driver.info.note and not self._noted:
                self.observer.on_message(driver.info.note)
                self._noted = True
            await self._warm(driver, chunk, todo)
            if spec.order.kind == "interleaved":
                await self._run_interleaved(driver, chunk, todo)
            else:
                for d in spec.grid.decode_batch_sizes:
                    keys = [k for k in todo if k[1] == d]
                    if keys:
                        await self._run_d(driver, chunk, d, keys)
        except (DeadlineReached, KeyboardInterrupt, asyncio.CancelledError):
            stop_engine = False  # a rerun adopts it (local launcher); others stop anyway
            raise
        finally:
            await provider.close(stop_engine=stop_engine and not self.keep_engine)

    async def _warm(self, driver: EngineDriver, chunk: int, todo: list[Key]) -> None:
        spec = self.spec
        if not (spec.warmup.prefix or spec.warmup.shapes):
            return
        self._check("warmup", (chunk,), "the warm-up")
        self.observer.on_phase("warmup", chunk)
        t_wall = time.monotonic()
        with self._phase("warmup", chunk):
            if spec.warmup.prefix and any(d > 0 for _, d, _ in todo):
                await warm_prefix(driver, spec.protocol)
            if spec.warmup.shapes:
                await warm_shapes(driver, sorted({p for _, _, p in todo}), spec.protocol)
        self.times.observe("warmup", (chunk,), time.monotonic() - t_wall)

    async def _baseline(self, driver: EngineDriver, chunk: int, d: int) -> BaselineRun:
        """Phase 1 once per (chunk, D): reuse the one recorded by an earlier invocation."""
        spec = self.spec
        if d == 0:
            return BaselineRun(0, [], None)
        path = self.store.baseline_raw_path(chunk, d)
        if path.exists():
            raw = self.store.load_raw(path)
            traces = [StreamTrace.from_raw(p) for p in raw.get("probes", [])]
            stats = baseline_stats([t.token_times() for t in traces], spec.protocol.window)
            if stats is not None:
                return BaselineRun(d, traces, stats, retries=int(raw.get("retries", 0)))
        self._check("phase1", (chunk, d), f"Phase 1 at chunk {chunk}, D={d}")
        self.observer.on_phase("phase1", chunk, d)
        t_wall = time.monotonic()

        def again(k: int, exc: BaseException) -> None:
            # A reset, a stall or a 5xx in Phase 1 used to end the sweep (exit 3/4) where Phase 2
            # retried: the same bounded re-run with fresh probes now.
            self.reports[chunk].retries += 1
            self.observer.on_message(f"B={chunk} D={d} Phase 1: {exc}; retrying")

        with self._phase("phase1", chunk):
            baseline = await retrying(lambda k: phase1(driver, d, spec.protocol, k), spec.retries, again,
                                      lambda: settle_engine(driver, spec.protocol))
        self.times.observe("phase1", (chunk, d), time.monotonic() - t_wall)
        self.store.save_raw(path, baseline.to_raw())
        return baseline

    def _pool(self, driver: EngineDriver, chunk: int, d: int) -> PooledProbes | None:
        spec = self.spec
        if spec.mode != "fast":
            return None
        return PooledProbes(spec.protocol, chunk, d, spec.fast_probe_tokens(chunk), engine=driver.info.kind)

    async def _retire(self, pool: PooledProbes | None, chunk: int, *, raise_failures: bool = True) -> None:
        """Leftover probes must end before the next D's probes or Phase 1. (On a deadline or an
        error the driver's close cancels them instead.)"""
        if pool is not None:
            with self._phase("phase2", chunk):
                await pool.retire(raise_failures=raise_failures)

    def _count_sets(self, pool: PooledProbes | None, chunk: int) -> None:
        if pool is not None:
            self.reports[chunk].probe_sets += pool.sets_started
            self.reports[chunk].probe_sets_cancelled += pool.sets_cancelled

    async def _warm_mixed(self, driver: EngineDriver, chunk: int, d: int, ps: list[int], baseline: BaselineRun,
                          pool: PooledProbes | None) -> None:
        """`warmup.mixed`: one window of each (D, P) not warmed yet in this engine, not recorded."""
        if not self.spec.warmup.mixed or d == 0:
            return
        todo = [p for p in ps if (chunk, d, p) not in self._warmed_mixed]
        if not todo:
            return
        self.observer.on_phase("warmup", chunk, d)
        # What is warmed is the chunk's step beside D decodes, over by the prefill's first token: the
        # recovery intervals are not waited for (the next window waits for its own steady state), but
        # after the last one: a pooled probe's counted pre-injection intervals (the totals' reference,
        # `tpot_pre_injection_p50_ms`) are the window before's recovery intervals (`PooledProbes.traces`
        # cuts there), so the first recorded window of each D gets as many as every later one. Before
        # either, it read the warm-up's chunk steps there (GPU sessions 11-14, B = 2048: 2.4-9.9 x the step).
        short = self.spec.protocol.model_copy(update={"after_intervals": 1})
        with self._phase("warmup", chunk):
            for i, p in enumerate(todo):
                probes = pool if pool is not None else FreshProbes(self.spec.protocol)
                settings = self.spec.protocol if i == len(todo) - 1 else short
                await run_window(driver, d, p, settings, probes, FixedBaseline(baseline.stats), chunk_size=chunk)
                self._warmed_mixed.add((chunk, d, p))

    async def _run_d(self, driver: EngineDriver, chunk: int, d: int, keys: list[Key]) -> None:
        baseline = await self._baseline(driver, chunk, d)
        pool = self._pool(driver, chunk, d)
        try:
            if pool is not None:
                pool.plan([p for key in keys for p in [key[2]] * self.status(key).reps_to_run])
            await self._warm_mixed(driver, chunk, d, [key[2] for key in keys], baseline, pool)
            for key in keys:
                await self._run_config(driver, key, baseline, pool)
            await self._retire(pool, chunk)
        finally:
            self._count_sets(pool, chunk)

    async def _interfere(self, driver: EngineDriver, key: Key, rep: int, base: BaselineRun,
                         pool: PooledProbes | None) -> InterferenceRun:
        """One Phase 2 run, retried after a measurement error (fresh probes each time)."""
        spec = self.spec
        chunk, d, p = key
        report = self.reports[chunk]
        for attempt in range(spec.retries + 1):
            self._check("rep", key, f"repetition {rep} of B={chunk} D={d} P={p}")
            self.observer.on_phase("phase2", chunk, d, p)
            t_wall = time.monotonic()
            try:
                with self._phase("phase2", chunk):
                    probes = pool if pool is not None else FreshProbes(spec.protocol)
                    run = await run_window(driver, d, p, spec.protocol, probes, FixedBaseline(base.stats),
                                           chunk_size=chunk, exclusive=True)
            except (MeasurementError, EngineError) as exc:
                # No steady state, a probe that ended early, no recovery, a stall, an engine
                # error inside the window, an engine busy with more than the D probes at the
                # injection: nothing was recorded, and the window's streams were ended
                # (`ProbeSet.abandon`); the run is repeated with fresh probes (fast mode starts a
                # new set) once the engine runs nothing. An engine that is not there is not.
                if isinstance(exc, BusyAtInjection):
                    report.injections_checked += 1
                    report.busy_at_injection += 1
                if not window_retryable(exc) or attempt == spec.retries:
                    raise
                report.retries += 1
                self.observer.on_message(f"B={chunk} D={d} P={p} rep {rep}: {exc}; retrying")
                await self._retire(pool, chunk, raise_failures=False)
                with self._phase("phase2", chunk):
                    await settle_engine(driver, spec.protocol)
                continue
            self.times.observe("rep", key, time.monotonic() - t_wall)
            if attempt:
                run.extra["retries"] = attempt
            self._check_idle(run, key)
            return run
        raise AssertionError("unreachable")

    async def _measure_reps(self, driver: EngineDriver, key: Key, status: ConfigStatus, baseline: BaselineRun,
                            pool: PooledProbes | None, last: int, fields: dict[str, Any] | None = None) -> bool:
        """Repetitions `status.reps_recorded` .. `last - 1` of one configuration, each written as it
        ends (cooldown after each in faithful mode). False when they failed after their retries:
        the configuration is left incomplete (a rerun tries it again) and the sweep goes on, since
        one stubborn point must not end a GPU session."""
        spec = self.spec
        chunk, d, p = key
        report = self.reports[chunk]
        point = PointSpec(chunk, d, p)

        async def interfere(rep: int, base: BaselineRun) -> InterferenceRun:
            return await self._interfere(driver, key, rep, base, pool)

        def on_rep(rep: RepRecord) -> None:
            report.reps_run += 1
            self.observer.on_rep(key, rep, driver.info)

        try:
            # measure_point runs one repetition per call here, so the cooldown sits between them.
            for target in range(status.reps_recorded + 1, last + 1):
                await measure_point(
                    driver, point, spec.protocol, self.store, reps=target, mode=spec.mode, baseline=baseline,
                    on_rep=on_rep, interfere=interfere, summarise=self._summarise, rep_fields=fields,
                )
                if spec.cooldown_s > 0:
                    self.observer.on_phase("cooldown", chunk, d, p)
                    with self._phase("cooldown", chunk):
                        await asyncio.sleep(spec.cooldown_s)
        except (MeasurementError, EngineError) as exc:
            if not window_retryable(exc):
                raise
            report.failed.append(key)
            self.observer.on_message(f"B={chunk} D={d} P={p}: {exc}; skipped after {spec.retries} "
                                     "retries (rerun the sweep to try it again)")
            await self._retire(pool, chunk, raise_failures=False)
            return False
        return True

    def _announce_rerun(self, key: Key, status: ConfigStatus) -> bool:
        """Say so when a CV re-run attempt starts; True then."""
        if not (status.complete_attempts and status.reps_recorded == status.complete_attempts * self.spec.reps):
            return False
        chunk, d, p = key
        self.observer.on_message(
            f"B={chunk} D={d} P={p}: CV {status.cv_by_attempt[-1]:.1%} above {self.spec.cv.threshold:.0%}, "
            f"re-running (attempt {status.complete_attempts + 1})"
        )
        return True

    async def _run_config(
        self, driver: EngineDriver, key: Key, baseline: BaselineRun, pool: PooledProbes | None
    ) -> None:
        """Blocked order: every repetition (and re-run attempt) of one configuration."""
        while True:
            status = self.status(key)
            if status.complete:
                break
            if self._announce_rerun(key, status) and pool is not None:
                pool.plan_first([key[2]] * status.reps_to_run)
            assert status.target_reps is not None
            if not await self._measure_reps(driver, key, status, baseline, pool, status.target_reps):
                return
        self.observer.on_config(key, self.store.load_record(*key), status)

    async def _run_interleaved(self, driver: EngineDriver, chunk: int, todo: list[Key]) -> None:
        """Interleaved order: block k runs repetition k of every configuration that still needs
        one, in `plan.block_order`; CV re-run attempts are the blocks after the first `reps`."""
        spec = self.spec
        grid_points = [(d, p) for b, d, p in self.points if b == chunk]
        active = list(todo)
        baselines: dict[int, BaselineRun] = {}
        while True:
            statuses = {key: self.status(key) for key in active}
            pending = [key for key in active if not statuses[key].complete]
            if not pending:
                return
            block = min(statuses[key].reps_recorded for key in pending)
            members = {key for key in pending if statuses[key].reps_recorded == block}
            drawn = block_order(spec.order.seed, chunk, block, grid_points)
            position = {dp: i for i, dp in enumerate(drawn)}  # a repetition's block_position
            order = [(d, p) for d, p in drawn if (chunk, d, p) in members]
            # sweep.json: the block's whole drawn order, and what this invocation ran of it (the
            # rest of a block a killed run was in; the configurations a CV re-run attempt repeats)
            self.reports[chunk].blocks.append({"block": block, "order": [[d, p] for d, p in drawn],
                                               "ran": [[d, p] for d, p in order]})
            for d, group in itertools.groupby(order, key=lambda dp: dp[0]):
                ps = [p for _, p in group]
                if d not in baselines:
                    baselines[d] = await self._baseline(driver, chunk, d)
                pool = self._pool(driver, chunk, d)
                try:
                    if pool is not None:
                        pool.plan(ps)
                    await self._warm_mixed(driver, chunk, d, ps, baselines[d], pool)
                    for p in ps:
                        key = (chunk, d, p)
                        status = statuses[key]
                        self._announce_rerun(key, status)
                        fields = {"block": block, "block_position": position[(d, p)]}
                        if not await self._measure_reps(driver, key, status, baselines[d], pool,
                                                        status.reps_recorded + 1, fields):
                            active.remove(key)
                            continue
                        after = self.status(key)
                        if after.complete:
                            self.observer.on_config(key, self.store.load_record(*key), after)
                    await self._retire(pool, chunk)
                finally:
                    self._count_sets(pool, chunk)

    def _check_idle(self, run: InterferenceRun, key: Key) -> None:
        """The evidence that no cooldown is needed: at every injection the engine runs exactly our
        D probes and queues nothing (from its /metrics just before the prefill left). Where the
        engine's gauges are current a window that fails this was refused (`BusyAtInjection`); where
        they may be stale (SGLang) it is kept and said."""
        before = run.metrics_before
        if before is None:
            return
        running, waiting = before.get("num_requests_running"), before.get("num_requests_waiting")
        if running is None or waiting is None:
            return
        run.extra["engine_at_injection"] = {"running": running, "waiting": waiting}
        report = self.reports[key[0]]
        report.injections_checked += 1
        problem = injection_problem(before, key[1])
        if problem:
            report.busy_at_injection += 1
            self.observer.on_message(f"B={key[0]} D={key[1]} P={key[2]}: {problem}")

    # --- results ------------------------------------------------------------------------------

    def _report(self, status: str, message: str | None, engine_s: float, wall_s: float) -> SweepReport:
        complete = 0
        for chunk, report in self.reports.items():
            penalties: list[float | None] = []
            report.flagged, report.rerun, report.reps_recorded, report.configs_complete = [], [], 0, 0
            for key in (k for k in self.points if k[0] == chunk):
                record = self.store.load_record(*key)
                if record is None:
                    continue
                st = config_status(record.reps, self.spec.reps, self.spec.cv)
                report.reps_recorded += len(record.reps)
                report.configs_complete += st.complete
                complete += st.complete
                penalties.append(record.derived.tpot_penalty_ms)
                if st.flagged:
                    report.flagged.append(key)
                if st.complete_attempts > 1:
                    report.rerun.append(key)
            report.median_penalty_ms = median(penalties)
        total = sum(r.configs for r in self.reports.values())
        order = self.spec.order.model_dump()
        return SweepReport(self.reports, status, self.spec.mode, total, complete, wall_s, engine_s, message,
                           order=order)

    def _check_protocol(self, records: dict[Key, RunRecord | None]) -> None:
        """A sweep resumed into a directory whose records were made another way is refused in one
        line before it writes anything: a record of its grid with another mode or probe length
        (`check_resumable`, as each point checks again), or other window settings than the
        directory's `sweep.json` (`spec.protocol`): one directory, one protocol."""
        fields: dict[str, object] = {"mode": self.spec.mode, **self.spec.protocol.record_fields()}
        for key, record in records.items():
            check_resumable(record, fields, str(self.store.record_path(*key)))
        path = self.store.root / SWEEP_STATE
        if not path.is_file() or next(iter(self.store.iter_record_paths()), None) is None:
            return  # no sweep.json, or no record (of this grid or another) made with its settings
        try:
            before = json.loads(path.read_text(encoding="utf-8"))["spec"].get("protocol") or {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return  # not readable: the records' own checks stand (reanalyse says what it cannot read)
        # the settings the window maths reads (`ProtocolSettings.window`), not the timeouts of a run
        now = {k: getattr(self.spec.protocol, k) for k in ProtocolSettings.WINDOW_FIELDS}
        changed = [k for k in sorted(now) if k in before and before[k] != now[k]]
        if changed:
            k = changed[0]
            raise ConfigError(f"{path}: protocol.{k} was {before[k]} for the records already here, the sweep file "
                              f"says {now[k]}; resume with the same protocol, or give another output directory")

    def _write_state(self, report: SweepReport | None) -> None:
        """`sweep.json` beside the chunk directories: the spec and one entry per invocation. An
        invocation is written at its start (`status: "running"`, its pid and start time) and
        rewritten when it ends; an entry still "running" whose process is gone was killed
        (`kill -9`, a lost machine) and is marked so by the next invocation, with what it had
        recorded by then left to the records themselves."""
        path = self.store.root / SWEEP_STATE
        previous: list[Any] = []
        try:
            previous = json.loads(path.read_text(encoding="utf-8")).get("invocations", [])
        except (OSError, ValueError, AttributeError):
            previous = []
        if not isinstance(previous, list):
            previous = []
        me = {"pid": os.getpid(), "proc_start": process_start_ticks(os.getpid())}
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        kept: list[Any] = []
        mine: dict[str, Any] = {"status": "running", "started_at": now, **me}
        for entry in previous:
            if isinstance(entry, dict) and entry.get("status") == "running":
                if entry.get("pid") == me["pid"] and entry.get("proc_start") == me["proc_start"]:
                    mine = entry  # written at this invocation's start: rewritten below
                    continue
                if not same_process(int(entry.get("pid") or 0), entry.get("proc_start")):
                    entry = {**entry, "status": "killed",
                             "message": "the invocation ended without finishing (killed, or its machine was lost)"}
            kept.append(entry)
        kept.append(mine if report is None else {**mine, "finished_at": now, **report.to_json()})
        atomic_write_json(path, {"spec": self.spec.redacted_dump(), "invocations": self.spec.redact(kept)})
