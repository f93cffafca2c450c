"""Passive tables: production prefills binned to a grid, counted, with bootstrap confidence
intervals; and how a passive table compares with the injected table of the same engine. Pure.

A passive window (`pdexporter run --passive`) is one production prefill; its grid point is a bin
(`measure.passive`: D and P binned on a log scale). `export-table --mode passive` builds the
seed's table from them as from injected repetitions (medians over events), then adds, per cell:

- `events`: how many events fell in it. From Prometheus, every rise of `pdexporter_windows_total`
  counts, also windows whose values were overwritten before a scrape (their values are lost; the
  medians use the windows whose values survive);
- `too_few_events`: fewer than `--min-events` (default 5): the cell is shown, and marked;

and the table's own 95 % bootstrap intervals of the medians (`analysis.bootstrap`: the penalty,
the prefill duration and the aggregate interference, `<column>_ci95_low` / `_high`) are over the
cell's events.

`--grid SWEEP.yaml` re-bins the cells to that sweep's D and P values with the same log-scale rule,
taking each cell's label as its value; cells outside every bin are left out and counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from pdexporter.analysis.bootstrap import bootstrap_ci, point_seed
from pdexporter.analysis.table import KEY_COLUMNS, ConfigSamples
from pdexporter.measure.passive import bin_int

MIN_EVENTS = 5
PASSIVE_COLUMNS = ("events", "too_few_events")

Key = tuple[int, int, int]


def bootstrap_median_ci(values: Sequence[float | None], key: Key = (0, 0, 0),
                        column: str = "") -> tuple[float | None, float | None]:
    """The table's 95 % bootstrap interval of a median (`analysis.bootstrap`, seeded per point)."""
    return bootstrap_ci(values, seed=point_seed(key, column))


@dataclass(frozen=True)
class Rebinned:
    samples: list[ConfigSamples]
    events: dict[Key, int]
    dropped_cells: int
    dropped_events: int


def rebin(samples: Iterable[ConfigSamples], decode_batch_sizes: Sequence[int], prefill_tokens: Sequence[int],
          events: Mapping[Key, int] | None = None) -> Rebinned:
    """Cells merged into the grid's (D, P) bins (module docs); event counts follow their cells."""
    merged: dict[Key, ConfigSamples] = {}
    counts: dict[Key, int] = {}
    dropped_cells = dropped_events = 0
    for s in samples:
        n = (events or {}).get(s.key, len(s.reps))
        d, p = bin_int(s.decode_batch_size, decode_batch_sizes), bin_int(s.new_prefill_tokens, prefill_tokens)
        if d is None or p is None:
            dropped_cells += 1
            dropped_events += n
            continue
        key = (s.chunk_size, d, p)
        counts[key] = counts.get(key, 0) + n
        if key in merged:
            merged[key] = replace(merged[key], reps=merged[key].reps + s.reps, steps=merged[key].steps + s.steps)
        else:
            merged[key] = replace(s, decode_batch_size=d, new_prefill_tokens=p, top_level=None)
    return Rebinned([merged[k] for k in sorted(merged)], counts, dropped_cells, dropped_events)


def passive_columns(table: pd.DataFrame, samples: Sequence[ConfigSamples], *, min_events: int = MIN_EVENTS,
                    events: Mapping[Key, int] | None = None) -> pd.DataFrame:
    """The table with the passive columns (module docs) appended; the bootstrap intervals of its
    medians are the table's own (`analysis.bootstrap`)."""
    by_key = {s.key: s for s in samples}
    out = table.copy()
    counts = []
    for key in zip(*(out[c] for c in KEY_COLUMNS)):
        s = by_key[tuple(int(k) for k in key)]  # type: ignore[index]
        counts.append(int(max((events or {}).get(s.key, len(s.reps)), len(s.reps))))
    out["events"] = pd.Series(counts, index=out.index, dtype="int64")
    out["too_few_events"] = out["events"] < min_events
    return out


# --- passive vs injected ---------------------------------------------------------------------------


def within(value: float, reference: float, tolerance: float, floor: float = 0.0) -> bool:
    """|value - reference| within `tolerance` of |reference|, or within `floor` (absolute)."""
    return abs(value - reference) <= max(tolerance * abs(reference), floor)


def time_to_tolerance(times: Sequence[float], values: Sequence[float], reference: float, tolerance: float = 0.10,
                      floor: float = 0.0) -> float | None:
    """The traffic time after which the running median of the events so far stays within
    `tolerance` of `reference` (to the end of the data); None if it is not within at the end."""
    order = np.argsort(np.asarray(times, dtype=np.float64), kind="stable")
    t = np.asarray(times, dtype=np.float64)[order]
    v = np.asarray(values, dtype=np.float64)[order]
    ok = [within(float(np.median(v[: k + 1])), reference, tolerance, floor) for k in range(v.size)]
    if not ok or not ok[-1]:
        return None
    k = len(ok) - 1
    while k > 0 and ok[k - 1]:
        k -= 1
    return float(t[k])


@dataclass(frozen=True)
class CellComparison:
    key: Key
    column: str
    events: int
    passive: float
    ci_low: float | None
    ci_high: float | None
    injected: float
    time_to_tolerance_s: float | None  # traffic time until the running median stays within tolerance

    @property
    def error(self) -> float | None:
        return (self.passive - self.injected) / abs(self.injected) if self.injected else None


def compare_cells(passive: Mapping[Key, Sequence[tuple[float, float]]], injected: Mapping[Key, float], column: str,
                  *, tolerance: float = 0.10, floor: float = 0.0) -> list[CellComparison]:
    """Per cell in both: the median of the passive events' `(traffic time s, value)` against the
    injected value, with its bootstrap interval and the traffic time the cell needed."""
    out = []
    for key in sorted(set(passive) & set(injected)):
        events = [(t, v) for t, v in passive[key] if v is not None and math.isfinite(v)]
        if not events:
            continue
        values = [v for _, v in events]
        low, high = bootstrap_median_ci(values, key, column)
        out.append(CellComparison(key, column, len(values), float(np.median(values)), low, high, injected[key],
                                  time_to_tolerance([t for t, _ in events], values, injected[key], tolerance, floor)))
    return out


__all__ = [
    "CellComparison", "MIN_EVENTS", "PASSIVE_COLUMNS", "Rebinned", "bootstrap_median_ci",
    "compare_cells", "passive_columns", "rebin", "time_to_tolerance", "within",
]
