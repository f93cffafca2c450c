"""The context-aware model's bootstrap replicates (`models.bootstrap_context`), decision.json's intervals: a replicate
that draws every grid point once is the full fit, and the full fit sits inside its replicates' spread, not at its
edge (before session 30 the stall stage of every replicate was fitted on the final model's residuals: every
replicate of session 29's grid on graphs lay above the central fit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pdexporter.analysis import models as md
from pdexporter.analysis.decision_eval import chunk_context, colocated_cost
from pdexporter.analysis.job import load_results
from pdexporter.analysis.table import build_table

# a real grid whose stall stage chose a saturation and an onset (8192 and 3072 tokens): session 29's on graphs
GRID = Path(__file__).resolve().parents[3] / "results" / "h100-vllm0.22-qwen3-coder-30b-a3b-1gpu-graphs"


@pytest.fixture(scope="module")
def fitted() -> tuple[md.FitData, md.ContextAwareModel]:
    samples = load_results(GRID)
    data = md.fit_data(build_table(samples), samples)
    model = md.fit_context_model(data)
    assert model.sigma_saturation_tokens is not None and model.sigma_onset_tokens > 0  # what the old stage missed
    return data, model


class _EveryPointOnce:
    """A generator whose every draw is each grid point once (the identity resample)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def integers(self, low: int, high: int, size: int) -> np.ndarray:
        return np.arange(self.n)


def test_a_replicate_of_every_point_once_is_the_full_fit(fitted, monkeypatch):
    data, model = fitted
    assert model.n_step_rows and model.catchup_steps is not None
    monkeypatch.setattr(md.np.random, "default_rng", lambda seed: _EveryPointOnce(len(data)))
    (replicate,) = md.bootstrap_context(data, model, replicates=1)
    central = model.to_dict()["coefficients"]
    assert replicate.keys() == central.keys()
    for name, value in central.items():
        assert replicate[name] == pytest.approx(value, rel=1e-6, abs=1e-9), name


def test_the_full_fit_lies_inside_its_replicates(fitted):
    data, model = fitted
    replicates = md.bootstrap_context(data, model, replicates=60)
    doc = model.document()
    for d, p, b in ((4, 512, 8192), (12, 1024, 8192), (4, 4096, 8192), (12, 16384, 8192)):
        ctx = chunk_context(doc, d, p, b)
        central = colocated_cost(doc, ctx)[0]
        values = np.array([colocated_cost(doc, ctx, k)[0] for k in replicates])
        below = float(np.mean(values < central))
        assert 0.1 <= below <= 0.9, (d, p, b, below)
