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

The package, by concern (each module imports only those before it; `check` reads `fit.Calibration`
for its types only):
- `params`: the fittable parameters, their bounds and groups, a profile's values as a vector;
- `observations`: step observations from records, stage 1 (`fit_step_params`);
- `holdout`: a record's figures, measured against predicted (`compare_records`, `HoldoutReport`);
- `simulate`: the protocol on the embedded engine (`Simulator`, `RecordSimulator`);
- `loop`: stage 2 (`fit_loop_params`) and the host's two speeds (`classify_host`);
- `fit`: one calibration end to end (`calibrate`, `Calibration`);
- `check`: the fit against its base on the held-out configurations, what is written (`profile_to_write`);
- `generalise`: leave one chunk size or one D out (`generalisation`), decode steps off the grid (`decode_table`).
"""

from __future__ import annotations

from pdexporter.predict.calibrate.check import (
    FitWorseThanBase,
    check_reports,
    forced_warning,
    held_out_check,
    label_worse,
    profile_to_write,
    refusal,
    worse_of,
)
from pdexporter.predict.calibrate.fit import (
    STAGE1_UNITS,
    Calibration,
    Progress,
    calibrate,
)
from pdexporter.predict.calibrate.generalise import (
    BETWEEN_GRID_D,
    KNOWN_DECODE_MS,
    Generalisation,
    GroupResult,
    decode_table,
    generalisation,
)
from pdexporter.predict.calibrate.holdout import (
    GUARDED,
    HEADLINE,
    KINDS,
    METRIC_FIELDS,
    METRIC_LABELS,
    METRICS,
    RESOLVED,
    HoldoutReport,
    PointError,
    PointFigures,
    compare_records,
    figures_of,
    kind_of,
    last_chunk_step_ms,
    penalty_resolved,
    split_holdout,
    worse_than_base,
)
from pdexporter.predict.calibrate.loop import (
    LoopFitResult,
    classify_host,
    fit_loop_params,
    host_sensitive,
    host_states,
    predict_on_hosts,
    record_residuals,
    residual_keys,
)
from pdexporter.predict.calibrate.observations import (
    FitResult,
    ObservationSet,
    PiecewiseFloor,
    StepData,
    StepObservation,
    chunk_sizes,
    fit_step_params,
    mixed_composition,
    observations_from_record,
    observations_from_records,
    piecewise_floor,
    step_errors,
    step_summary,
    vllm_facts_observations,
)
from pdexporter.predict.calibrate.params import (
    BOUNDS,
    DEFAULT_FREE,
    EXPERT_PARAMS,
    GPU_PARAMS,
    HOST_PARAMS,
    LOOP_FREE,
    LOOP_PARAMS,
    SLOW_FACTOR_START,
    STEP_FREE,
    STEP_PARAMS,
    TAIL_AS_DECODE_MS,
    Key,
    free_for,
    with_values,
)
from pdexporter.predict.calibrate.simulate import (
    Group,
    RecordSimulator,
    Simulator,
    imitation_of,
    profile_fingerprint,
    simulate_group,
)

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
    "PiecewiseFloor",
    "PointError",
    "PointFigures",
    "Progress",
    "RESOLVED",
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
    "penalty_resolved",
    "piecewise_floor",
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
