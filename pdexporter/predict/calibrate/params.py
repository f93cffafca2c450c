"""The fittable parameters: their names, bounds and groups (stage 1's GPU, stage 2's CPU, engine loop and
host), and a profile's values as the vector a fit moves (`with_values` writes one back)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pdexporter.sim.profile import EngineLoopParams, HostParams, Profile, StepTimeParams

__all__ = [
    "BOUNDS",
    "DEFAULT_FREE",
    "EXPERT_PARAMS",
    "GPU_PARAMS",
    "HOST_PARAMS",
    "Key",
    "LOOP_FREE",
    "LOOP_PARAMS",
    "SLOW_FACTOR_START",
    "STEP_FREE",
    "STEP_PARAMS",
    "TAIL_AS_DECODE_MS",
    "free_for",
    "with_values",
]

Key = tuple[int, int, int]  # (chunk_size, decode_batch_size, new_prefill_tokens)

# matmul_efficiency is not free by default: the profile takes it from a measured large GEMM
# (gpu.measured_matmul_tflops), and big chunks see dense and expert GEMMs only together.
# piecewise_gpu_ms is fitted only where the training steps include piecewise-graph steps (fit_step_params).
STEP_FREE = ("fixed_ms", "moe_efficiency", "attention_efficiency", "bandwidth_efficiency", "moe_expert_pool",
             "piecewise_gpu_ms")
LOOP_FREE = ("launch_eager_ms", "launch_piecewise_ms", "cpu_us_per_token", "request_overhead_ms",
             "admit_us_per_block", "retire_us_per_token", "idle_start_ms", "slow_factor")
DEFAULT_FREE = STEP_FREE + LOOP_FREE
LOOP_PARAMS = frozenset(EngineLoopParams.model_fields)
HOST_PARAMS = frozenset({"slow_factor"})  # the host section's (`HostParams`): fitted with the loop
PIECEWISE_GPU_START = 0.5  # ms: half what Qwen3-8B's piecewise steps waited on an H100 (session 31)
SLOW_FACTOR_START = 1.6  # the H200 machine's slow episodes: ~80 ms launch-bound steps against ~50
# a last "chunk step" this short is a few-token tail that ran as a plain decode step: the cadence may not
# see it (the engine then puts 0 ms there), so it is not fitted
TAIL_AS_DECODE_MS = 5.0
BOUNDS: dict[str, tuple[float, float]] = {
    "fixed_ms": (0.0, 50.0),
    "piecewise_gpu_ms": (0.0, 20.0),
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
                        "bandwidth_efficiency", "moe_expert_pool", "roofline_sharpness", "piecewise_gpu_ms"})
STEP_PARAMS = GPU_PARAMS  # what fit_step_params may fit


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
    if name == "piecewise_gpu_ms" and v <= 0.0:
        v = PIECEWISE_GPU_START  # never fitted: the prior would hold a zero start at zero
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
