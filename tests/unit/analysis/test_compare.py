"""`analysis.compare`: two tables joined on the grid key, changes in percent, one-line errors."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pdexporter.analysis.compare import COMPARED, compare_tables, summarise
from pdexporter.errors import RecordError


def table(rows: list[tuple[int, int, int, float, float]]) -> pd.DataFrame:
    """(B, D, P, penalty, prefill) rows; the other compared columns follow from them."""
    return pd.DataFrame([
        {"chunk_size": b, "decode_batch_size": d, "new_prefill_tokens": p, "tpot_penalty_ms": pen,
         "prefill_duration_ms": pre, "aggregate_interference_ms": pen * d, "tpot_baseline_ms": 5.0}
        for b, d, p, pen, pre in rows
    ])


def test_changes_are_relative_to_before_on_shared_configurations_only() -> None:
    before = table([(8192, 2, 512, 50.0, 64.0), (8192, 4, 512, 40.0, 60.0), (2048, 4, 512, 30.0, 70.0)])
    after = table([(8192, 4, 512, 10.0, 30.0), (8192, 2, 512, 25.0, 64.0), (16384, 4, 512, 1.0, 1.0)])
    out = compare_tables(before, after)
    assert [tuple(r) for r in out[["chunk_size", "decode_batch_size", "new_prefill_tokens"]].to_numpy()] == [
        (8192, 2, 512), (8192, 4, 512)]
    assert list(out["tpot_penalty_ms_change_pct"]) == [-50.0, -75.0]
    assert list(out["prefill_duration_ms_change_pct"]) == [0.0, -50.0]
    assert list(out["tpot_penalty_ms_before"]) == [50.0, 40.0] and list(out["tpot_penalty_ms_after"]) == [25.0, 10.0]
    summary = summarise(out)
    assert summary["configurations"] == 2
    pen = summary["metrics"]["tpot_penalty_ms"]
    assert pen["median_change_pct"] == -62.5 and pen["min_at"] == [8192, 4, 512] and pen["max_at"] == [8192, 2, 512]
    assert summary["metrics"]["tpot_baseline_ms"]["max_change_pct"] == 0.0


def test_a_zero_before_has_no_relative_change() -> None:
    out = compare_tables(table([(8192, 0, 512, 0.0, 50.0)]), table([(8192, 0, 512, 0.0, 40.0)]))
    assert (
        math.isnan(out.loc[0, "tpot_penalty_ms_change_pct"]) and out.loc[0, "prefill_duration_ms_change_pct"] == -20.0
    )
    assert summarise(out)["metrics"]["tpot_penalty_ms"] is None


def test_disjoint_tables_and_missing_columns_are_one_line_errors() -> None:
    with pytest.raises(RecordError, match="share no"):
        compare_tables(table([(8192, 2, 512, 1.0, 1.0)]), table([(2048, 2, 512, 1.0, 1.0)]))
    with pytest.raises(RecordError, match="tpot_penalty_ms missing"):
        compare_tables(
            table([(8192, 2, 512, 1.0, 1.0)]).drop(columns="tpot_penalty_ms"), table([(8192, 2, 512, 1.0, 1.0)])
        )
    assert COMPARED[0] == "tpot_penalty_ms"


def test_two_sweeps_with_one_name_are_told_apart_by_their_paths(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 24: `compare` titled its plots "from quick to quick" for two sweeps named quick."""
    from pdexporter.analysis.compare import distinct_names

    a, b = tmp_path / "sim" / "h200" / "quick", tmp_path / "sim" / "h20" / "quick"
    assert distinct_names(a, b) == ("h200/quick", "h20/quick")
    assert distinct_names(tmp_path / "before", tmp_path / "after") == ("before", "after")
    assert distinct_names(a, a) == (str(a), str(a))
