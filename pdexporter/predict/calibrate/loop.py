"""Stage 2: the CPU-side and per-request costs fitted by simulation (`fit_loop_params`), and the host's
two speeds (`classify_host`, `host_states`): which configurations were measured in a slow-host episode."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pdexporter.predict.calibrate.holdout import PointFigures
from pdexporter.predict.calibrate.params import (
    BOUNDS,
    LOOP_FREE,
    TAIL_AS_DECODE_MS,
    Key,
    _check_free,
    _start,
    with_values,
)
from pdexporter.predict.calibrate.simulate import Simulator
from pdexporter.sim.profile import Profile

__all__ = [
    "HOST_MOVED",
    "ROW_WEIGHTS",
    "LoopFitResult",
    "classify_host",
    "fit_loop_params",
    "host_figure",
    "host_sensitive",
    "host_states",
    "predict_on_hosts",
    "record_residuals",
    "residual_keys",
]


# -- stage 2: the engine loop, by simulation ---------------------------------------------------

# Why the aggregate interference is a stage-2 row. Between the injection and the first chunk's step a
# window holds the probes' normal decode steps while the request is on its way in (the front end,
# `request_overhead_ms`) and then one stall, the decode step held behind the first chunk's launch
# (`launch_eager_ms`). prefill_duration and the chunk steps see only their sum: a fit of those alone
# is free to trade one for the other, and the Llama-3.1-8B fit did (front end 9.6 -> 3.3 ms, launch
# 36.5 -> 29.7 ms; B = 8192, D = 4, P = 4096: the H200's probes saw ~11 ms of normal steps, then a
# 25.6 ms stall and the 78 ms chunk, the embedded engine 5.3 ms, then 30.0 and 74.9 ms). The window
# then holds one normal step fewer, its p50 ("TPOT over the window") moves from a normal step to
# between a normal step and the stall (4.9 ms measured, 17.7 predicted) and the fit was refused.
# The aggregate interference is, per probe, the sum over the window of (interval - the pre-injection
# step): the normal steps add ~0 however many there are, the stall and the chunks add their excess,
# so it pins the stall, and prefill_duration the front end.
# Its row weighs 0.3: the sum carries the window's count of burst and post-chunk intervals, which jumps with
# the retirement cost, and at full weight those jumps stopped the Broyden steps short of a known engine
# (tests/integration/sim/test_calibrate_cli.py: launch 46.9 ms for 35, retirement 3.6 us for 1.5).
ROW_WEIGHTS = {"aggregate_interference_ms": 0.3}


def _residual_pairs(measured: Mapping[Key, PointFigures], predicted: Mapping[Key, PointFigures] | None
                    ) -> Iterator[tuple[Key, str, float, float | None]]:
    for key in sorted(measured):
        m = measured[key]
        p = predicted[key] if predicted is not None else None
        names = ["prefill_duration_ms"]
        if key[1] > 0:
            names += ["during_p50_ms", "during_mean_ms", "last_chunk_ms", "aggregate_interference_ms"]
        for name in names:
            mv = getattr(m, name)
            if mv and mv > 0 and not (name == "last_chunk_ms" and mv < TAIL_AS_DECODE_MS):
                yield key, name, float(mv), (getattr(p, name) if p is not None else None)


def record_residuals(measured: Mapping[Key, PointFigures], predicted: Mapping[Key, PointFigures]) -> np.ndarray:
    """log(predicted / measured) of prefill_duration, and when D > 0 of the chunk steps' p50 and
    mean, of the last chunk step (so the retirement cost is fitted where it shows) and of the
    aggregate interference (so the front end's latency is told from the first chunk's launch, see
    `_residual_pairs`). The rows depend on the measured figures only (`residual_keys`)."""
    return np.array([ROW_WEIGHTS.get(name, 1.0) * math.log(max(pv or 0.0, 1e-6) / mv)
                     for _, name, mv, pv in _residual_pairs(measured, predicted)])


def residual_keys(measured: Mapping[Key, PointFigures]) -> list[Key]:
    """The configuration of each row of `record_residuals`."""
    return [key for key, _, _, _ in _residual_pairs(measured, None)]


@dataclass(frozen=True)
class LoopFitResult:
    values: dict[str, float]
    free: tuple[str, ...]
    n_configs: int
    n_residuals: int
    rms_log: float
    evaluations: int  # simulated sweeps (profiles predicted), finite differences included
    success: bool
    message: str
    jacobian: np.ndarray | None = None  # d residuals / d free at the last point (Broyden-updated)


def _fd_steps(x: np.ndarray, hi: np.ndarray, rel: float = 0.05) -> np.ndarray:
    """Finite-difference steps: 5 % of each parameter (at least 0.05 of its unit), backwards at a bound."""
    h = rel * np.maximum(np.abs(x), 1.0)
    return np.where(x + h > hi, -h, h)


def predict_on_hosts(simulate: Simulator, profiles: Sequence[Profile], keys: Collection[Key],
                     slow: Collection[Key] = ()) -> list[dict[Key, PointFigures]]:
    """Each profile's prediction of `keys`, those in `slow` on the slow host (`Profile.on_slow_host`),
    the others on the nominal one; all in one `simulate.batch`."""
    slow_keys = sorted(set(slow) & set(keys))
    nominal_keys = sorted(set(keys) - set(slow_keys))
    requests: list[tuple[Profile, Collection[Key]]] = []
    for prof in profiles:
        requests += [(prof, nominal_keys)] if nominal_keys else []
        requests += [(prof.on_slow_host(), slow_keys)] if slow_keys else []
    answers = iter(simulate.batch(requests))
    out = []
    for _ in profiles:
        merged: dict[Key, PointFigures] = {}
        for part in (nominal_keys, slow_keys):
            if part:
                merged.update(next(answers))
        out.append(merged)
    return out


def fit_loop_params(
    profile: Profile,
    measured: Mapping[Key, PointFigures],
    simulate: Simulator,
    free: Sequence[str] = LOOP_FREE,
    *,
    prior_weight: float = 0.02,
    max_evaluations: int = 24,
    jacobian: np.ndarray | None = None,
    on_evaluation: Callable[[int, float], None] | None = None,
    slow: Collection[Key] = (),
) -> LoopFitResult:
    """Fit the CPU-side and per-request costs so that the protocol, run on the embedded engine,
    reproduces the measured figures (`simulate([profile], keys)` runs it).

    The configurations in `slow` were measured in a slow-host episode (`classify_host`): they are
    simulated on the slow host (`Profile.on_slow_host`), so `slow_factor` is fitted on them and
    the nominal CPU costs on the others.

    Trust-region least squares (`scipy.optimize.least_squares`) with a Jacobian taken once by
    finite differences (5 % of each parameter, at least 0.05 of its unit: wide enough to see the
    trend through a simulation whose outputs move in steps as a request lands before or after a step
    boundary; the columns are one `simulate` call, so they run side by side) and then updated by
    Broyden's rank-one rule at every new point instead of simulated again. `jacobian` (a previous
    round's, same rows) skips the finite differences. The loss is soft-L1 with a 2 % scale, i.e.
    close to the absolute log error: the fit aims at what is reported (MAPE) and, where the measured
    engine switches between two speeds from one repetition to the next (docs/sim.md), at the common
    one rather than between the two. `max_evaluations` bounds the simulated sweeps, finite
    differences included; the fit stops earlier once a step changes the cost by < 0.1 %.
    """
    from scipy.optimize import least_squares

    free = _check_free(free, frozenset(BOUNDS))
    if not measured:
        raise ValueError("no records to fit the engine loop to")
    x0, lo, hi = _start(profile, free)
    keys = sorted(measured)
    n = len(free)
    scale = np.maximum(np.abs(x0), 1.0)
    prior_jac = np.diag(prior_weight / scale)
    cache: dict[bytes, np.ndarray] = {}
    calls = [0]
    last = [math.nan]
    state: dict[str, np.ndarray] = {}
    if jacobian is not None:
        state["J"] = jacobian

    def run(xs: list[np.ndarray]) -> list[np.ndarray]:
        todo = [x for x in xs if x.tobytes() not in cache]
        if todo:
            profiles = [with_values(profile, dict(zip(free, map(float, x)))) for x in todo]
            predicted = predict_on_hosts(simulate, profiles, keys, slow)
            for x, pred in zip(todo, predicted):
                res = record_residuals(measured, pred)
                cache[x.tobytes()] = res
                calls[0] += 1
                last[0] = float(np.sqrt(np.mean(res**2))) if res.size else math.nan
                if on_evaluation is not None:
                    on_evaluation(calls[0], last[0])
        return [cache[x.tobytes()] for x in xs]

    def fun(x: np.ndarray) -> np.ndarray:
        return np.concatenate([run([x])[0], prior_weight * (x - x0) / scale])

    def jac(x: np.ndarray) -> np.ndarray:
        f = run([x])[0]
        if "J" not in state:
            steps = _fd_steps(x, hi)
            shifted = [x + np.eye(n)[i] * steps[i] for i in range(n)]
            columns = run(shifted)
            state["J"] = np.stack([(c - f) / h for c, h in zip(columns, steps)], axis=1)
        elif "x" in state:
            dx = x - state["x"]
            if float(dx @ dx) > 0:
                J = state["J"]
                state["J"] = J + np.outer(f - state["f"] - J @ dx, dx) / float(dx @ dx)
        state["x"], state["f"] = x.copy(), f
        return np.vstack([state["J"], prior_jac])

    budget = max_evaluations - (0 if jacobian is not None else n)
    solution = least_squares(fun, x0, jac=jac, bounds=(lo, hi), x_scale="jac", loss="soft_l1", f_scale=0.02,
                             max_nfev=max(1, budget), ftol=1e-3, xtol=1e-3, gtol=1e-6)
    res = run([solution.x])[0]
    return LoopFitResult(dict(zip(free, map(float, solution.x))), free, len(keys), int(res.size),
                         float(np.sqrt(np.mean(res**2))) if res.size else math.nan, calls[0],
                         bool(solution.status > 0), str(solution.message), state.get("J"))


# -- the host's two speeds --------------------------------------------------------------------

# The figures a host's speed moves, in the order they are read: the prefill duration, which every CPU
# cost of the window adds to and no GPU-timing error of a chunk moves much (the chunk steps' p50 moves
# with the launch-bound-to-GPU-bound transition, which the engine places a few chunks late, docs/sim.md);
# and where the duration does not move, the chunk steps' mean interval: a prompt's one eager chunk whose
# launch hides behind the GPU's work (the 32B's 1024 tokens: ~100 ms of GPU, ~25 or ~50 ms of launch)
# finishes when the GPU does at either speed, but the decodes' step before it waits for the launch and
# the chunk step's own interval gives that time back (results/h200-vllm0.22-qwen2.5-32b-instruct/RUN.md).
HOST_MOVED = ("prefill_duration_ms", "during_mean_ms")


def host_figure(nominal: PointFigures, slow: PointFigures, threshold: float = 0.05) -> str | None:
    """The first figure of `HOST_MOVED` the host's speed moves by more than `threshold` (log ratio)
    in this configuration's two predictions; None where it moves neither."""
    for name in HOST_MOVED:
        a, b = getattr(nominal, name), getattr(slow, name)
        if a and b and a > 0 and b > 0 and abs(math.log(b / a)) > threshold:
            return name
    return None


def host_sensitive(nominal: Mapping[Key, PointFigures], slow: Mapping[Key, PointFigures], threshold: float = 0.05
                   ) -> set[Key]:
    """Configurations a slow-host episode can show in: the host's speed moves one of their figures
    (`host_figure`)."""
    return {key for key in set(nominal) & set(slow) if host_figure(nominal[key], slow[key], threshold)}


def classify_host(measured: Mapping[Key, PointFigures], nominal: Mapping[Key, PointFigures],
                  slow: Mapping[Key, PointFigures]) -> set[Key]:
    """The configurations whose figure the host moves (`host_figure`: the prefill duration, else the
    chunk steps' mean) the slow-host prediction explains better than the nominal one: measured in a
    slow-host episode. A configuration the host's speed does not move is never slow."""
    out = set()
    for key in sorted(set(measured) & set(nominal) & set(slow)):
        name = host_figure(nominal[key], slow[key])
        m = getattr(measured[key], name) if name else None
        if name and m and m > 0:
            a, b = getattr(nominal[key], name), getattr(slow[key], name)
            if abs(math.log(b / m)) < abs(math.log(a / m)):
                out.add(key)
    return out


def host_states(profile: Profile, measured: Mapping[Key, PointFigures], simulate: Simulator
                ) -> tuple[set[Key], set[Key], dict[Key, PointFigures], dict[Key, PointFigures]]:
    """(slow, sensitive, nominal prediction, slow prediction) of the measured configurations."""
    keys = sorted(measured)
    nominal, slow = simulate.batch([(profile, keys), (profile.on_slow_host(), keys)])
    return classify_host(measured, nominal, slow), host_sensitive(nominal, slow), nominal, slow
