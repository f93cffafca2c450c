"""What calibration compares: a record's figures (`PointFigures`), measured against predicted per
configuration and metric (`compare_records`, `HoldoutReport`), and the held-out configurations
(`split_holdout`)."""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pdexporter.analysis.cv_causes import NEAR_ZERO
from pdexporter.engines import DEFAULT_ENGINE
from pdexporter.measure.records import RunRecord
from pdexporter.predict.calibrate.observations import chunk_sizes
from pdexporter.predict.calibrate.params import Key

__all__ = [
    "GUARDED",
    "HEADLINE",
    "KINDS",
    "METRICS",
    "METRIC_FIELDS",
    "METRIC_LABELS",
    "RESOLVED",
    "HoldoutReport",
    "PointError",
    "PointFigures",
    "compare_records",
    "figures_of",
    "kind_of",
    "last_chunk_step_ms",
    "penalty_resolved",
    "split_holdout",
    "worse_than_base",
]


def split_holdout(keys: Sequence[Key], fraction: float) -> tuple[set, set]:
    """(train, held-out) configurations; deterministic (hash of the key), about `fraction` held out."""
    if not 0 <= fraction < 1:
        raise ValueError(f"holdout fraction {fraction} must be in [0, 1)")
    ordered = sorted(set(keys), key=lambda k: hashlib.sha256(repr(k).encode()).hexdigest())
    n_out = int(round(len(ordered) * fraction))
    if fraction > 0 and n_out == 0 and len(ordered) > 1:
        n_out = 1
    held = set(ordered[:n_out])
    return set(ordered) - held, held


# -- what is compared: a record's figures ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PointFigures:
    """The figures of one record (measured or predicted) that calibration compares, medians over its
    repetitions as the record states them."""

    prefill_duration_ms: float | None
    during_p50_ms: float | None  # interference.tpot_during_prefill_p50_ms (chunk steps, token-weighted)
    during_mean_ms: float | None
    last_chunk_ms: float | None  # the last chunk step (median over repetitions): where retirement shows
    window_p50_ms: float | None
    baseline_p50_ms: float | None
    aggregate_interference_ms: float | None  # derived.aggregate_interference_ms
    penalty_p50_ms: float | None = None  # derived.tpot_penalty_p50_ms: TPOT during (token-weighted p50) - baseline
    penalty_mean_ms: float | None = None  # derived.tpot_penalty_ms: the same with the token-weighted mean (the table's)

    @classmethod
    def of(cls, record: RunRecord) -> PointFigures:
        i, d, base = record.interference, record.derived, record.baseline.tpot_p50_ms
        mean = i.tpot_during_prefill_mean_ms
        penalty = d.tpot_penalty_ms
        if penalty is None and mean is not None and base is not None and record.config.decode_batch_size:
            penalty = mean - base  # a record written before the penalty was the mean's
        return cls(i.prefill_duration_ms, i.tpot_during_prefill_p50_ms, mean, last_chunk_step_ms(record),
                   i.tpot_window_p50_ms, base, d.aggregate_interference_ms, d.tpot_penalty_p50_ms, penalty)


def last_chunk_step_ms(record: RunRecord) -> float | None:
    """Median over repetitions of the last chunk step: the interval that ends with the first token,
    where the request's retirement shows."""
    values = [
        rep.interference.chunk_step_times_ms[-1] for rep in record.reps or [] if rep.interference.chunk_step_times_ms
    ]
    return float(np.median(values)) if values else None


def figures_of(records: Iterable[RunRecord]) -> dict[Key, PointFigures]:
    return {r.key: PointFigures.of(r) for r in records}


@dataclass(frozen=True)
class PointError:
    key: Key
    measured: float
    predicted: float

    @property
    def ape(self) -> float:
        return abs(self.predicted - self.measured) / self.measured * 100 if self.measured else math.nan

    @property
    def rel(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured else math.nan


# metric -> PointFigures field
METRIC_FIELDS = {
    "baseline_tpot": "baseline_p50_ms",  # the decode step beside no prefill
    "penalty": "penalty_mean_ms",  # derived.tpot_penalty_ms: token-weighted mean of the chunk steps - baseline
    "penalty_p50": "penalty_p50_ms",  # derived.tpot_penalty_p50_ms: the same with their token-weighted p50
    "prefill_duration": "prefill_duration_ms",
    "during_tpot": "during_p50_ms",  # tpot_during_prefill_p50_ms: the chunk steps
    "aggregate_interference": "aggregate_interference_ms",
    "window_tpot": "window_p50_ms",  # tpot_window_p50_ms: every interval in the window
}
METRICS = tuple(METRIC_FIELDS)
# what generalisation and the summaries report
HEADLINE = ("baseline_tpot", "penalty", "prefill_duration", "aggregate_interference")
# what a fit must not predict worse than its base on held-out configurations: every quantity of the held-out
# table (the README's example once wrote a fit whose "TPOT over the window (p50)" went from 34.0 to 80.4 %)
GUARDED = METRICS
METRIC_LABELS = {
    "baseline_tpot": "baseline TPOT",
    "penalty": "TPOT penalty (mean)",
    "penalty_p50": "TPOT penalty (p50)",
    "prefill_duration": "prefill_duration",
    "during_tpot": "TPOT during prefill (p50)",
    "aggregate_interference": "aggregate interference",
    "window_tpot": "TPOT over the window (p50)",
}
KINDS = ("D = 0", "one small chunk (P <= 2048)", "one big chunk (P >= 4096)", "two chunks", "three or more chunks")


def kind_of(key: Key, engine: str = DEFAULT_ENGINE) -> str:
    """The kind of configuration (CALIBRATION.md's rows): how the prefill is scheduled beside D decodes."""
    b, d, p = key
    if d == 0:
        return KINDS[0]
    n = len(chunk_sizes(p, b, d, engine))
    if n == 1:
        return KINDS[1] if p <= 2048 else KINDS[2]
    return KINDS[3] if n == 2 else KINDS[4]


def penalty_resolved(decodes: int, penalty_ms: float | None, baseline_ms: float | None) -> bool:
    """A configuration whose penalty a run resolves: no decodes (a prefill alone), or a measured penalty of at least
    criterion 4's near-zero share of the decode step (`analysis.cv_causes.NEAR_ZERO`: below it the repetitions'
    spread is the step's own jitter, and a relative error of a model says nothing of it)."""
    if decodes == 0:
        return True
    return penalty_ms is not None and baseline_ms is not None and penalty_ms >= NEAR_ZERO * baseline_ms


RESOLVED = f"penalty resolved (>= {NEAR_ZERO:.0%} of the decode step, or D = 0)"


def _is_kind(kind: str, key: Key) -> bool:
    return kind_of(key) == kind


@dataclass
class HoldoutReport:
    """Per metric (`METRICS`), each configuration's measured and predicted value."""

    baseline_tpot: list[PointError] = field(default_factory=list)
    penalty: list[PointError] = field(default_factory=list)
    penalty_p50: list[PointError] = field(default_factory=list)
    prefill_duration: list[PointError] = field(default_factory=list)
    during_tpot: list[PointError] = field(default_factory=list)
    aggregate_interference: list[PointError] = field(default_factory=list)
    window_tpot: list[PointError] = field(default_factory=list)

    def of(self, metric: str) -> list[PointError]:
        if metric not in METRIC_FIELDS:
            raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        return getattr(self, metric)

    @staticmethod
    def mape(errors: Sequence[PointError], chunk_size: int | None = None,
             where: Callable[[Key], bool] | None = None) -> float | None:
        values = [e.ape for e in errors if not math.isnan(e.ape) and (chunk_size is None or e.key[0] == chunk_size)
                  and (where is None or where(e.key))]
        return float(np.mean(values)) if values else None

    def metric_mape(self, metric: str, where: Callable[[Key], bool] | None = None) -> float | None:
        return self.mape(self.of(metric), where=where)

    def table(self) -> dict[str, dict[str, float | None]]:
        """MAPE % per metric, per chunk size and overall ("all")."""
        chunks = sorted({e.key[0] for metric in METRICS for e in self.of(metric)})
        return {metric: {**{str(b): self.mape(self.of(metric), b) for b in chunks},
                         "all": self.mape(self.of(metric))} for metric in METRICS}

    def by_kind(self) -> dict[str, dict[str, float | int | None]]:
        """MAPE % of the headline metrics per kind of configuration (`kind_of`), with its count."""
        keys = {e.key for metric in METRICS for e in self.of(metric)}
        out: dict[str, dict[str, float | int | None]] = {}
        for kind in KINDS:
            n = sum(1 for k in keys if kind_of(k) == kind)
            if n:
                of_kind = functools.partial(_is_kind, kind)
                out[kind] = {"n": n, **{m: self.metric_mape(m, of_kind) for m in HEADLINE}}
        return out

    def resolved(self) -> dict[str, float | int | None]:
        """MAPE % of the headline metrics over the configurations whose penalty was resolved (`penalty_resolved`,
        by the measured penalty and baseline), with their count: the figures a near-zero penalty does not swamp."""
        penalty = {e.key: e.measured for e in self.penalty}
        baseline = {e.key: e.measured for e in self.baseline_tpot}
        keys = {e.key for metric in METRICS for e in self.of(metric)}
        ok = {k for k in keys if penalty_resolved(k[1], penalty.get(k), baseline.get(k))}
        return {"n": len(ok), **{m: self.metric_mape(m, ok.__contains__) for m in HEADLINE}}


def compare_records(measured: Mapping[Key, PointFigures | RunRecord],
                    predicted: Mapping[Key, PointFigures | RunRecord]) -> HoldoutReport:
    """Per configuration, the headline numbers measured vs predicted (medians over reps)."""
    report = HoldoutReport()
    for key in sorted(set(measured) & set(predicted)):
        m, p = _figures(measured[key]), _figures(predicted[key])
        for metric, name in METRIC_FIELDS.items():
            mv, pv = getattr(m, name), getattr(p, name)
            if mv is not None and pv is not None and mv > 0:
                report.of(metric).append(PointError(key, float(mv), float(pv)))
    return report


def _figures(x: PointFigures | RunRecord) -> PointFigures:
    return x if isinstance(x, PointFigures) else PointFigures.of(x)


def worse_than_base(base: HoldoutReport, fitted: HoldoutReport, metrics: Sequence[str] = GUARDED, *,
                    tolerance: float = 0.0) -> list[tuple[str, float, float]]:
    """(metric, fitted MAPE %, base MAPE %) for each guarded metric the fit predicts worse, by more
    than `tolerance` points."""
    out = []
    for metric in metrics:
        b, f = base.metric_mape(metric), fitted.metric_mape(metric)
        if b is not None and f is not None and f > b + tolerance:
            out.append((metric, f, b))
    return out
