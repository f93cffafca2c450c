"""Two interference tables side by side: what an engine change (a flag, a version, a GPU) did to
the cost of a prefill, configuration by configuration.

Pure: tables in (`analysis.table.build_table` rows of a "before" and an "after" results
directory), a table out, keyed like the interference table, with each compared metric's before,
after and relative change in percent, only for the configurations both tables hold.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from pdexporter.analysis.table import KEY_COLUMNS
from pdexporter.errors import RecordError

__all__ = [
    "COMPARED", "compare_tables", "distinct_names", "summarise",
]

COMPARED = ("tpot_penalty_ms", "prefill_duration_ms", "aggregate_interference_ms", "tpot_baseline_ms")


def compare_tables(before: pd.DataFrame, after: pd.DataFrame, metrics: tuple[str, ...] = COMPARED) -> pd.DataFrame:
    """One row per configuration in both tables: `{metric}_before`, `{metric}_after`,
    `{metric}_change_pct` (after relative to before; NaN where before is 0 or missing)."""
    missing = [m for m in metrics if m not in before.columns or m not in after.columns]
    if missing:
        raise RecordError(f"cannot compare: column(s) {', '.join(missing)} missing from a table")
    keys = list(KEY_COLUMNS)
    joined = before[keys + list(metrics)].merge(after[keys + list(metrics)], on=keys, suffixes=("_before", "_after"))
    if joined.empty:
        raise RecordError("the two results directories share no (chunk_size, decode_batch_size, "
                          "new_prefill_tokens) configuration")
    out = joined[keys].copy()
    for m in metrics:
        b, a = joined[f"{m}_before"].astype(float), joined[f"{m}_after"].astype(float)
        out[f"{m}_before"] = b
        out[f"{m}_after"] = a
        out[f"{m}_change_pct"] = ((a - b) / b.abs() * 100).where(b.abs() > 0).round(2)
    return out.sort_values(keys).reset_index(drop=True)


def summarise(comparison: pd.DataFrame, metrics: tuple[str, ...] = COMPARED) -> dict[str, Any]:
    """Median, smallest and largest change per metric, and the configurations they belong to."""
    summary: dict[str, Any] = {"configurations": int(len(comparison)), "metrics": {}}
    # pandas-stubs types idxmin()/idxmax() as Hashable and a cell as any scalar; here they are the
    # frame's integer index and its integer key columns.
    for m in metrics:
        change = comparison[f"{m}_change_pct"]
        finite = change[change.map(lambda v: isinstance(v, float) and math.isfinite(v))]
        if finite.empty:
            summary["metrics"][m] = None
            continue
        summary["metrics"][m] = {
            "median_change_pct": round(float(finite.median()), 2),
            "min_change_pct": round(float(finite.min()), 2),
            "min_at": _key_at(comparison, int(finite.idxmin())),  # type: ignore[call-overload]
            "max_change_pct": round(float(finite.max()), 2),
            "max_at": _key_at(comparison, int(finite.idxmax())),  # type: ignore[call-overload]
        }
    return summary


def _key_at(comparison: pd.DataFrame, index: int) -> list[int]:
    return [int(comparison.loc[index, k]) for k in KEY_COLUMNS]  # type: ignore[arg-type]  # see summarise


def distinct_names(before: str | Path, after: str | Path) -> tuple[str, str]:
    """Names for two results directories that tell them apart in a title: their last path parts,
    as many as it takes (`results/sim/h200/quick` and `results/sim/h20/quick` are `h200/quick` and
    `h20/quick`, not "from quick to quick"); the whole paths when even those agree."""
    a, b = Path(before).resolve().parts, Path(after).resolve().parts
    for n in range(1, max(len(a), len(b)) + 1):
        left, right = "/".join(a[-n:]), "/".join(b[-n:])
        if left != right:
            return left, right
    return str(before), str(after)
