"""pdexporter's embedded engine: vLLM v1's scheduling (or SGLang's) and a step-time model of a GPU, no GPU needed.

Its numbers are a model, never a measurement; everything it serves says so (`modelled`).

- `scheduler` (pure): vLLM 0.22's scheduler, KV blocks and prefix cache; `sglang_scheduler` (pure):
  SGLang 0.5.15's batch policy on the same blocks (`sim serve --engine sglang [--enable-mixed-chunk]`).
- `steptime` (pure): a step's GPU time and engine-core CPU time from its composition and a
  profile (`profiles/*.yaml`).
- `engine`: the two on a clock (real, virtual or manual), as vLLM's busy loop runs them (launch of
  step N+1 beside step N on the GPU, per-request admission and retirement), with the imitated
  engine's metrics (`vllm_metrics`, `sglang_metrics`) and step log.
- `server`: the imitated engine's OpenAI-compatible HTTP API on top (`pdexporter sim serve`).

What runs a measurement on it lives above it: `measure.sim_driver` (the protocol's driver without
HTTP) and `predict` (virtual-time grids, calibration to measured records, passive mode in process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdexporter.sim.profile import Profile

__all__ = [
    "ENGINE_KIND", "SGLANG_VERSION", "engine_version",
]

ENGINE_KIND = "pdexporter-sim"
SGLANG_VERSION = "0.5.15.post1"  # the SGLang release whose scheduling, metrics and log it imitates


def engine_version(profile: Profile, imitates: str | None = None) -> str:
    """The version of the engine it imitates (`imitation.IMITATIONS`; None: the default), with a
    local label naming the embedded engine (PEP 440)."""
    from pdexporter.sim.imitation import DEFAULT_IMITATION, imitation

    return imitation(imitates or DEFAULT_IMITATION).version(profile)
