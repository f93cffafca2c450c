"""Step observations taken from records (or from docs/vllm-facts.md) and stage 1, the GPU's step-time
parameters fitted on them in closed form (the package docstring says which steps and why)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pdexporter.engines import DEFAULT_ENGINE, adapter
from pdexporter.measure.records import RunRecord
from pdexporter.predict.calibrate.params import STEP_FREE, STEP_PARAMS, Key, _check_free, _start
from pdexporter.sim.profile import Profile, StepTimeParams
from pdexporter.sim.steptime import PIECEWISE, StepArrays, StepComposition, StepTimeModel

__all__ = [
    "FitResult",
    "FloorGroup",
    "ObservationSet",
    "PiecewiseFloor",
    "StepData",
    "StepObservation",
    "chunk_sizes",
    "fit_step_params",
    "mixed_composition",
    "observations_from_record",
    "observations_from_records",
    "piecewise_floor",
    "step_errors",
    "step_summary",
    "vllm_facts_observations",
]


# A one-step prompt's step beside decodes. Stage 1 fits it only where the model runs it as a piecewise graph
# (`StepData`): an eager one's interval is its own launch, which the host's level sets (stage 2 fits it by
# simulation), while a piecewise one is the GPU's (the only step that shows `piecewise_gpu_ms` on default flags).
FIRST = "first"


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
        if len(chunks) == 1 and beside:  # a one-step prompt: kept by StepData where it runs a piecewise graph
            after = StepComposition.of([(1, inject_ctx + 1)] * beside + [(1, p)], beside + 1)
            out.observations.append(StepObservation(comps[0], slow[0] / 1e3, FIRST, key,
                                                    f"B={b} D={d} P={p} one step", next_composition=after))
    return out


def observations_from_records(records: Iterable[RunRecord]) -> ObservationSet:
    out = ObservationSet()
    for record in records:
        observations_from_record(record, out)
    return out


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
        models: dict[int | None, StepTimeModel] = {}

        def model_for(b: int | None) -> StepTimeModel:
            if b not in models:
                models[b] = StepTimeModel(profile, max_num_batched_tokens=b)
            return models[b]

        def mode(o: StepObservation) -> str:
            return model_for(o.key[0] if o.key is not None else None).graph_mode(o.composition)

        self.observations = [o for o in observations if o.kind != FIRST or mode(o) == PIECEWISE]
        self.piecewise = any(mode(o) == PIECEWISE for o in self.observations)
        self.targets = np.array([o.seconds for o in self.observations], dtype=float)
        self.kinds = np.array([o.kind for o in self.observations])
        by_chunk: dict[int | None, list[int]] = defaultdict(list)
        for i, o in enumerate(self.observations):
            by_chunk[o.key[0] if o.key is not None else None].append(i)
        self._groups: list[tuple[int | None, np.ndarray, StepArrays, StepArrays]] = []
        for b, idx in sorted(by_chunk.items(), key=lambda kv: kv[0] or 0):
            model = model_for(b)
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


# A launch floor (Qwen3-4B on an H100, results/h100-vllm0.22-qwen3-4b/RUN.md): one-step prompts that run a piecewise
# graph beside the same decodes take the same time over a span of prompt lengths whose GPU work grows several-fold.
FLOOR_SPAN = 8.0  # the prompts' longest over shortest, at least
FLOOR_FLAT = 1.25  # their medians' largest over smallest, at most
FLOOR_WORK = 2.0  # the modelled GPU work's growth over the span, at least


class FloorGroup(NamedTuple):
    """One (B, D) whose one-step piecewise prompts are flat: their span of prompt lengths and how many steps."""

    B: int
    D: int
    P_from: int
    P_to: int
    steps: int


@dataclass(frozen=True)
class PiecewiseFloor:
    """One-step piecewise prompts whose interval does not grow with their tokens: a launch floor."""

    ms: float  # the median interval of the flat prompts (over every group that shows one)
    groups: tuple[FloorGroup, ...]

    def describe(self) -> str:
        where = "; ".join(f"B={b} D={d} P {lo}-{hi} ({n} steps)" for b, d, lo, hi, n in self.groups)
        return (f"one-step piecewise prompts flat at {self.ms:.1f} ms while their GPU work grows ({where}): a launch "
                f"floor, fitted as launch_piecewise_ms from there, not as an added GPU wait (piecewise_gpu_ms)")


def piecewise_floor(profile: Profile, observations: Sequence[StepObservation]) -> PiecewiseFloor | None:
    """The launch floor the one-step piecewise prompts show, or None.

    Per (B, D): the piecewise one-step prompts (`FIRST`) by prompt length, from the shortest up while the
    median intervals stay within `FLOOR_FLAT` of each other; a floor where that run spans `FLOOR_SPAN` in
    tokens and the profile's GPU time (without a piecewise wait) grows `FLOOR_WORK`-fold over it. An added
    GPU wait cannot fit such steps (it grows with the work); a launch the step cannot end before can."""
    model_params = profile.step_time.model_copy(update={"piecewise_gpu_ms": 0.0})
    by_group: dict[tuple[int, int], dict[int, list[StepObservation]]] = defaultdict(lambda: defaultdict(list))
    models: dict[int, StepTimeModel] = {}
    for o in observations:
        if o.kind != FIRST or o.key is None:
            continue
        b, d, p = o.key
        if b not in models:  # one model per chunk size (its captured sizes), not one per observation
            models[b] = StepTimeModel(profile, model_params, max_num_batched_tokens=b)
        if models[b].graph_mode(o.composition) == PIECEWISE:
            by_group[(b, d)][p].append(o)
    found: list[tuple[FloorGroup, list[float]]] = []
    for (b, d), by_p in sorted(by_group.items()):
        lengths = sorted(by_p)
        medians = [float(np.median([o.seconds for o in by_p[p]])) for p in lengths]
        run = 1
        while run < len(lengths) and max(medians[:run + 1]) <= FLOOR_FLAT * min(medians[:run + 1]):
            run += 1
        lo, hi = lengths[0], lengths[run - 1]
        if run < 3 or hi < FLOOR_SPAN * lo:
            continue
        model = models[b]
        if model.gpu_s(by_p[hi][0].composition) < FLOOR_WORK * model.gpu_s(by_p[lo][0].composition):
            continue
        seconds = [o.seconds for p in lengths[:run] for o in by_p[p]]
        found.append((FloorGroup(b, d, lo, hi, len(seconds)), seconds))
    if not found:
        return None
    return PiecewiseFloor(float(np.median([s for _, group in found for s in group])) * 1e3,
                          tuple(g for g, _ in found))


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
    data = StepData(base, observations)
    if not data.piecewise:  # no step ran a piecewise graph: nothing shows its GPU wait
        free = tuple(name for name in free if name != "piecewise_gpu_ms")
    x0, lo, hi = _start(base, free)
    values = base.step_time.model_dump()
    weights = np.sqrt(np.array([o.weight for o in data.observations]))

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
    return FitResult(params, free, len(data.observations), mape, rms_log, max_ape, kinds, bool(solution.success),
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
