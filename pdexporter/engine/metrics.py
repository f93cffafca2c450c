"""The engine's /metrics, parsed purely, under names that survive vLLM version changes.

vLLM renames series between releases (`gpu_cache_usage_perc` became `kv_cache_usage_perc`,
`time_per_output_token_seconds` became `inter_token_latency_seconds`), so everything downstream
reads *canonical* names, and the engine's adapter maps each to the names it has used, newest
first (`engines.vllm.METRIC_ALIASES`; `ALIASES` here is that table, the default).
Values are summed over label sets (engines, models, finish reasons), which is what a single-model
deployment means by "the" value.

What can and cannot be trusted (see docs/vllm-facts.md): `iteration_tokens` records a whole
prompt in the step where its first token comes out, so it cannot verify chunking; the engine's
iteration-detail log can (`engine.iterlog`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from collections.abc import Mapping

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from pdexporter.engines._registry import MetricKind
from pdexporter.engines.vllm import METRIC_ALIASES as VLLM_METRIC_ALIASES
from pdexporter.engines.vllm import OPTIONAL_METRICS
from pdexporter.errors import EngineError

__all__ = [
    "ALIASES", "GAUGES", "MetricsSnapshot", "known_lines", "metric_deltas", "parse_exposition",
    "snapshot_from_families",
]

# canonical name -> (kind, the engine's names): vLLM's table lives in its adapter (engines.vllm).
ALIASES: Mapping[str, tuple[MetricKind, tuple[str, ...]]] = VLLM_METRIC_ALIASES

GAUGES = tuple(name for name, (kind, _) in ALIASES.items() if kind == "gauge")


@dataclass(frozen=True)
class MetricsSnapshot:
    """Canonical values at one instant. Histograms appear as `<name>_count` and `<name>_sum`."""

    values: dict[str, float]
    buckets: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # canonical -> engine's own name
    model_names: tuple[str, ...] = ()
    t_ns: int | None = None

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    @property
    def missing(self) -> tuple[str, ...]:
        """Series every engine exports that this scrape lacks (connector-only ones excepted)."""
        return tuple(name for name in ALIASES if name not in self.sources and name not in OPTIONAL_METRICS)


# Every engine-side name some canonical series may have: the only families a snapshot keeps.
_KNOWN_PREFIXES = tuple(sorted({name for _, names in ALIASES.values() for name in names}))


def known_lines(text: str) -> str:
    """The exposition cut to the families `ALIASES` names (their samples and # HELP/# TYPE lines).

    A snapshot ignores every other series, so it is the same from either text; parsing only these
    lines takes a tenth of the time on vLLM's ~55 KB /metrics (hundreds of histogram buckets
    pdexporter never reads), and a sweep parses it twice per window."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2].startswith(_KNOWN_PREFIXES):
                kept.append(line)
        elif line.startswith(_KNOWN_PREFIXES):
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_exposition(text: str, *, t_ns: int | None = None, source: str = "/metrics") -> MetricsSnapshot:
    """Parse Prometheus text exposition into canonical values; unknown series are ignored. A text
    without one line of the known families is parsed whole, so that one that is not an exposition
    at all (garbage, an HTML page) fails as it should, and not as an empty snapshot."""
    known = known_lines(text)
    families = text_string_to_metric_families(known if known.strip() or not text.strip() else text)
    return snapshot_from_families(families, t_ns=t_ns, source=source)


def snapshot_from_families(
    families: Iterable[Metric], *, t_ns: int | None = None, source: str = "/metrics"
) -> MetricsSnapshot:
    """Canonical values from metric families: parsed text, or a prometheus_client registry's
    `collect()` in-process (the embedded engine skips rendering and re-parsing its own text)."""
    by_sample: dict[str, float] = {}
    bucket_acc: dict[str, dict[float, float]] = {}
    models: set[str] = set()
    try:
        for family in families:
            for sample in family.samples:
                value = float(sample.value)
                if math.isnan(value):
                    continue
                by_sample[sample.name] = by_sample.get(sample.name, 0.0) + value
                if sample.name.endswith("_bucket") and "le" in sample.labels:
                    le = float(sample.labels["le"])
                    per = bucket_acc.setdefault(sample.name[: -len("_bucket")], {})
                    per[le] = per.get(le, 0.0) + value
                if "model_name" in sample.labels:
                    models.add(sample.labels["model_name"])
    except (ValueError, TypeError, IndexError) as exc:
        raise EngineError(f"{source}: not a Prometheus text exposition ({exc})") from exc

    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    buckets: dict[str, tuple[tuple[float, float], ...]] = {}
    for canonical, (kind, names) in ALIASES.items():
        for name in names:
            if kind == "histogram":
                if f"{name}_count" in by_sample:
                    values[f"{canonical}_count"] = by_sample[f"{name}_count"]
                    values[f"{canonical}_sum"] = by_sample.get(f"{name}_sum", 0.0)
                    buckets[canonical] = tuple(sorted(bucket_acc.get(name, {}).items()))
                    sources[canonical] = name
                    break
            elif name in by_sample:
                values[canonical] = by_sample[name]
                sources[canonical] = name
                break
    return MetricsSnapshot(values, buckets, sources, tuple(sorted(models)), t_ns)


def metric_deltas(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, float]:
    """What happened between two scrapes: counter and histogram deltas, gauges as read after.

    A counter that went down means the engine restarted in between; the delta is then
    meaningless and is left out rather than reported as negative.
    """
    out: dict[str, float] = {}
    for key, value in after.values.items():
        base = key.removesuffix("_count").removesuffix("_sum")
        kind = ALIASES.get(base, ALIASES.get(key, ("gauge", ())))[0]
        if kind == "gauge":
            out[key] = value
            continue
        previous = before.values.get(key)
        if previous is None or value < previous:
            continue
        out[f"{key}_delta"] = value - previous
    return out
