"""The interference table: the seed's columns, p50 over repetitions, agreement with record top levels."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from pdexporter.analysis.synthetic import SyntheticTruth, synthetic_record
from pdexporter.analysis.table import (
    COLUMNS,
    KEY_COLUMNS,
    SEED_COLUMNS,
    TABLE_CSV,
    TABLE_PARQUET,
    build_table,
    samples_from_record,
    top_level_mismatches,
    write_table,
)
from pdexporter.measure.records import RecordConfig, RepRecord, RunRecord, aggregate
from tests.helpers import seed_record_example

# Verbatim from the seed (section "Aggregated Table (results/interference_table.csv)").
SEED_CSV = """chunk_size,decode_batch_size,new_prefill_tokens,tpot_baseline_ms,tpot_interference_ms,tpot_penalty_ms,penalty_ratio,num_chunks,prefill_duration_ms
8192,4,8192,42.3,89.2,46.9,1.11,1,91.0
8192,4,16384,42.3,88.5,46.2,1.09,2,178.3
8192,8,8192,78.1,156.3,78.2,1.00,1,159.0
"""  # noqa: E501 (verbatim data)

# Verbatim from the seed (section "Per-Run Record").
SEED_RECORD = seed_record_example()


def test_csv_header_starts_with_the_seeds_columns_exactly(tmp_path):
    seed_header = SEED_CSV.splitlines()[0].split(",")
    assert list(SEED_COLUMNS) == seed_header
    record = synthetic_record(SyntheticTruth(), 8192, 4, 8192, reps=3)
    table = build_table([samples_from_record(record)])
    write_table(table, tmp_path)
    written_header = (tmp_path / TABLE_CSV).read_text().splitlines()[0].split(",")
    assert written_header[: len(seed_header)] == seed_header
    assert written_header == list(COLUMNS)


def test_seed_example_record_gives_the_seed_example_row(tmp_path):
    record = RunRecord.model_validate(json.loads(json.dumps(SEED_RECORD)))
    table = build_table([samples_from_record(record)])
    write_table(table, tmp_path)
    ours = pd.read_csv(tmp_path / TABLE_CSV)
    seed = pd.read_csv(io.StringIO(SEED_CSV))
    for column in SEED_COLUMNS:
        assert ours.loc[0, column] == pytest.approx(seed.loc[0, column]), column
    # total_interference is per stream; the aggregate over the batch is D x that.
    assert ours.loc[0, "aggregate_interference_ms"] == pytest.approx(4 * 46.9)
    assert ours.loc[0, "reps"] == 1


def _rep(k: int, baseline: float, during: float, chunks: int, duration: float) -> RepRecord:
    return RepRecord.model_validate({
        "rep": k,
        "baseline": {"tpot_p50_ms": baseline, "tpot_p90_ms": baseline * 1.1, "tpot_p99_ms": baseline * 1.2,
                     "step_time_ms": baseline},
        "interference": {"tpot_during_prefill_p50_ms": during, "tpot_during_prefill_p90_ms": during * 1.2,
                         "tpot_after_prefill_p50_ms": baseline, "num_chunks_actual": chunks,
                         "prefill_duration_ms": duration, "prefill_ttft_ms": duration},
        "derived": {"tpot_penalty_p50_ms": during - baseline, "tpot_penalty_ratio": (during - baseline) / baseline,
                    "total_interference_ms": (during - baseline) * chunks, "decode_tokens_delayed": 2 * chunks},
    })


def test_values_are_medians_over_repetitions_and_cv_is_over_repetitions():
    config = RecordConfig(decode_batch_size=2, new_prefill_tokens=4096, chunk_size=2048, model="m", gpu="g")
    reps = [_rep(0, 10.0, 30.0, 2, 100.0), _rep(1, 10.0, 50.0, 3, 140.0), _rep(2, 10.0, 34.0, 2, 120.0)]
    row = build_table([samples_from_record(aggregate(config, reps))]).iloc[0]
    assert row["tpot_interference_ms"] == pytest.approx(34.0)
    assert row["tpot_penalty_ms"] == pytest.approx(24.0)
    assert row["num_chunks"] == 2
    assert row["prefill_duration_ms"] == pytest.approx(120.0)
    assert row["reps"] == 3
    penalties = pd.Series([20.0, 40.0, 24.0])
    assert row["cv_tpot_penalty"] == pytest.approx(penalties.std() / penalties.mean(), abs=1e-4)


def test_table_recomputed_from_reps_agrees_with_record_top_levels():
    records = [synthetic_record(SyntheticTruth(), b, d, p, reps=5)
               for b, d, p in [(2048, 1, 4096), (8192, 4, 32768), (16384, 12, 512), (4096, 0, 2048)]]
    samples = [samples_from_record(r) for r in records]
    assert top_level_mismatches(samples) == []
    table = build_table(samples).set_index(list(KEY_COLUMNS))
    for record in records:
        row = table.loc[record.key]
        for column, top in (("tpot_penalty_ms", record.derived.tpot_penalty_ms),
                            ("tpot_penalty_p50_ms", record.derived.tpot_penalty_p50_ms),
                            ("tpot_interference_ms", record.interference.tpot_during_prefill_mean_ms),
                            ("tpot_interference_p50_ms", record.interference.tpot_during_prefill_p50_ms),
                            ("num_chunks", record.interference.num_chunks_actual),
                            ("prefill_duration_ms", record.interference.prefill_duration_ms)):
            if top is None:
                assert pd.isna(row[column])
            else:
                assert row[column] == pytest.approx(top, abs=1e-3), column


def test_a_tampered_top_level_is_reported():
    record = synthetic_record(SyntheticTruth(), 8192, 4, 8192, reps=3)
    record.derived.tpot_penalty_ms = (record.derived.tpot_penalty_ms or 0) + 5.0
    problems = top_level_mismatches([samples_from_record(record)])
    assert len(problems) == 1 and "tpot_penalty_ms" in problems[0]


def test_d0_rows_keep_blanks_not_zeros(tmp_path):
    record = synthetic_record(SyntheticTruth(), 2048, 0, 2048, reps=2)
    table = build_table([samples_from_record(record)])
    write_table(table, tmp_path)
    line = (tmp_path / TABLE_CSV).read_text().splitlines()[1].split(",")
    assert line[:3] == ["2048", "0", "2048"]
    assert line[3:8] == ["", "", "", "", ""]  # no baseline, no penalty, no chunks seen without probes
    assert float(line[8]) > 0


def test_parquet_matches_csv_and_writes_leave_no_temp_files(tmp_path):
    records = [synthetic_record(SyntheticTruth(), 8192, d, 8192, reps=2) for d in (0, 1, 4)]
    table = build_table([samples_from_record(r) for r in records])
    (tmp_path / TABLE_CSV).write_text("old content\n")
    paths = write_table(table, tmp_path)
    assert {p.name for p in paths} == {TABLE_CSV, TABLE_PARQUET}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([TABLE_CSV, TABLE_PARQUET])
    back = pd.read_parquet(tmp_path / TABLE_PARQUET)
    csv = pd.read_csv(tmp_path / TABLE_CSV)
    assert list(back.columns) == list(csv.columns)
    pd.testing.assert_series_equal(back["tpot_penalty_ms"], csv["tpot_penalty_ms"], check_dtype=False)
