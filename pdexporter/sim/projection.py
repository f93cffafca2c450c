"""What a projection carries from calibrated profiles to a model nobody measured, part by part (issue 36).

`sim profile-from-config` once carried one calibrated profile's step-time parameters to any model,
so a dense model got the efficiencies an MoE model was fitted to, and its launch costs scaled by
layer count. The parameters do not all mean the same thing from one model to another:

- `matmul_efficiency`, the dense GEMMs and what runs beside them in their layer (norms, activation,
  rotary): the mean of the calibrated **dense** references (fitted: `sim calibrate` frees it on a
  dense model). An MoE reference's own `matmul_efficiency` is a measured GEMM's (790 of 989 TFLOPS
  on the H200), never fitted: its dense and expert GEMMs are seen only together, and a kernel
  benchmark is not a model's layer. So without a dense reference the MoE data bound it only: at
  most the measured GEMM's, at least the **weight efficiency** the MoE references reached over all
  their GEMMs (`weight_efficiency`: FLOP-weighted harmonic mean of their dense and expert
  efficiencies, the experts' routing and permutation included: 0.53 for the H200 profile); a dense
  target takes the middle (0.66 on the H200); the dense calibrations since fitted 0.675
  (Llama-3.1-8B) and 0.664 (Qwen2.5-32B).
- `moe_efficiency`, the fused-MoE grouped GEMMs, routing and permutation included: the mean of the
  calibrated MoE references; without one, the expert efficiency that gives the target the dense
  references' weight efficiency.
- `bandwidth_efficiency`, weights and KV streamed from HBM: the references of the target's kind
  (dense: big contiguous matrices; MoE: the experts a step touches), else all.
- `attention_efficiency`, FlashAttention's prefill kernel: every reference's (the same kernel,
  whatever the MLP).
- `fixed_ms`, per-step GPU overhead (kernels, so layers): a cost per dense layer and per MoE layer,
  least squares over the references (`per_layer_costs`); with references of one kind of layer only,
  one cost per layer whatever its kind (the old rule: scaled by layers).
- `launch_eager_ms`, `launch_piecewise_ms`, the CPU launching a step's kernels: a cost per step plus
  one per dense layer and one per MoE layer (`step_and_layer_costs`: non-negative least squares over
  [1, dense layers, MoE layers]) where the references determine the three (three or more references,
  two dense ones of different depths among them); else per layer as `fixed_ms` (the MoE and Llama
  profiles of `REFERENCES` alone: unchanged). The three dense calibrations' launches do not scale
  with the layers (at each one's mean host level 29.2 ms at 32 layers, 37.8 at 40, 46.3 at 64), and
  leaving one model out the constant took the 14B's penalty from 19.8 to 16.6 % (docs/sim.md). The
  launches are read at each reference's mean host level and the target's put back at the nominal
  level of the host it carries (`host_level`): a calibration places its nominal host where its fit
  found the fast level or the common one.
- the engine loop's two latencies, `idle_start_ms` and `request_overhead_ms` (the engine core
  waking for a lone request, the front end): the mean of the references of the target's kind (dense
  / MoE), else the first reference's. The MoE profile's idle start is 9.46 ms, the dense fits' 0.30
  (14B) and 2.41 (32B); carried to the 14B it projected its prefill alone at P = 512 +35 %.
- the rest (`cpu_us_per_token`, the roofline, the P/D figures; the engine loop's CPU costs per block
  and per token, `admit_us_per_block`, `retire_us_per_token`, which the host's slow level scales; the
  host): the first reference's. Those two CPU costs from the references of its kind were worse
  leaving one model out (the Llama's prefill duration 5.8 -> 7.6 %).

With the MoE profile alone (what the project had before the dense run) a dense target differs from
the old projection only in `matmul_efficiency`; with a calibrated dense profile among the references
every row above learns from it. `REFERENCES` are the shipped calibrated vLLM profiles a projection
uses by default (those still `projected` are skipped); the calibrated Qwen2.5-32B profile is not among
them: leaving one model out, learning from more models was not better where it could be measured
(docs/sim.md, "Its error on a model not used to build it"). Pure: profiles in, numbers and provenance out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pdexporter.sim.profile import HostParams, ModelSpec, Profile

__all__ = [
    "LAYER_COSTS",
    "REFERENCES",
    "Projection",
    "calibrated",
    "engine_loop_latencies",
    "host_level",
    "per_layer_costs",
    "project_step_time",
    "step_and_layer_costs",
    "weight_efficiency",
]

# the shipped calibrated profiles of vLLM a projection learns from, the first one's host and engine loop carried
# (not h200-qwen2.5-32b-instruct: module docs)
REFERENCES = ("h200-qwen3-coder-30b-a3b", "h200-llama-3.1-8b-instruct")
LAYER_COSTS = ("fixed_ms", "launch_eager_ms", "launch_piecewise_ms")
STEP_COSTS = ("launch_eager_ms", "launch_piecewise_ms")  # a cost per step besides the layers' (module docs)
LOOP_LATENCIES = ("idle_start_ms", "request_overhead_ms")  # from the references of the target's kind


def calibrated(profile: Profile) -> bool:
    return profile.calibration == "calibrated"


def _dense_flops(model: ModelSpec) -> float:
    return float(model.dense_params)


def _expert_flops(model: ModelSpec) -> float:
    return float(model.moe_layers * model.experts_per_token * model.expert_params)


def weight_efficiency(profile: Profile) -> float:
    """The fraction of peak a profile's weights run at over all their GEMMs: the FLOP-weighted harmonic
    mean of its dense (`matmul_efficiency`) and expert (`moe_efficiency`) GEMMs' efficiencies."""
    st, m = profile.step_time, profile.model
    fd, fm = _dense_flops(m), _expert_flops(m)
    return (fd + fm) / (fd / st.matmul_efficiency + fm / st.moe_efficiency)


def host_level(profile: Profile, name: str) -> float:
    """What a CPU figure of `profile` (`HostParams.CPU_STEP`) is multiplied by to read it at the mean
    host level of its calibration's sweep: 1 + slow_fraction x (slow_factor - 1); 1 for a GPU figure.
    A calibration puts its nominal host at the level its fit started nearest (`predict.calibrate`):
    one profile's nominal launch can be a fast episode's and another's the common level, so the
    references are compared at their mean."""
    if name not in HostParams.CPU_STEP:
        return 1.0
    return 1.0 + profile.host.slow_fraction * (profile.host.slow_factor - 1.0)


def per_layer_costs(refs: Sequence[Profile], name: str) -> tuple[float, float, str]:
    """(cost per dense layer, cost per MoE layer, how) of a layer-scaled parameter over the references."""
    rows = np.array([[p.model.num_layers - p.model.moe_layers, p.model.moe_layers] for p in refs], dtype=float)
    values = np.array([getattr(p.step_time, name) * host_level(p, name) for p in refs], dtype=float)
    if np.linalg.matrix_rank(rows) >= 2:
        from scipy.optimize import nnls

        (dense, moe), _ = nnls(rows, values)
        return float(dense), float(moe), "per dense layer and per MoE layer (least squares over the references)"
    per_layer = float(np.mean(values / rows.sum(axis=1)))
    return per_layer, per_layer, "per layer, whatever its kind (the references have one kind of layer)"


def step_and_layer_costs(refs: Sequence[Profile], name: str) -> tuple[float, float, float, str]:
    """(cost per step, per dense layer, per MoE layer, how) of a launch over the references, read at each
    one's mean host level: non-negative least squares over [1, dense layers, MoE layers] where the
    references determine the three (rank 3), else no constant and `per_layer_costs`."""
    rows = np.array([[1.0, p.model.num_layers - p.model.moe_layers, p.model.moe_layers] for p in refs], dtype=float)
    if np.linalg.matrix_rank(rows) >= 3:
        from scipy.optimize import nnls

        values = np.array([getattr(p.step_time, name) * host_level(p, name) for p in refs], dtype=float)
        (step, dense, moe), _ = nnls(rows, values)
        return float(step), float(dense), float(moe), ("a cost per step, per dense layer and per MoE layer "
                                                       "(non-negative least squares over the references)")
    dense, moe, how = per_layer_costs(refs, name)
    return 0.0, dense, moe, how


def engine_loop_latencies(model: ModelSpec, refs: Sequence[Profile]) -> tuple[dict[str, float], str]:
    """`idle_start_ms` and `request_overhead_ms` of `model`: the mean of the references of its kind (dense /
    MoE), else the first reference's (module docs)."""
    same = [p for p in refs if p.model.is_moe == model.is_moe] or list(refs[:1])
    values = {n: float(np.mean([getattr(p.engine_loop, n) for p in same])) for n in LOOP_LATENCIES}
    return values, ("idle_start_ms, request_overhead_ms: the references of its kind (" + ", ".join(p.name for p in same)
                    + ")")


@dataclass(frozen=True)
class Projection:
    values: dict[str, float]  # step_time parameters
    provenance: str  # one line per rule, for the profile's provenance
    engine_loop: dict[str, float] = field(default_factory=dict)  # engine_loop parameters learnt (the rest carried)
    engine_loop_provenance: str = ""


def project_step_time(model: ModelSpec, refs: Sequence[Profile], *, measured_gemm_efficiency: float | None
                      ) -> Projection:
    """The step-time parameters of `model` learnt from the calibrated reference profiles (module docs)."""
    if not refs:
        raise ValueError("a projection needs at least one reference profile")
    dense_refs = [p for p in refs if not p.model.is_moe and calibrated(p)]
    moe_refs = [p for p in refs if p.model.is_moe]
    names = ", ".join(p.name for p in refs)
    how: list[str] = [f"learnt from {names}"]
    values: dict[str, float] = {}
    gemm = measured_gemm_efficiency or refs[0].step_time.matmul_efficiency
    if not model.is_moe:
        if dense_refs:
            values["matmul_efficiency"] = float(np.mean([p.step_time.matmul_efficiency for p in dense_refs]))
            how.append("matmul_efficiency: the calibrated dense references' (" + ", ".join(p.name for p in dense_refs)
                       + ")")
        else:
            low = float(np.mean([weight_efficiency(p) for p in moe_refs or refs]))
            values["matmul_efficiency"] = (low + gemm) / 2
            how.append(f"matmul_efficiency: no calibrated dense reference, midway between the MoE references' weight "
                       f"efficiency over all their GEMMs ({low:.3f}, routing included) and the measured GEMM's "
                       f"({gemm:.3f}) HYPOTHESIS")
        values["moe_efficiency"] = float(np.mean([p.step_time.moe_efficiency for p in refs]))
    else:
        values["matmul_efficiency"] = gemm
        if moe_refs:
            values["moe_efficiency"] = float(np.mean([p.step_time.moe_efficiency for p in moe_refs]))
            how.append("matmul_efficiency from the measured GEMM, moe_efficiency the MoE references'")
        else:
            target = float(np.mean([p.step_time.matmul_efficiency for p in dense_refs or refs]))
            fd, fm = _dense_flops(model), _expert_flops(model)
            rest = (fd + fm) / target - fd / gemm
            values["moe_efficiency"] = float(min(1.0, max(0.05, fm / rest))) if rest > 0 else target
            how.append("moe_efficiency: no MoE reference, the dense references' weight efficiency over all GEMMs "
                       "HYPOTHESIS")
    same = [p for p in refs if p.model.is_moe == model.is_moe]
    values["bandwidth_efficiency"] = float(np.mean([p.step_time.bandwidth_efficiency for p in same or refs]))
    how.append("bandwidth_efficiency: the " + ("references of its kind (dense / MoE)" if same else "references'"))
    values["attention_efficiency"] = float(np.mean([p.step_time.attention_efficiency for p in refs]))
    how.append("attention_efficiency: every reference's (the same kernel)")
    dense_layers = model.num_layers - model.moe_layers
    rules: dict[str, str] = {}
    for name in LAYER_COSTS:
        if name in STEP_COSTS:
            per_step, per_dense, per_moe, rules[name] = step_and_layer_costs(refs, name)
        else:
            (per_dense, per_moe, rules[name]), per_step = per_layer_costs(refs, name), 0.0
        # at the mean host level, back to the nominal one of the host the target carries (the first reference's)
        values[name] = (per_step + per_dense * dense_layers + per_moe * model.moe_layers) / host_level(refs[0], name)
    for rule in dict.fromkeys(rules.values()):
        names = ", ".join(n for n in LAYER_COSTS if rules[n] == rule)
        how.append(f"{names}: {rule}, x {dense_layers} dense + {model.moe_layers} MoE layers")
    how.append("(the launches at each reference's mean host level, then at the nominal level of the host carried)")
    loop, loop_how = engine_loop_latencies(model, refs)
    return Projection(values, "; ".join(how), loop, loop_how)
