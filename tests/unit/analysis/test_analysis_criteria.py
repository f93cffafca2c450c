"""The seed's success criteria: each can pass, fail, or be not evaluable, and says its figure."""

from __future__ import annotations

import pandas as pd

from pdexporter.analysis import criteria as cr
from pdexporter.analysis import models as md
from pdexporter.analysis.synthetic import SyntheticTruth, seed_grid, synthetic_records
from pdexporter.analysis.table import build_table, samples_from_record


def _table(rows: list[dict]) -> pd.DataFrame:
    base = {"chunk_size": 8192, "decode_batch_size": 4, "new_prefill_tokens": 4096, "penalty_ratio": 2.0,
            "aggregate_interference_ms": 100.0, "reps": 5, "cv_tpot_penalty": 0.05, "modelled": False}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_measurable_passes_fails_and_ignores_small_points():
    ok = _table([{"penalty_ratio": 1.5}, {"new_prefill_tokens": 8192, "penalty_ratio": 1.2},
                 {"decode_batch_size": 1, "penalty_ratio": 0.1}, {"new_prefill_tokens": 512, "penalty_ratio": 0.2}])
    c = cr.measurable(ok)
    assert c.passed is True and "2/2" in c.figure and "1.200" in c.figure
    bad = _table([{"penalty_ratio": 1.5}, {"new_prefill_tokens": 16384, "penalty_ratio": 1.05}])
    c = cr.measurable(bad)
    assert c.passed is False and "1.050" in c.figure and c.details["failing"] == ["B=8192 D=4 P=16384"]
    assert cr.measurable(_table([{"decode_batch_size": 2}])).passed is None


def test_break_even_uses_measured_costs():
    assert cr.break_even_exists(_table([{"aggregate_interference_ms": 49.0}])).passed is False
    c = cr.break_even_exists(_table([{"aggregate_interference_ms": 49.0}, {"aggregate_interference_ms": 51.0,
                                                                           "new_prefill_tokens": 8192}]))
    assert c.passed is True and "1/2" in c.figure and "at B=8192 from D=4 P=8192" in c.figure
    assert cr.break_even_exists(_table([{"aggregate_interference_ms": 60.0}]), transfer_ms=80.0).passed is False


def test_reproducible_needs_every_point_below_15_percent():
    assert cr.reproducible(_table([{"cv_tpot_penalty": 0.14}])).passed is True
    c = cr.reproducible(_table([{"cv_tpot_penalty": 0.14}, {"cv_tpot_penalty": 0.2, "new_prefill_tokens": 512}]))
    assert c.passed is False and "20.0%" in c.figure and "P=512" in c.figure
    assert cr.reproducible(_table([{"reps": 1}])).passed is None
    identical = cr.reproducible(_table([{"cv_tpot_penalty": 0.0}]))
    assert identical.passed is True and "deterministic engine" in identical.figure


def test_model_fit_uses_held_out_r2_and_overall_verdicts():
    grid = list(seed_grid(chunks=(2048, 8192), decodes=(0, 1, 4, 12), prefills=(1024, 4096, 16384, 32768)))
    samples = [samples_from_record(r) for r in synthetic_records(SyntheticTruth(), grid, reps=3)]
    table = build_table(samples)
    report = md.fit_models(md.fit_data(table, samples))
    c = cr.model_fits(report)
    assert c.passed is True and c.details["held_out_r2"] == report.held_out_r2()
    assert "held-out R^2" in c.figure and report.primary_scheme in c.figure
    strict = cr.model_fits(report, threshold=0.99999999)
    assert strict.passed is False
    assert cr.model_fits(None).passed is None
    everything = cr.evaluate_criteria(table, report)
    assert [c.number for c in everything] == [1, 2, 3, 4]
    assert cr.criteria_document(everything)["all_passed"] is True
    doc = cr.criteria_document(everything[:3] + [cr.reproducible(_table([{"reps": 1}]))])
    assert doc["all_passed"] is None
    doc = cr.criteria_document([strict] + everything[1:])
    assert doc["all_passed"] is False
