"""Generalisation: leave one chunk size, or one D, out, refit and predict it (`generalisation`); and the
decode steps between the grid's D (`decode_table`)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pdexporter.measure.records import RunRecord
from pdexporter.predict.calibrate.fit import STAGE1_UNITS, Calibration, Progress, _NoProgress
from pdexporter.predict.calibrate.holdout import HEADLINE, compare_records, figures_of
from pdexporter.predict.calibrate.loop import (
    _fd_steps,
    fit_loop_params,
    predict_on_hosts,
    record_residuals,
    residual_keys,
)
from pdexporter.predict.calibrate.observations import fit_step_params, observations_from_records
from pdexporter.predict.calibrate.params import DEFAULT_FREE, GPU_PARAMS, Key, _start, _value, free_for, with_values
from pdexporter.predict.calibrate.simulate import Simulator
from pdexporter.sim.profile import Profile
from pdexporter.sim.steptime import StepComposition, StepTimeModel

__all__ = [
    "BETWEEN_GRID_D",
    "KNOWN_DECODE_MS",
    "Generalisation",
    "GroupResult",
    "decode_table",
    "generalisation",
]


# -- generalisation: leave one chunk size, or one D, out ----------------------------------------

@dataclass(frozen=True)
class GroupResult:
    """One left-out group: its MAPE per headline metric with the refitted and with the base profile."""

    by: str  # "B" or "D"
    value: int
    n_configs: int
    fitted: dict[str, float | None]
    base: dict[str, float | None]
    params: dict[str, float]  # the refitted parameters


@dataclass
class Generalisation:
    groups: list[GroupResult]
    simulations: int
    seconds: float

    def table(self) -> list[dict[str, object]]:
        return [{"left_out": f"{g.by}={g.value}", "n": g.n_configs, "fitted": g.fitted, "base": g.base,
                 "params": g.params} for g in self.groups]


def generalisation(
    cal: Calibration,
    records: Sequence[RunRecord],
    simulate: Simulator,
    *,
    free: Sequence[str] = DEFAULT_FREE,
    max_evaluations: int = 10,
    progress: Progress | None = None,
) -> Generalisation:
    """Leave-one-chunk-size-out and leave-one-D-out: for each group, refit on every other
    configuration and predict the group.

    Per group, the calibration's first round again without the group: stage 1 from the base
    profile on the other configurations' step times; stage 2 from the base profile's loop costs by
    simulating the other configurations (at most `max_evaluations` sweeps), its Jacobian not taken
    afresh by finite differences but the one the calibration took at the start of its first stage 2
    (`Calibration.loop_start`, over every configuration, the group's rows dropped; the group's data
    enter only through that linearisation point's GPU parameters), carried by Broyden's rule; stage
    1 again with the refitted CPU costs; then the group simulated with the refitted profile: its
    MAPE per headline metric, and the base profile's on the same group."""
    t0 = time.perf_counter()
    prog = progress or _NoProgress()
    base = cal.base
    figures = figures_of(records)
    all_keys = sorted(figures)
    free = free_for(base, free)
    step_free = tuple(n for n in free if n in GPU_PARAMS)
    loop_free = tuple(n for n in free if n not in GPU_PARAMS)
    groups = [("B", b) for b in sorted({k[0] for k in all_keys})] + [("D", d) for d in sorted({k[1] for k in all_keys})]

    def member(by: str, value: int) -> Callable[[Key], bool]:
        return lambda key: (key[0] if by == "B" else key[1]) == value

    units = simulate.groups(all_keys)
    train_units = {g: simulate.groups([k for k in all_keys if not member(*g)(k)]) for g in groups}
    held_units = {g: simulate.groups([k for k in all_keys if member(*g)(k)]) for g in groups}
    budget = max_evaluations if loop_free else 0
    prog.plan((2 + (len(loop_free) if loop_free else 0)) * units + STAGE1_UNITS * 2 * len(groups)
              + sum(budget * train_units[g] + held_units[g] for g in groups))
    prog.stage("leave-one-out: Jacobian")
    sims_before = simulate.simulated
    start = cal.loop_start or base
    slow = cal.slow_keys | cal.held_slow  # each configuration on the host it was measured on
    pred_base = simulate([base], all_keys)[0]
    pred_start = predict_on_hosts(simulate, [start], all_keys, slow)[0]
    J0 = np.zeros((len(residual_keys(figures)), 0))
    if loop_free:
        x0, _, hi = _start(start, loop_free)
        steps = _fd_steps(x0, hi)
        shifted = [with_values(start, dict(zip(loop_free, map(float, x0 + np.eye(len(loop_free))[i] * steps[i]))))
                   for i in range(len(loop_free))]
        r0 = record_residuals(figures, pred_start)
        columns = [record_residuals(figures, pred) for pred in predict_on_hosts(simulate, shifted, all_keys, slow)]
        J0 = np.stack([(c - r0) / h for c, h in zip(columns, steps)], axis=1)
    row_out = {g: np.array([member(*g)(k) for k in residual_keys(figures)]) for g in groups}
    out: list[GroupResult] = []
    for g in groups:
        by, value = g
        left_out = member(by, value)
        prog.stage(f"leave-one-out: {by}={value}")
        obs = observations_from_records([r for r in records if not left_out(r.key)]).observations
        current = start.model_copy(update={"step_time": base.step_time, "engine_loop": base.engine_loop})
        if step_free and obs:
            current = current.model_copy(update={"step_time": fit_step_params(current, obs, step_free).params})
        prog.advance(STAGE1_UNITS, f"left out {by}={value}")
        if loop_free:
            train_measured = {k: v for k, v in figures.items() if not left_out(k)}
            loop = fit_loop_params(current, train_measured, simulate, loop_free, max_evaluations=budget,
                                   jacobian=J0[~row_out[g]], slow=slow)
            prog.plan(-(budget - loop.evaluations) * train_units[g])
            current = with_values(current, loop.values)
            if step_free and obs:
                current = current.model_copy(update={"step_time": fit_step_params(current, obs, step_free).params})
        prog.advance(STAGE1_UNITS, f"left out {by}={value}")
        held_measured = {k: v for k, v in figures.items() if left_out(k)}
        pred = simulate([current], held_measured)[0]
        rep_fit, rep_base = compare_records(held_measured, pred), compare_records(held_measured, pred_base)
        params = {n: _value(current, n) for n in (*step_free, *loop_free)}
        out.append(GroupResult(by, value, len(held_measured), {m: rep_fit.metric_mape(m) for m in HEADLINE},
                               {m: rep_base.metric_mape(m) for m in HEADLINE}, params))
    return Generalisation(out, simulate.simulated - sims_before, time.perf_counter() - t0)


# -- decode steps between the grid's D --------------------------------------------------------------

BETWEEN_GRID_D = (3, 5, 7, 9, 10, 11)
# measured on the H200 with vLLM 0.22 at 4K context, outside the seed grid: the baselines of the
# generalisation run (results/h200-vllm0.22-qwen3-coder-30b-a3b-generalise, B = 6144, GPU session 3)
KNOWN_DECODE_MS = {3: 6.35, 5: 8.01, 10: 10.37}


def decode_table(profiles: Mapping[str, Profile], records: Sequence[RunRecord], ds: Iterable[int] | None = None
                 ) -> list[dict[str, object]]:
    """Predicted decode steps for D on and between the grid's, against what is known.

    For each D: the captured size it runs as; each profile's steady-state decode step at the
    records' baseline context; the measured baseline of the grid's D (median of
    `baseline.tpot_p50_ms` over chunk sizes) when D is on the grid; otherwise the measured baseline
    of the grid D that pads to the same captured size (vLLM runs both as the same graph); a step
    time known from elsewhere (`KNOWN_DECODE_MS`)."""
    by_d: dict[int, list[float]] = defaultdict(list)
    context = 4096 + (16 + 256) // 2
    for r in records:
        if r.config.decode_batch_size > 0 and r.baseline.tpot_p50_ms:
            by_d[r.config.decode_batch_size].append(float(r.baseline.tpot_p50_ms))
        context = r.config.decode_context_tokens + (16 + r.config.decode_output_tokens) // 2
    measured = {d: float(np.median(v)) for d, v in by_d.items()}
    grid = sorted(measured)
    wanted = sorted(set(grid) | set(BETWEEN_GRID_D if ds is None else ds))
    sizes = StepTimeModel(next(iter(profiles.values())))

    def padded(d: int) -> int:
        return sizes.padded_tokens(StepComposition.decode_batch(d, context))

    out = []
    for d in wanted:
        same = [g for g in grid if g != d and padded(g) == padded(d)]
        ref = max(same) if same else None
        row: dict[str, object] = {"D": d, "padded": padded(d), "measured_ms": measured.get(d), "same_graph_D": ref,
                                  "same_graph_measured_ms": measured[ref] if ref is not None else None,
                                  "known_ms": KNOWN_DECODE_MS.get(d)}
        for name, prof in profiles.items():
            row[f"{name}_ms"] = StepTimeModel(prof).decode_step_s(d, context) * 1e3
        out.append(row)
    return out
