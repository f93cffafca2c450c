"""Fit a profile's step-time parameters to measured step times. Pure: records in, parameters out.

Observations. Each measured record (`results/{chunk}/D{d}_P{p}.json`, `measure.records`) gives,
per repetition,
- one decode-only step: `baseline.tpot_p50_ms` is the step time of D decodes (the decode cadence
  is the step time); their context is the probe prefix plus the mid-point of the measured tokens;
- one mixed step per prefill chunk: `interference.chunk_step_times_ms` are the chunk steps of the
  median probe stream, in order, i.e. each mixed step's time (measure/window.py defines them); the chunk sizes come from the engine
  log (`chunk_tokens_engine_log`) or, without it, from the scheduling rule (B - D per chunk, the
  rest in the last). Chunk k starts at the sum of the earlier chunks: its attention context.
A repetition whose slow-step count does not match its chunks (a tail too small to see, a hiccup)
contributes its decode step only; the report counts them.

Fit. `scipy.optimize.least_squares` on log(model / measured), so a 5 ms decode step and a 400 ms
chunk weigh alike, over the chosen free parameters within physical bounds (efficiencies in
(0, 1], overheads >= 0). `split_holdout` keeps whole configurations out of the fit so the error on
them (`pdexporter sim calibrate --holdout`) says how well the model predicts what it was not fitted
on; the held-out records are predicted by running the protocol on the embedded engine
(`pdexporter.sim.predict`), and compared on prefill_duration and window TPOT.

`vllm_facts_observations()` are the step times written down in docs/vllm-facts.md (H200, vLLM 0.22):
the shipped H200 profile is fitted to them (`calibration: projected-from-facts`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pdexporter.measure.records import RunRecord
from pdexporter.sim.profile import Profile, StepTimeParams
from pdexporter.sim.steptime import StepComposition, StepTimeModel

DEFAULT_FREE = (
    "fixed_ms",
    "piecewise_overhead_ms",
    "eager_overhead_ms",
    "matmul_efficiency",
    "moe_efficiency",
    "attention_efficiency",
    "bandwidth_efficiency",
)
BOUNDS: dict[str, tuple[float, float]] = {
    "fixed_ms": (0.0, 50.0),
    "piecewise_overhead_ms": (0.0, 50.0),
    "eager_overhead_ms": (0.0, 200.0),
    "matmul_efficiency": (0.05, 1.0),
    "moe_efficiency": (0.05, 1.0),
    "attention_efficiency": (0.05, 1.0),
    "bandwidth_efficiency": (0.05, 0.95),  # nobody streams HBM at its datasheet peak
    "moe_expert_pool": (8.0, 128.0),
    "roofline_sharpness": (1.0, 32.0),
}


@dataclass(frozen=True)
class StepObservation:
    composition: StepComposition
    seconds: float
    kind: str  # "decode" or "mixed"
    key: tuple[int, int, int] | None = None  # (chunk_size, D, P) of the record it came from
    label: str = ""
    weight: float = 1.0


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
        position = 0
        for k, (chunk, t_ms) in enumerate(zip(chunks, slow)):
            comp = mixed_composition(chunk, position, d, inject_ctx + k, last=position + chunk >= p)
            out.observations.append(StepObservation(comp, t_ms / 1e3, "mixed", key, f"B={b} D={d} P={p} chunk {k}"))
            position += chunk
    return out


def observations_from_records(records: Iterable[RunRecord]) -> ObservationSet:
    out = ObservationSet()
    for record in records:
        observations_from_record(record, out)
    return out


def split_holdout(keys: Sequence[tuple[int, int, int]], fraction: float) -> tuple[set, set]:
    """(train, held-out) configurations; deterministic (hash of the key), about `fraction` held out."""
    if not 0 <= fraction < 1:
        raise ValueError(f"holdout fraction {fraction} must be in [0, 1)")
    ordered = sorted(set(keys), key=lambda k: hashlib.sha256(repr(k).encode()).hexdigest())
    n_out = int(round(len(ordered) * fraction))
    if fraction > 0 and n_out == 0 and len(ordered) > 1:
        n_out = 1
    held = set(ordered[:n_out])
    return set(ordered) - held, held


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
    return np.array([(model(o.composition) - o.seconds) / o.seconds for o in observations])


def _summary(profile: Profile, params: StepTimeParams, observations: Sequence[StepObservation]) -> tuple:
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
    free: Sequence[str] = DEFAULT_FREE,
    *,
    start: StepTimeParams | None = None,
    prior_weight: float = 0.02,
) -> FitResult:
    """Least-squares fit of `free` parameters in log space, from `start` (the profile's values).

    A weak prior (`prior_weight`, in log units per parameter) pulls each parameter towards its
    starting value, so parameters the data cannot see stay where the profile put them.
    """
    from scipy.optimize import least_squares

    if not observations:
        raise ValueError("no step observations to fit")
    base = start or profile.step_time
    free = tuple(free)
    unknown = [name for name in free if name not in BOUNDS]
    if unknown:
        raise ValueError(f"cannot fit {', '.join(unknown)}; fittable: {', '.join(BOUNDS)}")
    values = base.model_dump()
    x0, lo, hi = [], [], []
    for name in free:
        low, high = BOUNDS[name]
        v = values[name]
        if v is None:
            v = profile.model.num_experts if name == "moe_expert_pool" else (low + high) / 2
        v = min(max(float(v), low + 1e-6), high - 1e-6)
        x0.append(v)
        lo.append(low)
        hi.append(high)
    x0_arr = np.array(x0)
    targets = np.array([o.seconds for o in observations])
    weights = np.sqrt(np.array([o.weight for o in observations]))
    comps = [o.composition for o in observations]

    def params_of(x: np.ndarray) -> StepTimeParams:
        update = dict(values)
        update.update({name: float(v) for name, v in zip(free, x)})
        return StepTimeParams(**update)

    def residuals(x: np.ndarray) -> np.ndarray:
        model = StepTimeModel(profile, params_of(x))
        pred = np.array([model(c) for c in comps])
        res = np.log(np.maximum(pred, 1e-9) / targets) * weights
        scale = np.maximum(np.abs(x0_arr), 1e-3)
        prior = prior_weight * (x - x0_arr) / scale
        return np.concatenate([res, prior])

    solution = least_squares(residuals, x0_arr, bounds=(np.array(lo), np.array(hi)), x_scale="jac")
    params = params_of(solution.x)
    mape, rms_log, max_ape, kinds = _summary(profile, params, observations)
    return FitResult(params, free, len(observations), mape, rms_log, max_ape, kinds, bool(solution.success),
                     str(solution.message))


def vllm_facts_observations() -> list[StepObservation]:
    """The H200 step times in docs/vllm-facts.md, as observations (vLLM 0.22, Qwen3-Coder-30B-A3B).

    - decode-only steps "4-10 ms for D = 1...12 at 4K context": D=1 -> 4 ms, D=12 -> 10 ms;
    - B=2048, D=4, P=32768: 17 mixed steps "from ~47 ms to ~120 ms": the first 2044-token chunk
      (position 0) 47 ms, the last full one (position 30660) 120 ms;
    - B=8192, D=4, P=32768: "5 steps from ~56 ms to ~430 ms": the last 8188-token chunk (position
      24564) 430 ms. The 56 ms is left out: an 8188-token chunk is 44 TFLOP of weight GEMMs alone
      (>= 45 ms at the datasheet peak) plus 26 TFLOP of attention, so no step model with physical
      efficiencies reaches 56 ms; it is most likely the 16-token tail step or a client-side merge
      of two intervals, which the facts do not say.
    """
    ctx = 4096 + 40
    obs = [
        StepObservation(StepComposition.decode_batch(1, ctx), 4.0e-3, "decode", label="D=1 decode ~4 ms"),
        StepObservation(StepComposition.decode_batch(12, ctx), 10.0e-3, "decode", label="D=12 decode ~10 ms"),
        StepObservation(mixed_composition(2044, 0, 4, ctx), 47e-3, "mixed", label="B=2048 D=4 chunk 0 ~47 ms"),
        StepObservation(mixed_composition(2044, 2044 * 15, 4, ctx), 120e-3, "mixed",
                        label="B=2048 D=4 chunk 15 ~120 ms"),
        StepObservation(mixed_composition(8188, 8188 * 3, 4, ctx), 430e-3, "mixed",
                        label="B=8192 D=4 chunk 3 ~430 ms"),
    ]
    return obs


# -- comparing predicted and measured records ------------------------------------------------

@dataclass(frozen=True)
class PointError:
    key: tuple[int, int, int]
    measured: float
    predicted: float

    @property
    def ape(self) -> float:
        return abs(self.predicted - self.measured) / self.measured * 100 if self.measured else math.nan


@dataclass
class HoldoutReport:
    prefill_duration: list[PointError] = field(default_factory=list)
    window_tpot: list[PointError] = field(default_factory=list)
    during_tpot: list[PointError] = field(default_factory=list)
    baseline_tpot: list[PointError] = field(default_factory=list)

    @staticmethod
    def mape(errors: Sequence[PointError]) -> float | None:
        values = [e.ape for e in errors if not math.isnan(e.ape)]
        return float(np.mean(values)) if values else None


def compare_records(measured: Mapping[tuple[int, int, int], RunRecord],
                    predicted: Mapping[tuple[int, int, int], RunRecord]) -> HoldoutReport:
    """Per configuration, the seed's headline numbers measured vs predicted (medians over reps)."""
    report = HoldoutReport()
    for key in sorted(set(measured) & set(predicted)):
        m, p = measured[key], predicted[key]
        pairs = [
            (report.prefill_duration, m.interference.prefill_duration_ms, p.interference.prefill_duration_ms),
            (report.window_tpot, m.interference.tpot_window_p50_ms, p.interference.tpot_window_p50_ms),
            (report.during_tpot, m.interference.tpot_during_prefill_p50_ms, p.interference.tpot_during_prefill_p50_ms),
            (report.baseline_tpot, m.baseline.tpot_p50_ms, p.baseline.tpot_p50_ms),
        ]
        for bucket, mv, pv in pairs:
            if mv is not None and pv is not None and mv > 0:
                bucket.append(PointError(key, float(mv), float(pv)))
    return report


# -- one calibration, end to end (still pure: records in, profile and errors out) --------------

@dataclass
class Calibration:
    base: Profile
    profile: Profile  # the fitted one, `calibration: calibrated`
    fit: FitResult  # on the training observations
    before: tuple[float, float, float, dict[str, float]]  # base profile on the same observations
    train_keys: set[tuple[int, int, int]]
    held_keys: set[tuple[int, int, int]]
    train: ObservationSet
    held: ObservationSet
    held_step_mape: float | None  # fitted model on the held-out configurations' step observations
    held_step_mape_before: float | None


def calibrate(
    base: Profile,
    records: Sequence[RunRecord],
    *,
    holdout: float = 0.0,
    free: Sequence[str] = DEFAULT_FREE,
    source: str | None = None,
) -> Calibration:
    """Fit `base`'s step-time parameters to the records outside the held-out configurations."""
    if not records:
        raise ValueError("no records to calibrate on")
    keys = [r.key for r in records]
    train_keys, held_keys = split_holdout(keys, holdout)
    train = observations_from_records([r for r in records if r.key in train_keys])
    held = observations_from_records([r for r in records if r.key in held_keys])
    if not train.observations:
        raise ValueError("the training records hold no usable step times (no decode baseline, no slow steps)")
    fit = fit_step_params(base, train.observations, free)
    before = _summary(base, base.step_time, train.observations)
    held_after = held_before = None
    if held.observations:
        held_after = _summary(base, fit.params, held.observations)[0]
        held_before = _summary(base, base.step_time, held.observations)[0]
    note = (
        f"Fitted by pdexporter sim calibrate to {len(train_keys)} configuration(s) "
        f"({fit.n} step times: {', '.join(f'{k} MAPE {v:.1f} %' for k, v in fit.by_kind.items())}); "
        f"{len(held_keys)} configuration(s) held out. Free parameters: {', '.join(fit.free)}."
    )
    profile = base.with_step_time(fit.params, calibration="calibrated", note=note, source=source)
    return Calibration(base, profile, fit, before, train_keys, held_keys, train, held, held_after, held_before)
