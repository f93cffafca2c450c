"""The families of an imitated engine's series (`vllm_metrics.VllmMetrics`,
`sglang_metrics.SglangMetrics`): kept by name, read in-process or as a scrape's text."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

__all__ = ["MetricFamilies"]

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
