"""Fit a profile to measured records: the step-time model, then the engine-loop costs; say how well
the fit predicts configurations it did not see.

Two stages, each on the configurations outside the held-out ones (`split_holdout`).

Stage 1, the GPU (closed form, `fit_step_params`). Steps whose probe interval is the step's own
steady-state time under async scheduling: max(GPU time of the step, CPU time of the step launched
while it runs) (`pdexporter.sim.engine`):
- decode-only steps: `baseline.tpot_p50_ms` of each repetition is the period of D decodes (their
  context: the probe prefix plus the mid-point of the measured tokens), padded to their CUDA
  graph's captured size as vLLM runs them (`pdexporter.sim.steptime`);
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
physical bounds, a weak prior holding what the data cannot see at the profile's value. The model
is evaluated on all observations at once (`StepTimeModel.gpu_s_array`): a fit takes ~0.1 s.

Stage 2, the CPU and the engine loop (`fit_loop_params`, by simulation). The launch costs, the
CPU per token and the per-request costs (admission, retirement, front-end latency) shape how the
steps add up to the window, which no single step shows. They are fitted by running the
measurement protocol on the embedded engine itself (a `Simulator`: `RecordSimulator` runs
`pdexporter.predict.grid` in virtual time, in the records' own mode) and matching, per
configuration, the record's prefill_duration and the chunk steps' p50 and mean (TPOT during the
prefill) and the last chunk step (where the retirement shows): least squares on log ratios.
A simulation is the expensive part (~2.5 s of CPU for the 196 H200 configurations), so: each
round takes the Jacobian by finite differences once (its columns simulated side by side in worker
processes) and then carries it by Broyden's rank-one updates along the iterations; every
simulation runs (B, D) groups, independent of each other, cached by profile, so a point is never
simulated twice and any subset of configurations is read from the cache.

Stage 1 and 2 alternate (`rounds`): the CPU times decide which chunk steps are CPU-bound, the GPU
times what the loop costs must explain. The held-out configurations are then predicted with the
base and the fitted profile and compared (`compare_records`, `HoldoutReport`); `held_out_check`
scores both per quantity of the held-out table (`GUARDED`: baseline TPOT, penalty mean and p50,
prefill duration, TPOT during the prefill, aggregate interference, TPOT over the window) and names
those the fit predicts worse than the profile it started from; `profile_to_write` refuses such a
fit (`refusal`: one line, the worst quantity and both errors) unless forced, and then labels it and
records the check in the profile (`calibration_check`).

`generalisation` refits with one chunk size, or one decode batch size, left out at a time and
predicts the group left out: the first round of the calibration again without the group, its
finite differences replaced by the calibration's own first Jacobian (CALIBRATION.md compares it
with exact refits).

`vllm_facts_observations()` are the step times written down in docs/vllm-facts.md (H200, vLLM 0.22).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from pdexporter.engines import DEFAULT_ENGINE, adapter, imitation_for
from pdexporter.errors import PdexporterError
from pdexporter.measure.records import RunRecord
from pdexporter.sim.profile import CalibrationCheck, EngineLoopParams, HostParams, Profile, StepTimeParams
from pdexporter.sim.steptime import StepArrays, StepComposition, StepTimeModel

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    from pdexporter.measure.protocol import ProtocolSettings

__all__ = [
    "BETWEEN_GRID_D",
    "BOUNDS",
    "Calibration",
    "DEFAULT_FREE",
    "EXPERT_PARAMS",
    "FitResult",
    "FitWorseThanBase",
    "GPU_PARAMS",
    "GUARDED",
    "Generalisation",
    "Group",
    "GroupResult",
    "HEADLINE",
    "HOST_PARAMS",
    "HoldoutReport",
    "KINDS",
    "KNOWN_DECODE_MS",
    "Key",
    "LOOP_FREE",
    "LOOP_PARAMS",
    "LoopFitResult",
    "SLOW_FACTOR_START",
    "TAIL_AS_DECODE_MS",
    "METRICS",
    "METRIC_FIELDS",
    "METRIC_LABELS",
    "ObservationSet",
    "PointError",
    "PointFigures",
    "Progress",
    "RecordSimulator",
    "STAGE1_UNITS",
    "STEP_FREE",
    "STEP_PARAMS",
    "Simulator",
    "StepData",
    "StepObservation",
    "calibrate",
    "check_reports",
    "chunk_sizes",
    "compare_records",
    "decode_table",
    "classify_host",
    "figures_of",
    "fit_loop_params",
    "fit_step_params",
    "forced_warning",
    "free_for",
    "generalisation",
    "held_out_check",
    "host_sensitive",
    "host_states",
    "imitation_of",
    "kind_of",
    "label_worse",
    "predict_on_hosts",
    "profile_to_write",
    "last_chunk_step_ms",
    "mixed_composition",
    "observations_from_record",
    "observations_from_records",
    "profile_fingerprint",
    "record_residuals",
    "refusal",
    "residual_keys",
    "simulate_group",
    "split_holdout",
    "step_errors",
    "step_summary",
    "vllm_facts_observations",
    "with_values",
    "worse_of",
    "worse_than_base",
]

Key = tuple[int, int, int]  # (chunk_size, decode_batch_size, new_prefill_tokens)

# matmul_efficiency is not free by default: the profile takes it from a measured large GEMM
# (gpu.measured_matmul_tflops), and big chunks see dense and expert GEMMs only together.
STEP_FREE = ("fixed_ms", "moe_efficiency", "attention_efficiency", "bandwidth_efficiency", "moe_expert_pool")
LOOP_FREE = ("launch_eager_ms", "launch_piecewise_ms", "cpu_us_per_token", "request_overhead_ms",
             "admit_us_per_block", "retire_us_per_token", "idle_start_ms", "slow_factor")
DEFAULT_FREE = STEP_FREE + LOOP_FREE
LOOP_PARAMS = frozenset(EngineLoopParams.model_fields)
HOST_PARAMS = frozenset({"slow_factor"})  # the host section's (`HostParams`): fitted with the loop
SLOW_FACTOR_START = 1.6
# a last "chunk step" this short is a few-token tail that ran as a plain decode step: the cadence may not
# see it (the engine then puts 0 ms there), so it is not fitted
TAIL_AS_DECODE_MS = 5.0  # the H200 machine's slow episodes: ~80 ms launch-bound steps against ~50
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
    "slow_factor": (1.0, 3.0),
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


def chunk_sizes(p: int, b: int, d: int, engine: str = DEFAULT_ENGINE) -> list[int]:
    """The scheduler's chunks of a cold P-token prefill beside D decodes (the engine adapter's rule:
    a record's `config.engine`)."""
    return list(adapter(engine).chunk_schedule(p, b, d))


def mixed_composition(chunk: int, position: int, d: int, decode_context: int, *, last: bool = False
                      ) -> StepComposition:
    """One prefill chunk at `position` beside D decodes at `decode_context` tokens each."""
    return StepComposition.of([(chunk, position)] + [(1, decode_context)] * d, d + (1 if last else 0))


def observations_from_record(record: RunRecord, into: ObservationSet | None = None) -> ObservationSet:
    out = into if into is not None else ObservationSet()
    out.records += 1
    c = record.config
    b, d, p = c.chunk_size, c.decode_batch_size, c.new_prefill_tokens
    rule = adapter(c.engine).chunk_rule  # the record's engine: its chunks, and whether decodes share their steps
    beside = d if rule.decodes_in_chunk_step else 0  # the decodes in a chunk's step
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
        chunks = list(rep.interference.chunk_tokens_engine_log or chunk_sizes(p, b, d, c.engine))
        if len(rule.decode_view(chunks)) < len(chunks):
            continue  # the decodes paused through the chunks: one stall, no chunk step seen alone
        if len(slow) == len(chunks) - 1 and chunks[-1] <= 1:
            chunks = chunks[:-1]  # a 1-token tail runs as a plain decode batch: not seen as slow
        if len(slow) != len(chunks):
            out.reps_mismatched += 1
            continue
        out.reps_used += 1
        starts = np.concatenate([[0], np.cumsum(chunks)]).astype(int)
        comps = [mixed_composition(chunk, int(starts[k]), beside, inject_ctx + k, last=starts[k] + chunk >= p)
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


EXPERT_PARAMS = ("moe_efficiency", "moe_expert_pool")  # what only an MoE model's steps show


def free_for(profile: Profile, free: Sequence[str]) -> tuple[str, ...]:
    """The parameters a fit of `profile` frees: on a dense model the experts' (`EXPERT_PARAMS`) move no step
    time, and its weights are all dense GEMMs, so `moe_efficiency` stands for `matmul_efficiency` (the one
    efficiency its chunks show; an MoE model's is taken from a measured GEMM, its dense and expert GEMMs
    being seen only together) and `moe_expert_pool` is dropped."""
    if profile.model.is_moe:
        return tuple(free)
    out: list[str] = []
    for name in free:
        name = "matmul_efficiency" if name == "moe_efficiency" else name
        if name not in EXPERT_PARAMS and name not in out:
            out.append(name)
    return tuple(out)


def _section(name: str) -> str:
    return "engine_loop" if name in LOOP_PARAMS else "host" if name in HOST_PARAMS else "step_time"


def _value(profile: Profile, name: str) -> float:
    v = getattr(getattr(profile, _section(name)), name)
    if v is None:
        low, high = BOUNDS[name]
        v = profile.model.num_experts if name == "moe_expert_pool" else (low + high) / 2
    if name == "slow_factor" and v <= 1.0:
        v = SLOW_FACTOR_START  # no episode seen yet: start from the H200 machine's
    return float(v)


def with_values(profile: Profile, values: Mapping[str, float]) -> Profile:
    """The profile with these step_time / engine_loop / host parameters replaced."""
    parts = {section: {k: v for k, v in values.items() if _section(k) == section}
             for section in ("step_time", "engine_loop", "host")}
    return profile.model_copy(update={
        "step_time": StepTimeParams(**{**profile.step_time.model_dump(), **parts["step_time"]}),
        "engine_loop": EngineLoopParams(**{**profile.engine_loop.model_dump(), **parts["engine_loop"]}),
        "host": HostParams(**{**profile.host.model_dump(), **parts["host"]}),
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


class StepData:
    """Observations as arrays, one set per chunk size (the captured CUDA-graph sizes depend on it),
    so that the model times all of them in a few numpy operations."""

    def __init__(self, profile: Profile, observations: Sequence[StepObservation]) -> None:
        self.profile = profile
        self.observations = list(observations)
        self.targets = np.array([o.seconds for o in self.observations], dtype=float)
        self.kinds = np.array([o.kind for o in self.observations])
        by_chunk: dict[int | None, list[int]] = defaultdict(list)
        for i, o in enumerate(self.observations):
            by_chunk[o.key[0] if o.key is not None else None].append(i)
        self._groups: list[tuple[int | None, np.ndarray, StepArrays, StepArrays]] = []
        for b, idx in sorted(by_chunk.items(), key=lambda kv: kv[0] or 0):
            model = StepTimeModel(profile, max_num_batched_tokens=b)
            obs = [self.observations[i] for i in idx]
            steps = model.arrays([o.composition for o in obs])
            launched = model.arrays([o.next_composition if o.next_composition is not None else o.composition
                                     for o in obs])
            self._groups.append((b, np.array(idx), steps, launched))

    def model_s(self, params: StepTimeParams) -> np.ndarray:
        """Every observation's modelled interval: max(its step's GPU time, the launched step's CPU time)."""
        out = np.empty(len(self.observations))
        for b, idx, steps, launched in self._groups:
            model = StepTimeModel(self.profile, params, max_num_batched_tokens=b)
            out[idx] = np.maximum(model.gpu_s_array(steps), model.cpu_s_array(launched))
        return out


def step_errors(profile: Profile, params: StepTimeParams, observations: Sequence[StepObservation] | StepData
                ) -> np.ndarray:
    """Relative errors (model - measured) / measured."""
    data = observations if isinstance(observations, StepData) else StepData(profile, observations)
    return (data.model_s(params) - data.targets) / data.targets


def step_summary(profile: Profile, params: StepTimeParams, observations: Sequence[StepObservation] | StepData
                 ) -> tuple[float, float, float, dict[str, float]]:
    """(MAPE %, rms of log ratio, worst APE %, MAPE % per kind)."""
    data = observations if isinstance(observations, StepData) else StepData(profile, observations)
    rel = step_errors(profile, params, data)
    ape = np.abs(rel) * 100
    kinds = {kind: float(ape[data.kinds == kind].mean()) for kind in sorted(set(data.kinds.tolist()))}
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
    data = StepData(base, observations)
    weights = np.sqrt(np.array([o.weight for o in observations]))

    def params_of(x: np.ndarray) -> StepTimeParams:
        return StepTimeParams(**{**values, **{name: float(v) for name, v in zip(free, x)}})

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = data.model_s(params_of(x))
        res = np.log(np.maximum(pred, 1e-9) / data.targets) * weights
        prior = prior_weight * (x - x0) / np.maximum(np.abs(x0), 1e-3)
        return np.concatenate([res, prior])

    solution = least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac",
                             loss="soft_l1" if robust else "linear", f_scale=0.1)
    params = params_of(solution.x)
    mape, rms_log, max_ape, kinds = step_summary(base, params, data)
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


# -- what is compared: a record's figures ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PointFigures:
    """The figures of one record (measured or predicted) that calibration compares, medians over its
    repetitions as the record states them."""

    prefill_duration_ms: float | None
    during_p50_ms: float | None  # interference.tpot_during_prefill_p50_ms (chunk steps, token-weighted)
    during_mean_ms: float | None
    last_chunk_ms: float | None  # the last chunk step (median over repetitions): where retirement shows
    window_p50_ms: float | None
    baseline_p50_ms: float | None
    aggregate_interference_ms: float | None  # derived.aggregate_interference_ms
    penalty_p50_ms: float | None = None  # derived.tpot_penalty_p50_ms: TPOT during (token-weighted p50) - baseline
    penalty_mean_ms: float | None = None  # derived.tpot_penalty_ms: the same with the token-weighted mean (the table's)

    @classmethod
    def of(cls, record: RunRecord) -> PointFigures:
        i, d, base = record.interference, record.derived, record.baseline.tpot_p50_ms
        mean = i.tpot_during_prefill_mean_ms
        penalty = d.tpot_penalty_ms
        if penalty is None and mean is not None and base is not None and record.config.decode_batch_size:
            penalty = mean - base  # a record written before the penalty was the mean's
        return cls(i.prefill_duration_ms, i.tpot_during_prefill_p50_ms, mean, last_chunk_step_ms(record),
                   i.tpot_window_p50_ms, base, d.aggregate_interference_ms, d.tpot_penalty_p50_ms, penalty)


def last_chunk_step_ms(record: RunRecord) -> float | None:
    """Median over repetitions of the last chunk step: the interval that ends with the first token,
    where the request's retirement shows."""
    values = [
        rep.interference.chunk_step_times_ms[-1] for rep in record.reps or [] if rep.interference.chunk_step_times_ms
    ]
    return float(np.median(values)) if values else None


def figures_of(records: Iterable[RunRecord]) -> dict[Key, PointFigures]:
    return {r.key: PointFigures.of(r) for r in records}


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


# metric -> PointFigures field
METRIC_FIELDS = {
    "baseline_tpot": "baseline_p50_ms",  # the decode step beside no prefill
    "penalty": "penalty_mean_ms",  # derived.tpot_penalty_ms: token-weighted mean of the chunk steps - baseline
    "penalty_p50": "penalty_p50_ms",  # derived.tpot_penalty_p50_ms: the same with their token-weighted p50
    "prefill_duration": "prefill_duration_ms",
    "during_tpot": "during_p50_ms",  # tpot_during_prefill_p50_ms: the chunk steps
    "aggregate_interference": "aggregate_interference_ms",
    "window_tpot": "window_p50_ms",  # tpot_window_p50_ms: every interval in the window
}
METRICS = tuple(METRIC_FIELDS)
# what generalisation and the summaries report
HEADLINE = ("baseline_tpot", "penalty", "prefill_duration", "aggregate_interference")
# what a fit must not predict worse than its base on held-out configurations: every quantity of the held-out
# table (the README's example once wrote a fit whose "TPOT over the window (p50)" went from 34.0 to 80.4 %)
GUARDED = METRICS
METRIC_LABELS = {
    "baseline_tpot": "baseline TPOT",
    "penalty": "TPOT penalty (mean)",
    "penalty_p50": "TPOT penalty (p50)",
    "prefill_duration": "prefill_duration",
    "during_tpot": "TPOT during prefill (p50)",
    "aggregate_interference": "aggregate interference",
    "window_tpot": "TPOT over the window (p50)",
}
KINDS = ("D = 0", "one small chunk (P <= 2048)", "one big chunk (P >= 4096)", "two chunks", "three or more chunks")


def kind_of(key: Key, engine: str = DEFAULT_ENGINE) -> str:
    """The kind of configuration (CALIBRATION.md's rows): how the prefill is scheduled beside D decodes."""
    b, d, p = key
    if d == 0:
        return KINDS[0]
    n = len(chunk_sizes(p, b, d, engine))
    if n == 1:
        return KINDS[1] if p <= 2048 else KINDS[2]
    return KINDS[3] if n == 2 else KINDS[4]


def _is_kind(kind: str, key: Key) -> bool:
    return kind_of(key) == kind


@dataclass
class HoldoutReport:
    """Per metric (`METRICS`), each configuration's measured and predicted value."""

    baseline_tpot: list[PointError] = field(default_factory=list)
    penalty: list[PointError] = field(default_factory=list)
    penalty_p50: list[PointError] = field(default_factory=list)
    prefill_duration: list[PointError] = field(default_factory=list)
    during_tpot: list[PointError] = field(default_factory=list)
    aggregate_interference: list[PointError] = field(default_factory=list)
    window_tpot: list[PointError] = field(default_factory=list)

    def of(self, metric: str) -> list[PointError]:
        if metric not in METRIC_FIELDS:
            raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        return getattr(self, metric)

    @staticmethod
    def mape(errors: Sequence[PointError], chunk_size: int | None = None,
             where: Callable[[Key], bool] | None = None) -> float | None:
        values = [e.ape for e in errors if not math.isnan(e.ape) and (chunk_size is None or e.key[0] == chunk_size)
                  and (where is None or where(e.key))]
        return float(np.mean(values)) if values else None

    def metric_mape(self, metric: str, where: Callable[[Key], bool] | None = None) -> float | None:
        return self.mape(self.of(metric), where=where)

    def table(self) -> dict[str, dict[str, float | None]]:
        """MAPE % per metric, per chunk size and overall ("all")."""
        chunks = sorted({e.key[0] for metric in METRICS for e in self.of(metric)})
        return {metric: {**{str(b): self.mape(self.of(metric), b) for b in chunks},
                         "all": self.mape(self.of(metric))} for metric in METRICS}

    def by_kind(self) -> dict[str, dict[str, float | int | None]]:
        """MAPE % of the headline metrics per kind of configuration (`kind_of`), with its count."""
        keys = {e.key for metric in METRICS for e in self.of(metric)}
        out: dict[str, dict[str, float | int | None]] = {}
        for kind in KINDS:
            n = sum(1 for k in keys if kind_of(k) == kind)
            if n:
                of_kind = functools.partial(_is_kind, kind)
                out[kind] = {"n": n, **{m: self.metric_mape(m, of_kind) for m in HEADLINE}}
        return out


def compare_records(measured: Mapping[Key, PointFigures | RunRecord],
                    predicted: Mapping[Key, PointFigures | RunRecord]) -> HoldoutReport:
    """Per configuration, the headline numbers measured vs predicted (medians over reps)."""
    report = HoldoutReport()
    for key in sorted(set(measured) & set(predicted)):
        m, p = _figures(measured[key]), _figures(predicted[key])
        for metric, name in METRIC_FIELDS.items():
            mv, pv = getattr(m, name), getattr(p, name)
            if mv is not None and pv is not None and mv > 0:
                report.of(metric).append(PointError(key, float(mv), float(pv)))
    return report


def _figures(x: PointFigures | RunRecord) -> PointFigures:
    return x if isinstance(x, PointFigures) else PointFigures.of(x)


def worse_than_base(base: HoldoutReport, fitted: HoldoutReport, metrics: Sequence[str] = GUARDED, *,
                    tolerance: float = 0.0) -> list[tuple[str, float, float]]:
    """(metric, fitted MAPE %, base MAPE %) for each guarded metric the fit predicts worse, by more
    than `tolerance` points."""
    out = []
    for metric in metrics:
        b, f = base.metric_mape(metric), fitted.metric_mape(metric)
        if b is not None and f is not None and f > b + tolerance:
            out.append((metric, f, b))
    return out


class FitWorseThanBase(PdexporterError):
    """The fitted profile predicts held-out configurations worse than the profile it started from."""

    exit_code = 5


# -- simulating configurations: the protocol on the embedded engine ------------------------------

class Simulator(Protocol):
    """Predicts configurations' figures with profiles by running the protocol on the embedded engine."""

    def __call__(self, profiles: Sequence[Profile], keys: Collection[Key]) -> list[dict[Key, PointFigures]]:
        """One prediction of `keys` per profile, in order."""
        ...

    def batch(self, requests: Sequence[tuple[Profile, Collection[Key]]]) -> list[dict[Key, PointFigures]]:
        """One prediction per (profile, keys) request, in order, run side by side."""
        ...

    def groups(self, keys: Collection[Key]) -> int:
        """How many units of work (simulated groups) one profile's prediction of `keys` takes."""
        ...

    @property
    def simulated(self) -> int:
        """Units of work run so far (cache hits excluded)."""
        ...


Group = tuple[int, int]  # (chunk_size, D): what one engine simulates independently of the others


def profile_fingerprint(profile: Profile) -> str:
    """What decides a simulation's result (names and notes do not)."""
    text = profile.model_dump_json(include={"gpu", "model", "engine", "step_time", "engine_loop"})
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def _scratch_in_memory() -> Iterator[None]:
    """Point tempfile at /dev/shm while simulating: the predicted records are written (fsync'd) to a
    scratch directory and thrown away, and on tmpfs that costs nothing (~15 % of a simulation on disk)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield
        return
    saved = tempfile.tempdir
    tempfile.tempdir = str(shm)
    try:
        yield
    finally:
        tempfile.tempdir = saved


def simulate_group(profile: Profile, settings: ProtocolSettings, mode: str, chunk_size: int, d: int,
                   prefills: Sequence[int], imitates: str = DEFAULT_ENGINE) -> tuple[dict[Key, PointFigures], float]:
    """One (B, D) group predicted (`predict.grid.predict_records`) on the embedded engine imitating
    `imitates`, and the CPU seconds it took."""
    from pdexporter.predict.grid import predict_records

    t0 = time.process_time()
    with _scratch_in_memory():
        records = predict_records(profile, [(chunk_size, d, p) for p in prefills], settings, mode=mode,
                                  imitates=imitates)
    return {key: PointFigures.of(r) for key, r in records.items()}, time.process_time() - t0


def _simulate_group_task(args: tuple[Profile, ProtocolSettings, str, int, int, tuple[int, ...], str]
                         ) -> tuple[dict[Key, PointFigures], float]:
    return simulate_group(*args)


class RecordSimulator:
    """`Simulator` over a fixed set of configurations (`universe`, the records' keys).

    Every prediction runs whole (B, D) groups, each on its own engine as a sweep restarts vLLM per
    chunk size (the groups are independent: run apart or together they agree to 1e-6), with all of
    the group's prefill sizes in the universe, whatever subset was asked for; results are cached by
    profile fingerprint and group, so any later subset at the same parameters costs nothing. With
    `jobs` > 1 the groups of all the profiles asked for at once (a Jacobian's columns) run in that
    many worker processes, longest first. `on_group(group)` is called as each group is done (also
    for a cached one), for progress bars. `imitates`: the engine (setup) the embedded engine imitates,
    the records' (`imitation_of`; None: `calibrate` sets it from its records, else vLLM's), so that
    SGLang's records are predicted on SGLang's scheduling.
    """

    def __init__(self, universe: Iterable[Key], settings: ProtocolSettings, *, mode: str = "fast", jobs: int = 1,
                 on_group: Callable[[Group], None] | None = None, imitates: str | None = None) -> None:
        self.imitates = imitates
        by_group: dict[Group, set[int]] = defaultdict(set)
        for b, d, p in universe:
            by_group[(b, d)].add(p)
        self.prefills: dict[Group, tuple[int, ...]] = {g: tuple(sorted(ps)) for g, ps in sorted(by_group.items())}
        self.settings = settings
        self.mode = mode
        self.jobs = max(1, jobs)
        self.on_group = on_group
        self.cache: dict[tuple[str, Group], dict[Key, PointFigures]] = {}
        self.cost: dict[Group, float] = {}  # CPU seconds of the last run of each group
        self._simulated = 0  # groups run (cache misses)
        self.cpu_s = 0.0
        self._pool: ProcessPoolExecutor | None = None

    def _groups_of(self, keys: Collection[Key]) -> list[Group]:
        wanted = sorted({(b, d) for b, d, _ in keys})
        unknown = [g for g in wanted if g not in self.prefills]
        if unknown:
            raise ValueError(f"configurations outside the records: B={unknown[0][0]} D={unknown[0][1]}")
        return wanted

    def groups(self, keys: Collection[Key]) -> int:
        return len(self._groups_of(keys))

    @property
    def simulated(self) -> int:
        return self._simulated

    def __call__(self, profiles: Sequence[Profile], keys: Collection[Key]) -> list[dict[Key, PointFigures]]:
        return self.batch([(p, keys) for p in profiles])

    def batch(self, requests: Sequence[tuple[Profile, Collection[Key]]]) -> list[dict[Key, PointFigures]]:
        wanted_groups = [self._groups_of(keys) for _, keys in requests]
        prints = [profile_fingerprint(p) for p, _ in requests]
        todo: dict[tuple[str, Group], Profile] = {}
        for (profile, _), fp, groups in zip(requests, prints, wanted_groups):
            for g in groups:
                if (fp, g) in self.cache:
                    if self.on_group is not None:
                        self.on_group(g)
                elif (fp, g) not in todo:
                    todo[(fp, g)] = profile
        # longest first (the last run's cost, else the number of prefills): the workers finish together
        order = sorted(todo, key=lambda item: -self.cost.get(item[1], 0.1 * len(self.prefills[item[1]])))
        for item, (figures, cpu) in self._run([(todo[item], item[1]) for item in order], order):
            self.cache[item] = figures
            self.cost[item[1]] = cpu
            self.cpu_s += cpu
            self._simulated += 1
            if self.on_group is not None:
                self.on_group(item[1])
        out = []
        for (_, keys), fp, groups in zip(requests, prints, wanted_groups):
            wanted = set(keys)
            merged: dict[Key, PointFigures] = {}
            for g in groups:
                merged.update({k: v for k, v in self.cache[(fp, g)].items() if k in wanted})
            out.append(merged)
        return out

    def _run(self, tasks: list[tuple[Profile, Group]], items: list[tuple[str, Group]]
             ) -> Iterator[tuple[tuple[str, Group], tuple[dict[Key, PointFigures], float]]]:
        args = [(profile, self.settings, self.mode, g[0], g[1], self.prefills[g], self.imitates or DEFAULT_ENGINE)
                for profile, g in tasks]
        if self.jobs == 1 or len(args) <= 1:
            for item, a in zip(items, args):
                yield item, _simulate_group_task(a)
            return
        from concurrent.futures import as_completed

        pool = self._executor()
        futures = {pool.submit(_simulate_group_task, a): item for item, a in zip(items, args)}
        for future in as_completed(futures):
            yield futures[future], future.result()

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: the parent may run a progress bar's thread, which fork would copy mid-flight
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def imitate(self, engine: str) -> None:
        """Simulate imitating `engine` (the records'): refused once it has simulated another."""
        if self.imitates not in (None, engine) and self.cache:
            raise ValueError(f"this simulator imitated {self.imitates}; the records are {engine}'s")
        self.imitates = engine

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> RecordSimulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def imitation_of(records: Iterable[RunRecord]) -> str:
    """The engine (setup) the embedded engine imitates to predict these records (their
    `config.engine`'s, `engines.imitation_for`); ValueError for records of engines it would imitate
    differently (calibrate them apart)."""
    found = sorted({imitation_for(r.config.engine) for r in records})
    if len(found) > 1:
        raise ValueError(f"records of engines scheduled differently ({', '.join(found)}): calibrate them apart")
    return found[0] if found else DEFAULT_ENGINE


def _imitate_records(simulate: Simulator | None, records: Sequence[RunRecord]) -> None:
    """Tell a simulator that can imitate engines (a `RecordSimulator`) the records' engine."""
    imitate = getattr(simulate, "imitate", None)
    if imitate is not None:
        imitate(imitation_of(records))


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
    free = free_for(base, _check_free(free, frozenset(BOUNDS)))
    step_free = tuple(n for n in free if n in GPU_PARAMS)
    loop_free = tuple(n for n in free if n not in GPU_PARAMS)
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
    chosen, simulations, start_note = _fit_from_starts(base, setup)
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
                       held_host)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} %"


def label_worse(profile: Profile, worse: Sequence[tuple[str, float, float]], n_held: int) -> Profile:
    """The profile labelled as a fit worse than its base (written only under --force)."""
    what = "; ".join(f"{m} MAPE {f:.1f} % vs {b:.1f} % with the base" for m, f, b in worse)
    note = (f"WORSE THAN THE BASE PROFILE on the {n_held} held-out configurations ({what}); written because "
            f"--force was given. " + profile.calibration_note)
    return profile.model_copy(update={"calibration": "calibrated-worse-than-base", "calibration_note": note})


# -- the fit against its starting profile, on the held-out configurations ----------------------------

def held_out_check(cal: Calibration, tolerance: float = 1.0) -> CalibrationCheck:
    """Score the starting profile and the fitted one on the held-out configurations, per quantity of
    the held-out table (`GUARDED`), and name those the fit predicts worse by more than `tolerance`
    points of MAPE, the worst first (`held_out` 0: nothing was held out or predicted, nothing checked)."""
    return check_reports(cal.base.name, len(cal.held_keys), cal.held_base, cal.held_fitted, tolerance)


def check_reports(base_name: str, n_held: int, held_base: HoldoutReport | None, held_fitted: HoldoutReport | None,
                  tolerance: float = 1.0) -> CalibrationCheck:
    """`held_out_check` from the two held-out reports themselves."""
    if held_base is None or held_fitted is None or not n_held:
        return CalibrationCheck(base_profile=base_name, held_out=0, tolerance=tolerance)
    worse = sorted(worse_than_base(held_base, held_fitted, tolerance=tolerance), key=lambda w: w[2] - w[1])
    return CalibrationCheck(
        base_profile=base_name, held_out=n_held, tolerance=tolerance,
        mape_fitted={m: _rounded(held_fitted.metric_mape(m)) for m in GUARDED},
        mape_base={m: _rounded(held_base.metric_mape(m)) for m in GUARDED},
        worse=[m for m, _, _ in worse])


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def worse_of(check: CalibrationCheck) -> list[tuple[str, float, float]]:
    """(quantity, fitted MAPE %, base MAPE %) of each quantity the check found worse, in its order."""
    return [(m, float(check.mape_fitted[m] or 0.0), float(check.mape_base[m] or 0.0)) for m in check.worse]


def refusal(check: CalibrationCheck, *, out: object = None) -> FitWorseThanBase:
    """The one-line error of a fit worse than its base: the worst quantity and both errors."""
    worse = worse_of(check)
    metric, f, b = worse[0]
    digits = 1 if round(f, 1) != round(b, 1) else 3
    more = f" (and {', '.join(METRIC_LABELS[m] for m, _, _ in worse[1:])})" if len(worse) > 1 else ""
    return FitWorseThanBase(
        f"the fit predicts the {check.held_out} held-out configurations worse than the base profile "
        f"{check.base_profile} (by more than --tolerance {check.tolerance:g} points): {METRIC_LABELS[metric]} "
        f"MAPE {f:.{digits}f} % vs {b:.{digits}f} %{more}; "
        + ("profile not written" if out is not None else "nothing to write")
        + " (--force writes it, labelled calibrated-worse-than-base)")


def forced_warning(check: CalibrationCheck) -> str:
    """What `sim calibrate --force` says when it writes a fit worse than its base."""
    what = "; ".join(f"{METRIC_LABELS[m]} MAPE {f:.1f} % vs {b:.1f} %" for m, f, b in worse_of(check))
    return (f"WRITTEN UNDER --force: the fit predicts the {check.held_out} held-out configurations worse than the "
            f"base profile {check.base_profile} ({what}); the profile says so (calibration: "
            "calibrated-worse-than-base, calibration_check.forced)")


def profile_to_write(profile: Profile, check: CalibrationCheck, *, force: bool = False) -> Profile:
    """The fitted profile (`Calibration.profile`) as `sim calibrate` writes it, its `calibration_check`
    recorded. A fit the check found worse than its base is refused (`FitWorseThanBase`, `refusal`) unless
    `force`, and then labelled `calibrated-worse-than-base` with `calibration_check.forced`."""
    if check.worse and not force:
        raise refusal(check, out=True)
    if check.worse:
        profile = label_worse(profile, worse_of(check), check.held_out)
        check = check.model_copy(update={"forced": True})
    return profile.model_copy(update={"calibration_check": check})


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
