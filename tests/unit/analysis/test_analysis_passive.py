"""Passive tables (`analysis.passive`): bootstrap intervals, re-binning to a sweep's grid, the
passive columns, and the passive-vs-injected comparison's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from pdexporter.analysis.passive import (
    PASSIVE_COLUMNS,
    bootstrap_median_ci,
    compare_cells,
    passive_columns,
    rebin,
    time_to_tolerance,
)
from pdexporter.analysis.table import ConfigSamples, build_table


def _cell(d: int, p: int, penalties: list[float]) -> ConfigSamples:
    reps = tuple({"tpot_penalty_ms": x, "aggregate_interference_ms": x * d, "tpot_baseline_ms": 6.0} for x in penalties)
    return ConfigSamples(chunk_size=8192, decode_batch_size=d, new_prefill_tokens=p, reps=reps, passive=True)


def test_comparison_intervals_are_the_tables_own_bootstrap() -> None:
    rng = np.random.default_rng(1)
    few = list(rng.normal(50, 5, 8))
    lo, hi = bootstrap_median_ci(few, (8192, 4, 2048), "tpot_penalty_ms")
    assert lo is not None and hi is not None and lo <= float(np.median(few)) <= hi
    cell = _cell(4, 2048, few)
    row = build_table([cell]).iloc[0]
    assert (row["tpot_penalty_ms_ci95_low"], row["tpot_penalty_ms_ci95_high"]) == pytest.approx((lo, hi), abs=1e-4)
    assert bootstrap_median_ci([3.0]) == (None, None)


def test_rebin_merges_cells_into_the_grid_and_counts_what_falls_outside() -> None:
    cells = [_cell(3, 2048, [40.0]), _cell(4, 2048, [42.0, 44.0]), _cell(16, 2048, [50.0]), _cell(4, 128, [4.0])]
    got = rebin(cells, [0, 1, 2, 4, 6, 8, 12], [512, 1024, 2048], events={(8192, 4, 2048): 5})
    assert [s.key for s in got.samples] == [(8192, 4, 2048)]
    assert len(got.samples[0].reps) == 3  # D = 3 joined D = 4 (sqrt(2 * 4) = 2.83)
    assert got.events == {(8192, 4, 2048): 6}  # 1 + the 5 the counter saw for D = 4
    assert got.dropped_cells == 2 and got.dropped_events == 2  # D = 16 and P = 128 are outside


def test_passive_columns_count_and_mark() -> None:
    cells = [_cell(4, 2048, [40.0 + k for k in range(10)]), _cell(6, 8192, [70.0, 72.0])]
    table = passive_columns(build_table(cells), cells, min_events=5, events={(8192, 6, 8192): 3})
    assert list(table.columns[-len(PASSIVE_COLUMNS):]) == list(PASSIVE_COLUMNS)
    rows = table.set_index(["decode_batch_size", "new_prefill_tokens"])
    assert rows.loc[(4, 2048), "events"] == 10 and not rows.loc[(4, 2048), "too_few_events"]
    assert rows.loc[(6, 8192), "events"] == 3 and rows.loc[(6, 8192), "too_few_events"]
    low, high = rows.loc[(4, 2048), "tpot_penalty_ms_ci95_low"], rows.loc[(4, 2048), "tpot_penalty_ms_ci95_high"]
    assert low <= rows.loc[(4, 2048), "tpot_penalty_ms"] <= high


def test_time_to_tolerance_is_when_the_running_median_stays_in() -> None:
    times = [10, 20, 30, 40, 50]
    assert time_to_tolerance(times, [80, 52, 49, 51, 50], 50.0) == 30  # medians 80, 66, 52, 51.5, 51
    assert time_to_tolerance(times, [50, 80, 90, 95, 99], 50.0) is None  # out at the end
    assert time_to_tolerance(times, [50, 50, 90, 95, 99], 50.0) is None
    assert time_to_tolerance([5], [4.0], 4.2) == 5
    assert time_to_tolerance(times, [4.0] * 5, 5.0, floor=1.0) == 10  # within 1 ms though 20 % off


def test_compare_cells_pairs_only_cells_in_both() -> None:
    passive = {(8192, 4, 2048): [(60.0, 49.0), (120.0, 51.0), (180.0, 50.0)], (8192, 8, 512): [(1.0, 4.0)]}
    rows = compare_cells(passive, {(8192, 4, 2048): 48.0, (8192, 6, 4096): 60.0}, "tpot_penalty_ms")
    (row,) = rows
    assert row.key == (8192, 4, 2048) and row.events == 3 and row.passive == 50.0
    assert row.error == pytest.approx(2 / 48) and row.time_to_tolerance_s == 60.0
