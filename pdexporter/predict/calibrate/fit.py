"""One calibration, end to end: stage 1 and stage 2 in rounds, from one or two starts, then the held-out
configurations predicted with the base and the fitted profile (`calibrate`, `Calibration`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pdexporter.measure.records import RunRecord
from pdexporter.predict.calibrate.holdout import (
    HEADLINE,
    HoldoutReport,
    PointFigures,
    compare_records,
    figures_of,
    split_holdout,
    worse_than_base,
)
from pdexporter.predict.calibrate.loop import LoopFitResult, fit_loop_params, host_states
from pdexporter.predict.calibrate.observations import (
    FitResult,
    ObservationSet,
    PiecewiseFloor,
    StepData,
    StepObservation,
    fit_step_params,
    observations_from_records,
    piecewise_floor,
    step_summary,
)
from pdexporter.predict.calibrate.params import (
    BOUNDS,
    DEFAULT_FREE,
    GPU_PARAMS,
    Key,
    _check_free,
    _value,
    free_for,
    with_values,
)
from pdexporter.predict.calibrate.simulate import Simulator, _imitate_records
from pdexporter.sim.profile import Profile

__all__ = [
    "STAGE1_UNITS",
    "Calibration",
    "Progress",
    "calibrate",
]


# -- one calibration, end to end (pure apart from the simulator it is given) -----------------------

class Progress(Protocol):
    """Where calibration reports its work: units are simulated (B, D) groups (`Simulator.groups`),
    a stage-1 fit counts as `STAGE1_UNITS`."""

    def plan(self, units: float) -> None:
        """`units` more work expected (negative: a stage finished under its budget)."""
        ...

    def stage(self, name: str) -> None:
        """A stage begins."""
        ...

    def advance(self, units: float, info: str = "") -> None:
        """`units` of work done."""
        ...


STAGE1_UNITS = 1.0


class _NoProgress:
    def plan(self, units: float) -> None:
        pass

    def stage(self, name: str) -> None:
        pass

    def advance(self, units: float, info: str = "") -> None:
        pass


@dataclass
class Calibration:
    base: Profile
    profile: Profile  # the fitted one, `calibration: calibrated`
    fit: FitResult  # stage 1, on the training observations (last round)
    loop: LoopFitResult | None  # stage 2 (last round)
    before: tuple[float, float, float, dict[str, float]]  # base profile on the same step observations
    train_keys: set[Key]
    held_keys: set[Key]
    train: ObservationSet
    held: ObservationSet
    held_step_mape: float | None  # fitted step model on the held-out configurations' step observations
    held_step_mape_before: float | None
    rounds: int = 1
    held_base: HoldoutReport | None = None  # the held-out configurations predicted with the base profile
    held_fitted: HoldoutReport | None = None  # ... and with the fitted one (nominal host: the prediction)
    simulations: int = 0  # simulated sweeps of stage 2 (Jacobian columns included)
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per stage
    loop_start: Profile | None = None  # the profile the first stage 2 started from (`generalisation`)
    slow_keys: set[Key] = field(default_factory=set)  # training configurations measured on a slow host
    sensitive_keys: set[Key] = field(default_factory=set)  # training configurations the host's speed moves
    held_slow: set[Key] = field(default_factory=set)  # held-out configurations measured on a slow host
    held_fitted_host: HoldoutReport | None = None  # held-out, each predicted on the host it was measured on
    floor: PiecewiseFloor | None = None  # the launch floor the training's one-step piecewise prompts showed

    def worse(self, tolerance: float = 0.0) -> list[tuple[str, float, float]]:
        """Guarded metrics (`GUARDED`) the fit predicts worse than the base on the held-out configurations
        (by more than `tolerance` points of MAPE)."""
        if self.held_base is None or self.held_fitted is None:
            return []
        return worse_than_base(self.held_base, self.held_fitted, tolerance=tolerance)

    def nominal_mape(self, metric: str) -> float | None:
        """The fitted profile's held-out MAPE on the configurations measured on a nominal host."""
        if self.held_fitted is None:
            return None
        return self.held_fitted.metric_mape(metric, where=lambda k: k not in self.held_slow)


@dataclass(frozen=True)
class _Rounds:
    """Where the rounds of stage 1 and stage 2 from one start ended."""

    profile: Profile
    fit: FitResult | None
    loop: LoopFitResult | None
    loop_start: Profile | None
    simulations: int


@dataclass(frozen=True)
class _Setup:
    """What every start of one calibration's rounds shares."""

    observations: Sequence[StepObservation]  # the training configurations' step times (stage 1)
    measured: Mapping[Key, PointFigures]  # their figures (stage 2)
    simulate: Simulator | None
    step_free: tuple[str, ...]
    loop_free: tuple[str, ...]
    n_rounds: int
    max_evaluations: int
    prog: Progress
    timings: dict[str, float]
    train_groups: int
    on_evaluation: Callable[[int, int, float], None] | None
    hosts: bool  # the host's two speeds are fitted (`slow_factor` free)


def _rounds(current: Profile, c: _Setup, label: str = "") -> _Rounds:
    """`n_rounds` of stage 1 (the GPU's parameters) then stage 2 (the engine loop's, by simulation,
    each training configuration on the host `classify_host` labels it with) from `current`."""
    fit: FitResult | None = None
    loop: LoopFitResult | None = None
    loop_start: Profile | None = None
    simulations = 0
    for round_ in range(c.n_rounds):
        if c.step_free:
            t = time.perf_counter()
            c.prog.stage(f"{label}round {round_ + 1}/{c.n_rounds}: stage 1 (GPU)")
            fit = fit_step_params(current, c.observations, c.step_free)
            current = current.model_copy(update={"step_time": fit.params})
            c.prog.advance(STAGE1_UNITS, f"step MAPE {fit.mape:.1f} %")
            c.timings["stage1"] = c.timings.get("stage1", 0.0) + time.perf_counter() - t
        if c.simulate is not None and c.loop_free:
            t = time.perf_counter()
            c.prog.stage(f"{label}round {round_ + 1}/{c.n_rounds}: stage 2 (CPU, loop)")
            slow: set[Key] = set()
            if c.hosts:
                slow = host_states(current, c.measured, c.simulate)[0]
                simulations += 2
            if loop_start is None:
                loop_start = current
            loop = fit_loop_params(
                current, c.measured, c.simulate, c.loop_free, max_evaluations=c.max_evaluations, slow=slow,
                on_evaluation=functools.partial(c.on_evaluation, round_) if c.on_evaluation else None)
            simulations += loop.evaluations
            c.prog.plan(-(c.max_evaluations - loop.evaluations) * c.train_groups)
            current = with_values(current, loop.values)
            c.timings["stage2"] = c.timings.get("stage2", 0.0) + time.perf_counter() - t
    return _Rounds(current, fit, loop, loop_start, simulations)


def _fit_from_starts(base: Profile, c: _Setup) -> tuple[_Rounds, int, str]:
    """The rounds from the base and, when they label none of the configurations the host moves slow,
    from the base's CPU costs / slow_factor (`calibrate`'s docs): (the one kept, simulations, a note)."""
    first = with_values(base, {"slow_factor": _value(base, "slow_factor")}) if c.hosts else base
    fits = [_rounds(first, c)]
    simulations = fits[0].simulations
    if c.hosts and c.simulate is not None and first.host.slow_factor > 1.0:
        # which configurations the host moves, judged at the base's slow_factor where the fit let it fall
        # to ~1 (nothing would move then, and a fit stuck between the two levels would never start again)
        judge = fits[0].profile
        if judge.host.slow_factor < 1.01:
            judge = with_values(judge, {"slow_factor": first.host.slow_factor})
        slow_first, moved, _, _ = host_states(judge, c.measured, c.simulate)
        simulations += 2
        if moved and not slow_first:  # no slow episode among those the host moves: maybe between the two levels
            c.prog.plan((STAGE1_UNITS if c.step_free else 0.0) * c.n_rounds
                        + (c.max_evaluations + 2) * c.train_groups * c.n_rounds)
            fits.append(_rounds(first.on_slow_host(1.0 / first.host.slow_factor), c,
                                "from the base's CPU costs / slow_factor, "))
            simulations += fits[1].simulations
    chosen = min(fits, key=lambda f: f.loop.rms_log if f.loop is not None else 0.0)
    note = ("" if len(fits) == 1 else
            " No training configuration was labelled slow from the base; started again from its CPU costs / "
            "slow_factor (rms log error " + " and ".join(f"{f.loop.rms_log:.3f}" for f in fits if f.loop)
            + f"): kept the {'second' if chosen is fits[1] else 'first'}.")
    return chosen, simulations, note


def _predict_held(base: Profile, fitted: Profile, measured: Mapping[Key, PointFigures], simulate: Simulator,
                  hosts: bool) -> tuple[HoldoutReport, HoldoutReport, HoldoutReport | None, set[Key]]:
    """The held-out configurations predicted with the base and the fitted profile, and (with the host's
    two speeds) each on the host it was measured on: (base, fitted, host-matched, those measured slow)."""
    pred_base, pred_fitted = simulate([base, fitted], list(measured))
    held_host = None
    held_slow: set[Key] = set()
    if hosts:
        held_slow, _, nominal, on_slow = host_states(fitted, measured, simulate)
        held_host = compare_records(measured, {k: on_slow[k] if k in held_slow else nominal[k] for k in nominal})
    return compare_records(measured, pred_base), compare_records(measured, pred_fitted), held_host, held_slow


def _frees_and_start(base: Profile, free: Sequence[str], observations: Sequence[StepObservation], simulated: bool
                     ) -> tuple[tuple[str, ...], tuple[str, ...], Profile, PiecewiseFloor | None]:
    """Stage 1's and stage 2's free parameters, the profile the fit starts from and the launch floor the training's
    one-step piecewise prompts show. `piecewise_gpu_ms` is freed only where a training step ran a piecewise graph
    and no floor shows; with a floor, stage 2 fits `launch_piecewise_ms` from there (hidden under the GPU time a
    launch moves no simulated step, so it would stay where the base put it)."""
    free = free_for(base, _check_free(free, frozenset(BOUNDS)))
    step_free = tuple(n for n in free if n in GPU_PARAMS)
    loop_free = tuple(n for n in free if n not in GPU_PARAMS)
    floor = piecewise_floor(base, observations)
    if floor is not None or not StepData(base, observations).piecewise:
        step_free = tuple(n for n in step_free if n != "piecewise_gpu_ms")
    start = base
    if floor is not None and simulated and "launch_piecewise_ms" in loop_free:
        start = with_values(base, {"launch_piecewise_ms": max(base.step_time.launch_piecewise_ms, floor.ms)})
    return step_free, loop_free, start, floor


def calibrate(
    base: Profile,
    records: Sequence[RunRecord],
    *,
    holdout: float = 0.0,
    train_keys: Collection[Key] | None = None,
    free: Sequence[str] = DEFAULT_FREE,
    source: str | None = None,
    simulate: Simulator | None = None,
    rounds: int = 2,
    max_evaluations: int = 24,
    progress: Progress | None = None,
    on_evaluation: Callable[[int, int, float], None] | None = None,
) -> Calibration:
    """Fit `base` to the records outside the held-out configurations, then predict those with the
    base and the fitted profile.

    The held-out configurations are the records outside `train_keys` when given (e.g. those of a
    short sweep, `sweeps/calibrate-short.yaml`), else a deterministic `holdout` fraction
    (`split_holdout`). `simulate` runs the protocol on the embedded engine for stage 2 and for the
    held-out predictions (None: stage 1 only, the engine-loop costs stay as `base` has them, nothing
    is predicted). `max_evaluations` bounds the simulated sweeps of each round's stage 2, its finite
    differences included (each round takes them afresh: carrying the previous round's Jacobian on
    saves 7 sweeps but stopped in a worse point on the H200 sweep, rms log error 0.216 vs 0.213).
    `on_evaluation(round, evaluation, rms)` reports stage 2's progress; `progress` gets the work
    planned and done.

    The host's two speeds (`HostParams`), when `slow_factor` is free: before each stage 2 every
    training configuration is predicted on the nominal and on the slow host and labelled by the one
    that explains it better (`classify_host`: its prefill duration, else its chunk steps); stage 2
    simulates the slow ones on the slow host, so the nominal CPU costs come from the nominal
    configurations and `slow_factor` from the slow ones (hard expectation-maximisation). Stage 1 (the
    GPU) reads no label: its robust loss treats a slow launch-bound chunk step as the outlier it is
    for the GPU's parameters. Such a fit keeps the level it starts at: from a base whose launch costs
    are a slow episode's it labels nothing slow and settles between the two levels (the 32B's
    projection, 53 ms against ~25 and ~50 measured). So when a fit labels none of the configurations
    the host moves slow it runs again from the base's CPU costs / `slow_factor`, and keeps the one
    whose stage 2 ends with the smaller rms log error on the training figures. `host.slow_fraction`
    is the share of slow ones among those the host's speed moves."""
    if not records:
        raise ValueError("no records to calibrate on")
    prog = progress or _NoProgress()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    keys = [r.key for r in records]
    if train_keys is not None:
        wanted = set(train_keys)
        train_set = {k for k in keys if k in wanted}
        held_set = set(keys) - train_set
        if not train_set:
            raise ValueError("none of the records is among the training configurations")
    else:
        train_set, held_set = split_holdout(keys, holdout)
    train = observations_from_records([r for r in records if r.key in train_set])
    held = observations_from_records([r for r in records if r.key in held_set])
    _imitate_records(simulate, records)
    if not train.observations:
        raise ValueError("the training records hold no usable step times (no decode baseline, no middle chunk steps)")
    step_free, loop_free, start, floor = _frees_and_start(base, free, train.observations, simulate is not None)
    hosts = simulate is not None and "slow_factor" in loop_free
    figures = figures_of(records)
    measured = {k: v for k, v in figures.items() if k in train_set}
    n_rounds = max(1, rounds if (simulate is not None and loop_free) else 1)
    train_groups = simulate.groups(train_set) if simulate is not None else 0
    held_groups = simulate.groups(held_set) if simulate is not None and held_set else 0
    if step_free:
        prog.plan(STAGE1_UNITS * n_rounds)
    if simulate is not None and loop_free:
        prog.plan((max_evaluations + (2 if hosts else 0)) * train_groups * n_rounds)
    if simulate is not None and held_set:
        prog.plan((4 if hosts else 2) * held_groups)
    timings["split"] = time.perf_counter() - t0

    setup = _Setup(train.observations, measured, simulate, step_free, loop_free, n_rounds, max_evaluations, prog,
                   timings, train_groups, on_evaluation, hosts)
    chosen, simulations, start_note = _fit_from_starts(start, setup)
    current, fit, loop, loop_start = chosen.profile, chosen.fit, chosen.loop, chosen.loop_start
    slow: set[Key] = set()
    sensitive: set[Key] = set()
    if hosts:
        assert simulate is not None
        slow, sensitive, _, _ = host_states(current, measured, simulate)
        fraction = len(slow) / len(sensitive) if sensitive else 0.0
        current = current.model_copy(update={"host": current.host.model_copy(update={"slow_fraction": fraction})})
    if fit is None:
        mape, rms, worst, kinds = step_summary(current, current.step_time, train.observations)
        fit = FitResult(current.step_time, (), len(train.observations), mape, rms, worst, kinds, True, "not fitted")
    before = step_summary(base, base.step_time, train.observations)
    held_after = held_before = None
    if held.observations:
        held_after = step_summary(current, current.step_time, held.observations)[0]
        held_before = step_summary(base, base.step_time, held.observations)[0]
    held_base = held_fitted = held_host = None
    held_slow: set[Key] = set()
    if simulate is not None and held_set:
        t = time.perf_counter()
        prog.stage("held-out: base and fitted")
        held_base, held_fitted, held_host, held_slow = _predict_held(
            base, current, {k: v for k, v in figures.items() if k in held_set}, simulate, hosts)
        timings["held_out"] = time.perf_counter() - t
    note = (
        f"Fitted by pdexporter sim calibrate to {len(train_set)} configuration(s) "
        f"({fit.n} step times: {', '.join(f'{k} MAPE {v:.1f} %' for k, v in fit.by_kind.items())}"
        + (f"; engine loop by simulation, rms log error {loop.rms_log:.3f}" if loop is not None else "")
        + f"); {len(held_set)} configuration(s) held out. Free parameters: {', '.join((*step_free, *loop_free))}."
    )
    if floor is not None:
        note += f" The training's {floor.describe()}."
    if hosts:
        note += (f" Host: {len(slow)} of the {len(sensitive)} training configurations the host's speed moves were "
                 f"measured in a slow-host episode (CPU x {current.host.slow_factor:.2f}).{start_note}")
    if held_fitted is not None and held_base is not None:
        note += " Held-out MAPE fitted (base): " + ", ".join(
            f"{m} {_fmt(held_fitted.metric_mape(m))} ({_fmt(held_base.metric_mape(m))})" for m in HEADLINE) + "."
    profile = current.with_step_time(current.step_time, calibration="calibrated", note=note, source=source)
    timings["total"] = time.perf_counter() - t0
    return Calibration(base, profile, fit, loop, before, train_set, held_set, train, held, held_after, held_before,
                       n_rounds, held_base, held_fitted, simulations, timings, loop_start, slow, sensitive, held_slow,
                       held_host, floor)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} %"
