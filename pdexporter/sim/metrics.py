"""The series the embedded engine keeps: those of the engine it imitates (`vllm_metrics.VllmMetrics`,
`sglang_metrics.SglangMetrics`), chosen here once for the server and the in-process driver."""

from __future__ import annotations

from typing import Any

from pdexporter.sim.profile import Profile

__all__ = ["sim_metrics"]


def sim_metrics(
    profile: Profile,
    imitates: str,
    *,
    max_num_batched_tokens: int,
    cache_config: dict[str, str] | None = None,
    decode_log_interval: int = 1,
) -> Any:
    """The imitated engine's series for an embedded engine (`VllmMetrics` or `SglangMetrics`)."""
    from pdexporter.sim.imitation import imitation

    return imitation(imitates).metrics(profile, cache_config=cache_config, decode_log_interval=decode_log_interval)
