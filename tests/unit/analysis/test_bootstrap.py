"""Bootstrap intervals of a grid point's median: seeded per point, inside the data, covering the
true median about as often as they claim; in the table after every other column."""

from __future__ import annotations

import numpy as np
import pytest

from pdexporter.analysis.bootstrap import bootstrap_ci, point_seed
from pdexporter.analysis.synthetic import SyntheticTruth, synthetic_record
from pdexporter.analysis.table import CI_COLUMNS, COLUMNS, build_table, samples_from_record


def test_interval_is_seeded_and_inside_the_data() -> None:
    values = [31.0, 35.5, 29.8, 48.1, 33.2]
    a = bootstrap_ci(values, seed=point_seed((8192, 4, 8192), "tpot_penalty_ms"))
    b = bootstrap_ci(list(reversed(values)), seed=point_seed((8192, 4, 8192), "tpot_penalty_ms"))
    assert a == b
    low, high = a
    assert min(values) <= low <= float(np.median(values)) <= high <= max(values)
    assert low < high
    assert bootstrap_ci([5.0]) == (None, None) and bootstrap_ci([None, 3.0, float("nan")]) == (None, None)


def test_interval_covers_the_true_median_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(7)
    covered = 0
    trials = 300
    for i in range(trials):
        sample = rng.lognormal(mean=np.log(40.0), sigma=0.2, size=15)  # true median 40
        low, high = bootstrap_ci(list(sample), seed=i, resamples=1000)
        covered += low <= 40.0 <= high
    assert 0.88 <= covered / trials <= 0.995, covered / trials


def test_table_has_the_intervals_last_and_the_seed_columns_unmoved() -> None:
    assert COLUMNS[-len(CI_COLUMNS):] == CI_COLUMNS
    assert CI_COLUMNS == ("tpot_penalty_ms_ci95_low", "tpot_penalty_ms_ci95_high", "prefill_duration_ms_ci95_low",
                          "prefill_duration_ms_ci95_high", "aggregate_interference_ms_ci95_low",
                          "aggregate_interference_ms_ci95_high")
    records = [synthetic_record(SyntheticTruth(), 8192, d, 8192, reps=5) for d in (0, 4)]
    table = build_table([samples_from_record(r) for r in records]).set_index("decode_batch_size")
    for d, record in zip((0, 4), records):
        row = table.loc[d]
        durations = [r.interference.prefill_duration_ms for r in record.reps]
        low, high = row["prefill_duration_ms_ci95_low"], row["prefill_duration_ms_ci95_high"]
        assert min(durations) <= low <= row["prefill_duration_ms"] <= high <= max(durations)
    assert np.isnan(table.loc[0, "tpot_penalty_ms_ci95_low"])  # D = 0: no penalty, no interval
    penalties = [r.derived.tpot_penalty_ms for r in records[1].reps]
    assert table.loc[4, "tpot_penalty_ms_ci95_low"] == pytest.approx(
        bootstrap_ci(penalties, seed=point_seed((8192, 4, 8192), "tpot_penalty_ms"))[0], abs=1e-4)
