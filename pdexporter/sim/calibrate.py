"""Fit a profile to measured records: the step-time model, then the engine-loop costs.

Two stages, each on the configurations outside the held-out ones (`split_holdout`).

Stage 1, the GPU (closed form, `fit_step_params`). Steps whose probe interval is the step's own
steady-state time under async scheduling: max(GPU time of the step, CPU time of the step launched
while it runs) (`pdexporter.sim.engine`):
- decode-only steps: `baseline.tpot_p50_ms` of each repetition is the period of D decodes (their
  context: the probe prefix plus the mid-point of the measured tokens);
- the middle chunk steps of a prefill: `interference.chunk_step_times_ms` are the chunk steps of
  the median probe stream, in order (measure/window.py defines them), the chunk sizes from the
  engine log (`chunk_tokens_engine_log`) or, without it, from the scheduling rule (B - D per chunk,
  the rest in the last). Chunk k sits at the sum of the earlier chunks (its attention context) and
  chunk k + 1 is launched while it runs. The first chunk and the last are left out: the first
  overlaps the launch stall before it, the last carries the request's retirement; stage 2 fits
  them through the whole timeline.
A repetition whose chunk-step count does not match its chunks contributes its decode step only.
`scipy.optimize.least_squares` on log(model / measured) with a soft-L1 loss (a repetition's
hiccup does not drag the fit), so a 5 ms decode step and a 400 ms chunk weigh alike, within
physical bounds, a weak prior holding what the data cannot see at the profile's value.

Stage 2, the CPU and the engine loop (`fit_loop_params`, by simulation). The launch costs, the
CPU per token and the per-request costs (admission, retirement, front-end latency) shape how the
steps add up to the window, which no single step shows. They are fitted by running the
measurement protocol on the embedded engine itself (`pdexporter.sim.predict`, virtual time, the
records' own mode) and matching, per configuration, the record's prefill_duration and the chunk
steps' p50 and mean (TPOT during the prefill) and the last chunk step (where the retirement
shows): least squares on log ratios, finite differences.

Stage 1 and 2 alternate (`rounds`): the CPU times decide which chunk steps are CPU-bound, the GPU
times what the loop costs must explain. The held-out configurations are then predicted the same
way and compared on prefill_duration and window TPOT (`compare_records`, `HoldoutReport`).

`vllm_facts_observations()` are the step times written down in docs/vllm-facts.md (H200, vLLM 0.22).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pdexporter.measure.records import RunRecord
from pdexporter.sim.profile import EngineLoopParams, Profile, StepTimeParams
from pdexporter.sim.steptime import StepComposition, StepTimeModel

Key = tuple[int, int, int]  # (chunk_size, decode_batch_size, new_prefill_tokens)

# matmul_efficiency is not free by default: the profile takes it from a measured large GEMM
# (gpu.measured_matmul_tflops), and big chunks see dense and expert GEMMs only together.
STEP_FREE = ("fixed_ms", "moe_efficiency", "attention_efficiency", "bandwidth_efficiency", "moe_expert_pool")
LOOP_FREE = ("launch_eager_ms", "launch_piecewise_ms", "cpu_us_per_token", "request_overhead_ms",
             "admit_us_per_block", "retire_us_per_token", "idle_start_ms")
DEFAULT_FREE = STEP_FREE + LOOP_FREE
LOOP_PARAMS = frozenset(EngineLoopParams.model_fields)
BOUNDS: dict[str, tuple[float, float]] = {
    "fixed_ms": (0.0, 50.0),
    "matmul_efficiency": (0.05, 1.0),
    "moe_efficiency": (0.05, 1.0),
    "attention_efficiency": (0.05, 1.0),
    "bandwidth_efficiency": (0.05, 0.95),  # nobody streams HBM at its datasheet peak
    "moe_expert_pool": (8.0, 128.0),
    "roofline_sharpness": (1.0, 32.0),
    "launch_eager_ms": (0.0, 200.0),
    "launch_piecewise_ms": (0.0, 100.0),
    "cpu_us_per_token": (0.0, 50.0),
    "request_overhead_ms": (0.0, 100.0),
    "admit_us_per_block": (0.0, 500.0),
    "retire_us_per_token": (0.0, 50.0),
    "idle_start_ms": (0.0, 100.0),
}
# Stage 1 fits the GPU's parameters on step times; stage 2 everything the CPU and the loop do.
GPU_PARAMS = frozenset({"fixed_ms", "matmul_efficiency", "moe_efficiency", "attention_efficiency",
                        "bandwidth_efficiency", "moe_expert_pool", "roofline_sharpness"})
STEP_PARAMS = GPU_PARAMS  # what fit_step_params may fit


@dataclass(frozen=True)
class StepObservation:
    composition: StepComposition
    seconds: float
    kind: str  # "decode" or "mixed"
    key: Key | None = None  # (chunk_size, D, P) of the record it came from
    label: str = ""
    weight: float = 1.0
    next_composition: StepComposition | None = None  # the step launched while this one runs

    def model_s(self, model: StepTimeModel) -> float:
        """The observed interval in a steady pipeline: max(this step's GPU, the next one's CPU)."""
        launched = self.next_composition if self.next_composition is not None else self.composition
        return max(model.gpu_s(self.composition), model.cpu_s(launched))


@dataclass
class ObservationSet:
    observations: list[StepObservation] = field(default_factory=list)
    reps_used: int = 0
    reps_mismatched: int = 0
    records: int = 0


def chunk_sizes(p: int, b: int, d: int) -> list[int]:
    """The scheduler's chunks of a cold P-token prefill beside D decodes: B - D each, the rest last."""
    per = b - d
    if per <= 0:
        raise ValueError(f"chunk size {b} leaves no budget beside {d} decodes")
    full, rest = divmod(p, per)
    return [per] * full + ([rest] if rest else [])


def mixed_composition(chunk: int, position: int, d: int, decode_context: int, *, last: bool = False
                      ) -> StepComposition:
    """One prefill chunk at `position` beside D decodes at `decode_context` tokens each."""
    return StepComposition.of([(chunk, position)] + [(1, decode_context)] * d, d + (1 if last else 0))


def observations_from_record(record: RunRecord, into: ObservationSet | None = None) -> ObservationSet:
    out = into if into is not None else ObservationSet()
    out.records += 1
    c = record.config
    b, d, p = c.chunk_size, c.decode_batch_size, c.new_prefill_tokens
    baseline_ctx = c.decode_context_tokens + (16 + c.decode_output_tokens) // 2
    inject_ctx = c.decode_context_tokens + 34
    key = (b, d, p)
    for rep in record.reps or []:
        if d > 0 and rep.baseline.tpot_p50_ms:
            out.observations.append(StepObservation(
                StepComposition.decode_batch(d, baseline_ctx), rep.baseline.tpot_p50_ms / 1e3, "decode", key,
                f"B={b} D={d} decode"))
        slow = list(rep.interference.chunk_step_times_ms or [])
        if d == 0 or not slow:
            continue
        chunks = list(rep.interference.chunk_tokens_engine_log or chunk_sizes(p, b, d))
        if len(slow) == len(chunks) - 1 and chunks[-1] <= 1:
            chunks = chunks[:-1]  # a 1-token tail runs as a plain decode batch: not seen as slow
        if len(slow) != len(chunks):
            out.reps_mismatched += 1
            continue
        out.reps_used += 1
        starts = np.concatenate([[0], np.cumsum(chunks)]).astype(int)
        comps = [mixed_composition(chunk, int(starts[k]), d, inject_ctx + k, last=starts[k] + chunk >= p)
                 for k, chunk in enumerate(chunks)]
        for k in range(1, len(chunks) - 1):
            out.observations.append(StepObservation(comps[k], slow[k] / 1e3, "mixed", key,
                                                    f"B={b} D={d} P={p} chunk {k}", next_composition=comps[k + 1]))
    return out


def observations_from_records(records: Iterable[RunRecord]) -> ObservationSet:
    out = ObservationSet()
    for record in records:
        observations_from_record(record, out)
    return out


def split_holdout(keys: Sequence[Key], fraction: float) -> tuple[set, set]:
    """(train, held-out) configurations; deterministic (hash of the key), about `fraction` held out."""
    if not 0 <= fraction < 1:
        raise ValueError(f"holdout fraction {fraction} must be in [0, 1)")
    ordered = sorted(set(keys), key=lambda k: hashlib.sha256(repr(k).encode()).hexdigest())
    n_out = int(round(len(ordered) * fraction))
    if fraction > 0 and n_out == 0 and len(ordered) > 1:
        n_out = 1
    held = set(ordered[:n_out])
    return set(ordered) - held, held


# -- parameters as a vector ------------------------------------------------------------------

def _check_free(free: Sequence[str], allowed: frozenset[str]) -> tuple[str, ...]:
    unknown = [name for name in free if name not in BOUNDS or name not in allowed]
    if unknown:
        raise ValueError(f"cannot fit {', '.join(unknown)}; fittable: {', '.join(sorted(allowed & set(BOUNDS)))}")
    return tuple(free)


def _value(profile: Profile, name: str) -> float:
    v = getattr(profile.engine_loop if name in LOOP_PARAMS else profile.step_time, name)
    if v is None:
        low, high = BOUNDS[name]
        v = profile.model.num_experts if name == "moe_expert_pool" else (low + high) / 2
    return float(v)


def with_values(profile: Profile, values: Mapping[str, float]) -> Profile:
    """The profile with these step_time / engine_loop parameters replaced."""
    step = {k: v for k, v in values.items() if k not in LOOP_PARAMS}
    loop = {k: v for k, v in values.items() if k in LOOP_PARAMS}
    return profile.model_copy(update={
        "step_time": StepTimeParams(**{**profile.step_time.model_dump(), **step}),
        "engine_loop": EngineLoopParams(**{**profile.engine_loop.model_dump(), **loop}),
    })


def _start(profile: Profile, free: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x0, lo, hi = [], [], []
    for name in free:
        low, high = BOUNDS[name]
        x0.append(min(max(_value(profile, name), low + 1e-6), high - 1e-6))
        lo.append(low)
        hi.append(high)
    return np.array(x0), np.array(lo), np.array(hi)


# -- stage 1: step times ---------------------------------------------------------------------

@dataclass(frozen=True)
class FitResult:
    params: StepTimeParams
    free: tuple[str, ...]
    n: int
    mape: float  # mean |model - measured| / measured over the observations, in %
    rms_log: float
    max_ape: float
    by_kind: dict[str, float]  # MAPE per observation kind
    success: bool
    message: str


def step_errors(profile: Profile, params: StepTimeParams, observations: Sequence[StepObservation]) -> np.ndarray:
    """Relative errors (model - measured) / measured."""
    model = StepTimeModel(profile, params)
    return np.array([(o.model_s(model) - o.seconds) / o.seconds for o in observations])


def step_summary(profile: Profile, params: StepTimeParams, observations: Sequence[StepObservation]
                 ) -> tuple[float, float, float, dict[str, float]]:
    """(MAPE %, rms of log ratio, worst APE %, MAPE % per kind)."""
    rel = step_errors(profile, params, observations)
    ape = np.abs(rel) * 100
    kinds = {}
    for kind in sorted({o.kind for o in observations}):
        sel = np.array([o.kind == kind for o in observations])
        kinds[kind] = float(ape[sel].mean())
    logs = np.log1p(rel)
    return float(ape.mean()), float(np.sqrt(np.mean(logs**2))), float(ape.max()), kinds


def fit_step_params(
    profile: Profile,
    observations: Sequence[StepObservation],
    free: Sequence[str] = STEP_FREE,
    *,
    start: StepTimeParams | None = None,
    prior_weight: float = 0.02,
    robust: bool = True,
) -> FitResult:
    """Least-squares fit of `free` step-time parameters in log space, from `start` (the profile's values).

    A weak prior (`prior_weight`, in log units per parameter) pulls each parameter towards its
    starting value, so parameters the data cannot see stay where the profile put them. `robust`
    uses a soft-L1 loss (scale 10 %): a repetition's hiccup weighs like an error of ~10 %.
    """
    from scipy.optimize import least_squares

    if not observations:
        raise ValueError("no step observations to fit")
    free = _check_free(free, STEP_PARAMS)
    base = profile if start is None else profile.model_copy(update={"step_time": start})
    x0, lo, hi = _start(base, free)
    values = base.step_time.model_dump()
    targets = np.array([o.seconds for o in observations])
    weights = np.sqrt(np.array([o.weight for o in observations]))

    def params_of(x: np.ndarray) -> StepTimeParams:
        return StepTimeParams(**{**values, **{name: float(v) for name, v in zip(free, x)}})

    def residuals(x: np.ndarray) -> np.ndarray:
        model = StepTimeModel(base, params_of(x))
        pred = np.array([o.model_s(model) for o in observations])
        res = np.log(np.maximum(pred, 1e-9) / targets) * weights
        prior = prior_weight * (x - x0) / np.maximum(np.abs(x0), 1e-3)
        return np.concatenate([res, prior])

    solution = least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac",
                             loss="soft_l1" if robust else "linear", f_scale=0.1)
    params = params_of(solution.x)
    mape, rms_log, max_ape, kinds = step_summary(base, params, observations)
    return FitResult(params, free, len(observations), mape, rms_log, max_ape, kinds, bool(solution.success),
                     str(solution.message))


def vllm_facts_observations() -> list[StepObservation]:
    """The H200 step times in docs/vllm-facts.md, as observations (vLLM 0.22, Qwen3-Coder-30B-A3B).

    - decode-only steps "4-10 ms for D = 1...12 at 4K context": D=1 -> 4 ms, D=12 -> 10 ms;
    - B=2048, D=4, P=32768: 17 mixed steps "from ~47 ms to ~120 ms": the second 2044-token chunk
      (the first steady one: CPU-bound, its launch ~47 ms) and the last full one (position 30660)
      120 ms;
    - B=8192, D=4, P=32768: "5 steps from ~56 ms to ~430 ms": the last 8188-token chunk (position
      24564) 430 ms. The 56 ms is the launch stall before the first chunk (the H200 sweep shows a
      ~55 ms slow step there), not a chunk.
    Each is a steady-state interval: max(its GPU time, the CPU time of the next chunk's launch).
    """
    ctx = 4096 + 40

    def chunk(c: int, k: int, d: int) -> tuple[StepComposition, StepComposition]:
        return mixed_composition(c, c * k, d, ctx), mixed_composition(c, c * (k + 1), d, ctx)

    b2048_first, b2048_first_next = chunk(2044, 1, 4)
    b2048_last, b2048_last_next = chunk(2044, 15, 4)
    b8192_last = mixed_composition(8188, 8188 * 3, 4, ctx)
    b8192_tail = mixed_composition(16, 8188 * 4, 4, ctx, last=True)
    return [
        StepObservation(StepComposition.decode_batch(1, ctx), 4.0e-3, "decode", label="D=1 decode ~4 ms"),
        StepObservation(StepComposition.decode_batch(12, ctx), 10.0e-3, "decode", label="D=12 decode ~10 ms"),
        StepObservation(b2048_first, 47e-3, "mixed", label="B=2048 D=4 early chunk ~47 ms",
                        next_composition=b2048_first_next),
        StepObservation(b2048_last, 120e-3, "mixed", label="B=2048 D=4 chunk 15 ~120 ms",
                        next_composition=b2048_last_next),
        StepObservation(b8192_last, 430e-3, "mixed", label="B=8192 D=4 chunk 3 ~430 ms", next_composition=b8192_tail),
    ]


# -- comparing predicted and measured records ------------------------------------------------

@dataclass(frozen=True)
class PointError:
    key: Key
    measured: float
    predicted: float

    @property
    def ape(self) -> float:
        return abs(self.predicted - self.measured) / self.measured * 100 if self.measured else math.nan

    @property
    def rel(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured else math.nan


METRICS = ("prefill_duration", "during_tpot", "window_tpot", "baseline_tpot")


@dataclass
class HoldoutReport:
    prefill_duration: list[PointError] = field(default_factory=list)
    during_tpot: list[PointError] = field(default_factory=list)  # tpot_during_prefill_p50_ms: the chunk steps
    window_tpot: list[PointError] = field(default_factory=list)  # tpot_window_p50_ms: every interval in the window
    baseline_tpot: list[PointError] = field(default_factory=list)

    @staticmethod
    def mape(errors: Sequence[PointError], chunk_size: int | None = None) -> float | None:
        values = [e.ape for e in errors if not math.isnan(e.ape) and (chunk_size is None or e.key[0] == chunk_size)]
        return float(np.mean(values)) if values else None

    def table(self) -> dict[str, dict[str, float | None]]:
        """MAPE % per metric, per chunk size and overall ("all")."""
        chunks = sorted({e.key[0] for e in self.prefill_duration})
        return {metric: {**{str(b): self.mape(getattr(self, metric), b) for b in chunks},
                         "all": self.mape(getattr(self, metric))} for metric in METRICS}


def compare_records(measured: Mapping[Key, RunRecord], predicted: Mapping[Key, RunRecord]) -> HoldoutReport:
    """Per configuration, the seed's headline numbers measured vs predicted (medians over reps)."""
    report = HoldoutReport()
    for key in sorted(set(measured) & set(predicted)):
        m, p = measured[key], predicted[key]
        pairs = [
            (report.prefill_duration, m.interference.prefill_duration_ms, p.interference.prefill_duration_ms),
            (report.during_tpot, m.interference.tpot_during_prefill_p50_ms, p.interference.tpot_during_prefill_p50_ms),
            (report.window_tpot, m.interference.tpot_window_p50_ms, p.interference.tpot_window_p50_ms),
            (report.baseline_tpot, m.baseline.tpot_p50_ms, p.baseline.tpot_p50_ms),
        ]
        for bucket, mv, pv in pairs:
            if mv is not None and pv is not None and mv > 0:
                bucket.append(PointError(key, float(mv), float(pv)))
    return report


# -- stage 2: the engine loop, by simulation ---------------------------------------------------

Predictor = Callable[[Profile, Iterable[Key]], Mapping[Key, RunRecord]]


def last_chunk_step_ms(record: RunRecord) -> float | None:
    """Median over repetitions of the last chunk step: the interval that ends with the first token,
    where the request's retirement shows."""
    values = [rep.interference.chunk_step_times_ms[-1] for rep in record.reps or [] if rep.interference.chunk_step_times_ms]
    return float(np.median(values)) if values else None


def record_residuals(measured: Mapping[Key, RunRecord], predicted: Mapping[Key, RunRecord]) -> np.ndarray:
    """log(predicted / measured) of prefill_duration, and when D > 0 of the chunk steps' p50 and
    mean and of the last chunk step (so the retirement cost is fitted where it shows)."""
    out: list[float] = []
    for key in sorted(measured):
        m, p = measured[key].interference, predicted[key].interference
        pairs = [(m.prefill_duration_ms, p.prefill_duration_ms)]
        if key[1] > 0:
            pairs += [(m.tpot_during_prefill_p50_ms, p.tpot_during_prefill_p50_ms),
                      (m.tpot_during_prefill_mean_ms, p.tpot_during_prefill_mean_ms),
                      (last_chunk_step_ms(measured[key]), last_chunk_step_ms(predicted[key]))]
        for mv, pv in pairs:
            if mv and mv > 0:
                out.append(math.log(max(pv or 0.0, 1e-6) / mv))
    return np.array(out)


@dataclass(frozen=True)
class LoopFitResult:
    values: dict[str, float]
    free: tuple[str, ...]
    n_configs: int
    n_residuals: int
    rms_log: float
    evaluations: int
    success: bool
    message: str


def fit_loop_params(
    profile: Profile,
    measured: Mapping[Key, RunRecord],
    predict: Predictor,
    free: Sequence[str] = LOOP_FREE,
    *,
    prior_weight: float = 0.02,
    max_evaluations: int = 60,
    on_evaluation: Callable[[int, float], None] | None = None,
) -> LoopFitResult:
    """Fit the CPU-side and per-request costs so that the protocol, run on the embedded engine,
    reproduces the measured records (`predict(profile, keys)` runs it).

    Finite differences of 5 % of each parameter (at least 0.05 of its unit) over a simulation whose
    outputs move in steps (a request lands before or after a step boundary): the step is wide
    enough to see the trend through them. The loss is soft-L1 with a 2 % scale, i.e. close to the
    absolute log error: the fit aims at what is reported (MAPE) and, where the measured engine
    switches between two speeds from one repetition to the next (docs/sim.md), at the common one
    rather than between the two. `max_evaluations` bounds the simulated sweeps (Jacobians included).
    """
    from scipy.optimize import least_squares

    free = _check_free(free, frozenset(BOUNDS))
    if not measured:
        raise ValueError("no records to fit the engine loop to")
    x0, lo, hi = _start(profile, free)
    keys = sorted(measured)
    calls = [0]
    last = [math.nan]

    def residuals(x: np.ndarray) -> np.ndarray:
        prof = with_values(profile, dict(zip(free, map(float, x))))
        res = record_residuals(measured, predict(prof, keys))
        calls[0] += 1
        last[0] = float(np.sqrt(np.mean(res**2))) if res.size else math.nan
        if on_evaluation is not None:
            on_evaluation(calls[0], last[0])
        prior = prior_weight * (x - x0) / np.maximum(np.abs(x0), 1.0)
        return np.concatenate([res, prior])

    solution = least_squares(residuals, x0, bounds=(lo, hi), diff_step=0.05, loss="soft_l1", f_scale=0.02,
                             max_nfev=max(2, max_evaluations // (len(free) + 1)))
    res = solution.fun[: -len(free)]
    return LoopFitResult(dict(zip(free, map(float, solution.x))), free, len(keys), int(res.size),
                         float(np.sqrt(np.mean(res**2))) if res.size else math.nan, calls[0],
                         bool(solution.status > 0), str(solution.message))


# -- one calibration, end to end (pure apart from the predictor it is given) -----------------------

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


def calibrate(
    base: Profile,
    records: Sequence[RunRecord],
    *,
    holdout: float = 0.0,
    free: Sequence[str] = DEFAULT_FREE,
    source: str | None = None,
    predict: Predictor | None = None,
    rounds: int = 2,
    max_evaluations: int = 60,
    on_evaluation: Callable[[int, int, float], None] | None = None,
) -> Calibration:
    """Fit `base` to the records outside the held-out configurations.

    `predict` runs the protocol on the embedded engine for stage 2 (None: stage 1 only, the
    engine-loop costs stay as `base` has them). `on_evaluation(round, evaluation, rms)` reports
    stage 2's progress."""
    if not records:
        raise ValueError("no records to calibrate on")
    keys = [r.key for r in records]
    train_keys, held_keys = split_holdout(keys, holdout)
    train = observations_from_records([r for r in records if r.key in train_keys])
    held = observations_from_records([r for r in records if r.key in held_keys])
    if not train.observations:
        raise ValueError("the training records hold no usable step times (no decode baseline, no middle chunk steps)")
    step_free = tuple(n for n in free if n in GPU_PARAMS)
    loop_free = tuple(n for n in free if n not in GPU_PARAMS)
    _check_free(free, frozenset(BOUNDS))
    measured = {r.key: r for r in records if r.key in train_keys}
    current = base
    fit: FitResult | None = None
    loop: LoopFitResult | None = None
    n_rounds = max(1, rounds if (predict is not None and loop_free) else 1)
    for round_ in range(n_rounds):
        if step_free:
            fit = fit_step_params(current, train.observations, step_free)
            current = current.model_copy(update={"step_time": fit.params})
        if predict is not None and loop_free:
            loop = fit_loop_params(
                current, measured, predict, loop_free, max_evaluations=max_evaluations,
                on_evaluation=(lambda i, rms, r=round_: on_evaluation(r, i, rms)) if on_evaluation else None)
            current = with_values(current, loop.values)
    if fit is None:
        mape, rms, worst, kinds = step_summary(current, current.step_time, train.observations)
        fit = FitResult(current.step_time, (), len(train.observations), mape, rms, worst, kinds, True, "not fitted")
    before = step_summary(base, base.step_time, train.observations)
    held_after = held_before = None
    if held.observations:
        held_after = step_summary(current, current.step_time, held.observations)[0]
        held_before = step_summary(base, base.step_time, held.observations)[0]
    note = (
        f"Fitted by pdexporter sim calibrate to {len(train_keys)} configuration(s) "
        f"({fit.n} step times: {', '.join(f'{k} MAPE {v:.1f} %' for k, v in fit.by_kind.items())}"
        + (f"; engine loop by simulation, rms log error {loop.rms_log:.3f}" if loop is not None else "")
        + f"); {len(held_keys)} configuration(s) held out. Free parameters: {', '.join((*step_free, *loop_free))}."
    )
    profile = current.with_step_time(current.step_time, calibration="calibrated", note=note, source=source)
    return Calibration(base, profile, fit, loop, before, train_keys, held_keys, train, held, held_after, held_before,
                       n_rounds)
