"""The engine's /metrics, parsed purely, under names that survive engines and their versions.

Engines name the same quantity differently (`vllm:num_requests_running`, `sglang:num_running_reqs`)
and rename series between releases (vLLM's `gpu_cache_usage_perc` became `kv_cache_usage_perc`),
so everything downstream reads *canonical* names (`engines.METRIC_KINDS`), and the engine's
adapter maps each to the names it has used, newest first (`EngineAdapter.metric_aliases`): every
parse is told whose exposition it reads. Values are summed over label sets (engines, models,
finish reasons), which is what a single-model deployment means by "the" value.

What can and cannot be trusted (see docs/vllm-facts.md): `iteration_tokens` records a whole
prompt in the step where its first token comes out, so it cannot verify chunking; the engine's
iteration-detail log can (`client.iterlog`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from pdexporter.engines import METRIC_KINDS, MetricKind
from pdexporter.errors import EngineError

__all__ = [
    "MetricRules", "MetricsSnapshot", "engine_restarted", "engine_series", "known_lines", "metric_deltas",
    "parse_exposition", "snapshot_from_families",
]

# Counters every engine keeps from its start: one that falls means the engine started again.
_RESTART_COUNTERS = ("generation_tokens_total", "prompt_tokens_total", "request_success_total")


class MetricRules(Protocol):
    """The part of an engine adapter (`engines.EngineAdapter`) a /metrics parse needs."""

    @property
    def metric_aliases(self) -> Mapping[str, tuple[MetricKind, tuple[str, ...]]]: ...

    @property
    def optional_metrics(self) -> frozenset[str]: ...


def engine_series(rules: MetricRules) -> tuple[str, ...]:
    """Every engine-side name some canonical series may have: the only families a snapshot keeps."""
    return tuple(sorted({name for _, names in rules.metric_aliases.values() for name in names}))


@dataclass(frozen=True)
class MetricsSnapshot:
    """Canonical values at one instant. Histograms appear as `<name>_count` and `<name>_sum`."""

    values: dict[str, float]
    buckets: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # canonical -> engine's own name
    model_names: tuple[str, ...] = ()
    t_ns: int | None = None
    expected: tuple[str, ...] = ()  # canonical series the engine always exports (its adapter's)

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    @property
    def missing(self) -> tuple[str, ...]:
        """Series the engine always exports that this scrape lacks."""
        return tuple(name for name in self.expected if name not in self.sources)


def known_lines(text: str, rules: MetricRules) -> str:
    """The exposition cut to the families the engine's adapter names (their samples and # HELP/
    # TYPE lines).

    A snapshot ignores every other series, so it is the same from either text; parsing only these
    lines takes a tenth of the time on vLLM's ~55 KB /metrics (hundreds of histogram buckets
    pdexporter never reads), and a sweep parses it twice per window."""
    prefixes = engine_series(rules)
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2].startswith(prefixes):
                kept.append(line)
        elif line.startswith(prefixes):
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_exposition(text: str, rules: MetricRules, *, t_ns: int | None = None,
                     source: str = "/metrics") -> MetricsSnapshot:
    """Parse Prometheus text exposition into canonical values by the engine's adapter (`rules`);
    unknown series are ignored. A text without one line of the known families is parsed whole, so
    that one that is not an exposition at all (garbage, an HTML page) fails as it should, and not
    as an empty snapshot."""
    known = known_lines(text, rules)
    families = text_string_to_metric_families(known if known.strip() or not text.strip() else text)
    return snapshot_from_families(families, rules, t_ns=t_ns, source=source)


def snapshot_from_families(
    families: Iterable[Metric], rules: MetricRules, *, t_ns: int | None = None, source: str = "/metrics"
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
    aliases = rules.metric_aliases
    for canonical, (kind, names) in aliases.items():
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
    expected = tuple(name for name in aliases if name not in rules.optional_metrics)
    return MetricsSnapshot(values, buckets, sources, tuple(sorted(models)), t_ns, expected)


def engine_restarted(before: MetricsSnapshot, after: MetricsSnapshot) -> str | None:
    """Why the engine of `after` is not the process of `before` (None: no sign it restarted): its
    process start time moved (Prometheus' process collector), or a counter it keeps from its start
    fell (an engine without the collector: SGLang's multiprocess metrics)."""
    started, now = before.get("process_start_time_seconds"), after.get("process_start_time_seconds")
    if started is not None and now is not None and abs(now - started) >= 1.0:
        return f"its process start time moved from {_clock(started)} to {_clock(now)}"
    for name in _RESTART_COUNTERS:
        old, new = before.get(name), after.get(name)
        if old is not None and new is not None and new < old:
            return f"its {after.sources.get(name, name)} fell from {old:g} to {new:g}"
    return None


def _clock(epoch_s: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch_s, datetime.UTC).strftime("%H:%M:%S UTC")


def metric_deltas(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, float]:
    """What happened between two scrapes: counter and histogram deltas, gauges as read after.

    A counter that went down means the engine restarted in between; the delta is then
    meaningless and is left out rather than reported as negative.
    """
    out: dict[str, float] = {}
    for key, value in after.values.items():
        base = key.removesuffix("_count").removesuffix("_sum")
        kind = METRIC_KINDS.get(base, METRIC_KINDS.get(key, "gauge"))
        if kind == "gauge":
            out[key] = value
            continue
        previous = before.values.get(key)
        if previous is None or value < previous:
            continue
        out[f"{key}_delta"] = value - previous
    return out
