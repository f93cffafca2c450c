"""Break-even and the router's decision JSON: the JSON evaluator must agree with the fitted model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pdexporter.analysis import models as md
from pdexporter.analysis.breakeven import (
    DECISION_SCHEMA,
    break_even_frame,
    decision_document,
    evaluate_decision,
    model_decision,
    offload_region,
)
from pdexporter.analysis.synthetic import SyntheticTruth, seed_grid, synthetic_records
from pdexporter.analysis.table import build_table, samples_from_record
from pdexporter.analysis.thresholds import compute_thresholds


@pytest.fixture(scope="module")
def fitted():
    grid = list(seed_grid(chunks=(2048, 8192, 16384), decodes=(0, 1, 2, 4, 8, 12), prefills=(512, 2048, 8192, 32768)))
    samples = [samples_from_record(r) for r in synthetic_records(SyntheticTruth(), grid, reps=3)]
    table = build_table(samples)
    return table, md.fit_models(md.fit_data(table, samples))


def _roundtrip(doc: dict) -> dict:
    return json.loads(json.dumps(doc, allow_nan=False))


# Off-grid D, P and chunk sizes on purpose (interpolation, nearest chunk size, extrapolation).
QUERIES = [(d, p, b) for d in (0, 1, 3, 4, 7, 12, 16) for p in (100, 512, 5000, 16384, 40000)
           for b in (1024, 2048, 3000, 8192, 12000, 16384)]


@pytest.mark.parametrize("name", [md.CONTEXT_MODEL, md.SEED_MODEL])
def test_json_evaluator_gives_the_models_answer(fitted, name):
    table, report = fitted
    report = md.FitReport(report.fits, name, report.primary_scheme, "forced for the test", report.n_points)
    doc = _roundtrip(decision_document(report, table, 50.0))
    assert doc["schema"] == DECISION_SCHEMA and doc["model"]["name"] == name
    model = report.fits[name].model
    for d, p, b in QUERIES:
        for transfer in (10.0, 50.0, 500.0):
            ours = evaluate_decision(doc, d, p, b, transfer)
            theirs = model_decision(model, d, p, b, transfer)
            assert ours["offload"] == theirs["offload"], (d, p, b, transfer)
            assert ours["cost_ms"] == pytest.approx(theirs["cost_ms"], rel=1e-9, abs=1e-9)
            assert ours["chunks"] == theirs["chunks"]


def test_default_transfer_and_fitted_range(fitted):
    table, report = fitted
    doc = _roundtrip(decision_document(report, table, 75.0))
    verdict = evaluate_decision(doc, 4, 16384, 8192)
    assert verdict["transfer_ms"] == 75.0
    assert verdict["in_fitted_range"]
    assert not evaluate_decision(doc, 4, 100_000, 8192)["in_fitted_range"]
    assert doc["valid_range"] == {"decode_batch_size": [1, 12], "new_prefill_tokens": [512, 32768],
                                  "chunk_size": [2048, 16384], "chunk_sizes": [2048, 8192, 16384]}
    assert doc["modelled"] is True


def test_evaluator_rejects_impossible_shapes(fitted):
    table, report = fitted
    doc = decision_document(report, table)
    with pytest.raises(ValueError, match="no room"):
        evaluate_decision(doc, 8192, 1000, 8192)
    with pytest.raises(ValueError):
        evaluate_decision(doc, 1, 0, 8192)


def test_thresholds_in_the_document_are_the_one_computation(fitted):
    """decision.json's seed-rule thresholds are `analysis.thresholds` (what `thresholds --mode seed`
    prints): the P from which the cost stays over the budget, on 64-token steps."""
    table, report = fitted
    doc = _roundtrip(decision_document(report, table, 50.0))
    same = compute_thresholds(doc, mode="seed", transfer_ms=50.0, replicates=0)
    model = report.best.model
    for d in (1, 2, 4):
        p_star = doc["thresholds_min_prefill_tokens"]["8192"][str(d)]
        assert p_star == same.at(8192, d).threshold and p_star > 64
        assert float(model.predict(d, p_star, 8192)) > 50.0
        assert float(model.predict(d, p_star - 64, 8192)) <= 50.0
    assert set(doc["thresholds_min_prefill_tokens"]["8192"]) == {str(d) for d in range(1, 13)}


def test_break_even_frame_and_region(fitted):
    table, report = fitted
    frame = break_even_frame(table, report.best.model, 50.0)
    assert (frame["decode_batch_size"] >= 1).all()
    assert (frame["offload_measured"] == (frame["break_even_measured_ms"] > 50.0)).all()
    region = offload_region(report.best.model, 8192, [1, 4, 12], [512, 4096, 32768], 50.0)
    assert region.cost_ms.shape == (3, 3)
    # More decodes or a longer prompt never make offloading less attractive here (a one-chunk prompt
    # whose step waits on the host's launches costs the same at 512 as at 4096 tokens).
    assert np.all(np.diff(region.cost_ms, axis=0) > 0) and np.all(np.diff(region.cost_ms, axis=1) >= 0)
    assert np.all(region.cost_ms[:, -1] > region.cost_ms[:, 0])
    assert region.offload[2, 2] and not region.offload[0, 0]
