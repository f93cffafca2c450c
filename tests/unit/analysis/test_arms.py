"""Both arms in one table, the measured transfer model, the two-arm models, the pair prediction
(`analysis.arms`), on tables whose numbers are known by construction."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pdexporter.analysis.arms import (
    JOIN_COLUMNS,
    fit_linear,
    fit_transfer,
    given_transfer,
    join_arms,
    predict_pair,
    two_arm_section,
    validation_summary,
)
from pdexporter.analysis.table import COLUMNS, SEED_COLUMNS

KEYS = [(8192, d, p) for d in (0, 1, 4, 8) for p in (2048, 8192, 32768)]


def table(values: dict[str, callable], keys=KEYS) -> pd.DataFrame:  # type: ignore[valid-type]
    rows = []
    for b, d, p in keys:
        row = {"chunk_size": b, "decode_batch_size": d, "new_prefill_tokens": p, "engine": "x", "modelled": True}
        row.update({name: fn(b, d, p) for name, fn in values.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def colocated() -> pd.DataFrame:
    frame = table({
        "prefill_duration_ms": lambda b, d, p: 50 + 0.03 * p + 2e-6 * p * p,
        "aggregate_interference_ms": lambda b, d, p: np.nan if d == 0 else d * (40 + 0.03 * p),
        "total_interference_ms": lambda b, d, p: np.nan if d == 0 else 40 + 0.03 * p,
        "tpot_interference_ms": lambda b, d, p: np.nan if d == 0 else 50 + d,
        "tpot_penalty_ms": lambda b, d, p: np.nan if d == 0 else 45.0,
    })
    return frame.reindex(columns=list(dict.fromkeys([*COLUMNS, *frame.columns])))


def offloaded(pair: bool) -> pd.DataFrame:
    values = {
        "prefill_duration_ms": lambda b, d, p: 20 + 0.001 * p + (5 + 0.0004 * p if pair else 0),
        "aggregate_interference_ms": lambda b, d, p: np.nan if d == 0 else d * (2 + 0.0001 * p),
        "total_interference_ms": lambda b, d, p: np.nan if d == 0 else 2 + 0.0001 * p,
        "tpot_interference_ms": lambda b, d, p: np.nan if d == 0 else 8 + d,
        "tpot_penalty_ms": lambda b, d, p: np.nan if d == 0 else 2.0,
    }
    if pair:
        values.update({
            "offload_prefill_ms": lambda b, d, p: 55 + 0.03 * p + 2e-6 * p * p,
            "offload_decode_ms": lambda b, d, p: 25 + 0.0014 * p,
            "offload_ttft_ms": lambda b, d, p: 80 + 0.0314 * p + 2e-6 * p * p,
            "kv_transfer_ms": lambda b, d, p: 5 + 0.0004 * p,  # 5 ms + 96 KiB / 0.4 us = 245.76 GB/s
            "kv_bytes": lambda b, d, p: 98304 * p,
        })
    return table(values, [k for k in KEYS if k[1] >= 1])


def test_join_keeps_the_colocated_table_first_and_appends_the_other_arm() -> None:
    col, off = colocated(), offloaded(pair=True)
    joined = join_arms(col, off)
    assert list(joined.columns[: len(col.columns)]) == list(col.columns)
    assert list(joined.columns[: len(SEED_COLUMNS)]) == list(SEED_COLUMNS)
    assert list(joined.columns[len(col.columns):]) == list(JOIN_COLUMNS)
    pd.testing.assert_frame_equal(joined[list(col.columns)], col)
    row = joined[(joined.decode_batch_size == 4) & (joined.new_prefill_tokens == 8192)].iloc[0]
    assert row.offloaded_aggregate_interference_ms == pytest.approx(4 * (2 + 0.8192))
    assert row.kv_transfer_ms == pytest.approx(5 + 0.0004 * 8192)
    assert row.colocated_ttft_ms == pytest.approx(row.prefill_duration_ms)
    assert row.offloaded_ttft_ms == pytest.approx(80 + 0.0314 * 8192 + 2e-6 * 8192**2)
    assert joined[joined.decode_batch_size == 0]["offloaded_aggregate_interference_ms"].isna().all()


def test_the_transfer_model_is_fitted_from_measured_transfers() -> None:
    model = fit_transfer(offloaded(pair=True))
    assert model is not None and model.source == "measured" and model.n == 9
    assert model.fixed_ms == pytest.approx(5.0) and model.ms_per_token == pytest.approx(0.0004)
    assert model.bytes_per_token == pytest.approx(98304) and model.bandwidth_gb_s == pytest.approx(245.76)
    assert model(32768) == pytest.approx(5 + 0.0004 * 32768)
    assert fit_transfer(offloaded(pair=False)) is None  # DecodeBench: nothing transferred, nothing measured
    given = given_transfer(225.0, 98304, 5.0)
    assert given.source == "given" and given(32768) == pytest.approx(5 + 98304 * 32768 / 225e9 * 1e3)


def test_linear_fits_recover_known_coefficients_and_shrink_to_the_data() -> None:
    fit = fit_linear(colocated(), "prefill_duration_ms", ("1", "p", "p2"), "test")
    assert fit is not None and fit.r2 == pytest.approx(1.0)
    assert fit.coefficients == pytest.approx({"1": 50.0, "p": 30.0, "p2": 2.0}, rel=1e-6)  # per 1K tokens
    few = fit_linear(colocated().head(2), "prefill_duration_ms", ("1", "p", "p2"), "test")
    assert few is not None and few.features == ("1",)  # two rows carry the constant only
    assert fit_linear(colocated(), "absent", ("1",), "test") is None


def test_two_arm_section_uses_the_pairs_measurements_or_composes_from_decode_bench() -> None:
    col = colocated()
    pair = two_arm_section(col, offloaded(pair=True), fit_transfer(offloaded(pair=True)))
    assert pair is not None and pair["offloaded_setup"] == "1P1D pair" and not pair["decode_side_excludes_transfer"]
    assert pair["offloaded_prefill"]["target"] == "offload_prefill_ms"
    assert pair["transfer"]["source"] == "measured"
    bench = two_arm_section(col, offloaded(pair=False), None)
    assert bench is not None and bench["decode_side_excludes_transfer"]
    assert bench["offloaded_prefill"]["target"] == "prefill_duration_ms"  # the colocated TTFT model at D = 0
    assert bench["transfer"] == {"source": "seed-constant"}
    assert bench["offloaded_cost_per_stream"]["coefficients"] == pytest.approx({"1": 2.0, "d": 0.0, "p": 0.1},
                                                                                abs=1e-6)


def test_predicting_the_pair_from_one_gpu_and_comparing() -> None:
    col, pair = colocated(), offloaded(pair=True)
    bench = offloaded(pair=False)
    frame = predict_pair(col, bench, pair, fit_transfer(pair))
    assert len(frame) == len(pair)
    # the DecodeBench arm's aggregate equals the pair's by construction: the saving is predicted exactly
    assert frame["saved_error_pct"].abs().max() == pytest.approx(0.0, abs=1e-6)
    row = frame[(frame.decode_batch_size == 4) & (frame.new_prefill_tokens == 32768)].iloc[0]
    alone = 50 + 0.03 * 32768 + 2e-6 * 32768**2
    predicted = alone + (5 + 0.0004 * 32768) + (20 + 0.001 * 32768) - alone
    measured = (80 + 0.0314 * 32768 + 2e-6 * 32768**2) - alone
    assert row.predicted_ttft_cost_ms == pytest.approx(predicted)
    assert row.measured_ttft_cost_ms == pytest.approx(measured)
    assert row.ttft_cost_error_pct == pytest.approx(round(100 * (predicted - measured) / measured, 2))
    summary = validation_summary(frame)
    assert summary["points_compared"] == 9 and summary["saved_within_goal"] == 9
    off = pair.copy()
    off["aggregate_interference_ms"] *= 3  # the pair's decodes lose 3x what DecodeBench's did
    worse = predict_pair(col, bench, off, fit_transfer(pair))
    assert (worse["saved_error_pct"] > 0).all()  # the prediction overstates the saving, and says by how much
