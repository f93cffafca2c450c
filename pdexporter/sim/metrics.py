"""The series the embedded engine keeps: those of the engine it imitates (`vllm_metrics.VllmMetrics`,
`sglang_metrics.SglangMetrics`), chosen here once for the server and the in-process driver."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

from pdexporter.sim.profile import Profile

__all__ = ["MetricFamilies", "sim_metrics"]

M = TypeVar("M", bound=MetricWrapperBase)


class MetricFamilies:
    """An imitated engine's series: its registry and each family by name, read in-process
    (`collect`) or as the text a scrape gets (`exposition`)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.families: dict[str, MetricWrapperBase] = {}

    def keep(self, metric: M) -> M:
        self.families[metric._name] = metric
        return metric

    def collect(self, names: Iterable[str] | None = None) -> Iterator[Metric]:
        """The families named (sample base names as in the text, `_total` or not), in-process."""
        wanted = None if names is None else {n for name in names for n in (name, name.removesuffix("_total"))}
        for name, metric in self.families.items():
            if wanted is None or name in wanted:
                yield from metric.collect()

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


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
