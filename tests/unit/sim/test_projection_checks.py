"""The checks a projected profile quotes (`pdexporter.sim.projection_checks`) are the committed comparisons:
each figure recomputed from its `comparison*.csv`, each grid's projection the learned rule's, made before the
run from references that never read the model; and a projected profile says them for its GPU, or that none
was made there."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest

from pdexporter.sim.modelconfig import load_config, profile_from_config
from pdexporter.sim.projection_checks import CHECKS, QUANTITIES, checked_line, checks_for

RESULTS = Path(__file__).resolve().parents[3] / "results"


@pytest.mark.parametrize("check", CHECKS, ids=[f"{c.results}/{c.comparison}" for c in CHECKS])
def test_each_checks_figures_are_its_committed_comparison(check) -> None:
    rows = list(csv.DictReader((RESULTS / check.results / check.comparison).open()))
    assert len(rows) == check.configurations
    for q in QUANTITIES:
        errors = [abs(float(r[f"{q} err"])) for r in rows if r[f"{q} err"]]
        assert check.figure(q) == pytest.approx(100 * statistics.fmean(errors), abs=0.05), q
    doc = json.loads((RESULTS / check.predictions_file).read_text())
    assert doc["calibration"] == "projected" and "(learned rule, from " in doc["profile"]
    references = doc["profile"].split("(learned rule, from ")[1].rstrip(")").split(",")
    assert references and not any(check.model.split("-instruct")[0] in r for r in references)


def test_a_projected_profile_says_what_such_projections_missed_by_on_its_gpu() -> None:
    cfg, source = load_config("llama-3.2-3b-instruct")
    h100 = profile_from_config(cfg, "H100", model_name="llama-3.2-3b-instruct", source=source)
    line = h100.provenance["checked"]
    worst = max(c.figure("aggregate_interference") for c in checks_for("H100", besides="llama-3.2-3b-instruct"))
    assert f"-{worst:g} %" in line and "on an H100" in line and "qwen3-8b" in line and "llama-3.2-3b" not in line
    assert line in h100.calibration_note
    carried = profile_from_config(cfg, "H100", model_name="llama-3.2-3b-instruct", source=source, rule="carry")
    assert carried.provenance["checked"].endswith("which they did not score")
    a100 = profile_from_config(cfg, "A100", model_name="llama-3.2-3b-instruct", source=source)
    assert a100.provenance["checked"].startswith("no projection of an unseen model was checked on an A100")
    assert checked_line("a100") == a100.provenance["checked"].replace("A100", "a100")


def test_a_checked_models_own_profile_quotes_the_other_models() -> None:
    cfg, source = load_config("qwen3-8b")
    line = profile_from_config(cfg, "H100", model_name="qwen3-8b", source=source).provenance["checked"]
    assert "qwen3-8b" not in line and "on 3 model(s)" in line and "17 grid(s)" in line
