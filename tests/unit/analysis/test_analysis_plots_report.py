"""Plots render to PNG and SVG and say MODELLED; the HTML report is self-contained."""

from __future__ import annotations

import re

import pytest

from pdexporter.analysis.job import analyse
from pdexporter.analysis.plots import all_plots, write_plots
from pdexporter.analysis.report import render_report
from pdexporter.analysis.synthetic import SyntheticTruth, seed_grid, synthetic_records
from pdexporter.analysis.table import samples_from_record

GRID = list(seed_grid(chunks=(2048, 8192), decodes=(0, 1, 4, 8), prefills=(512, 4096, 32768)))


@pytest.fixture(scope="module")
def modelled_analysis():
    samples = [samples_from_record(r) for r in synthetic_records(SyntheticTruth(), GRID, reps=2)]
    return analyse(samples, source="synthetic")


@pytest.fixture(scope="module")
def measured_analysis():
    records = synthetic_records(SyntheticTruth(), GRID, reps=2)
    for r in records:  # pretend these came from a GPU, to check the label goes away
        r.config.modelled = False
        r.config.engine = "vllm"
        r.config.note = None
    return analyse([samples_from_record(r) for r in records], source="gpu")


def test_plots_render_png_and_svg_and_say_modelled(modelled_analysis, tmp_path):
    plots = all_plots(modelled_analysis.table, modelled_analysis.fits.best.model, 50.0)
    assert [p.name for p in plots] == ["heatmap_penalty_ratio", "chunk_sensitivity", "breakeven_8192"]
    for p in plots:
        assert p.title.startswith("MODELLED")
    paths = write_plots(plots, tmp_path)
    assert len(paths) == 6
    for path in paths:
        data = path.read_bytes()
        if path.suffix == ".png":
            assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
        else:
            text = data.decode()
            assert "<svg" in text and "MODELLED" in text


def test_measured_data_is_not_labelled_modelled(measured_analysis):
    plots = all_plots(measured_analysis.table, measured_analysis.fits.best.model, 50.0)
    assert all("MODELLED" not in p.title for p in plots)
    html = render_report(measured_analysis, plots)
    assert 'id="modelled-banner"' not in html and "(MODELLED)" not in html


def test_report_is_self_contained_with_banner(modelled_analysis):
    html = render_report(modelled_analysis)
    assert 'id="modelled-banner"' in html and "SYNTHETIC" in html
    # every src/href is inline data; no scripts, stylesheets or fonts from anywhere
    refs = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', html)
    assert refs and all(r.startswith("data:image/png;base64,") for r in refs)
    assert "<script" not in html and "@import" not in html and "url(" not in html
    assert 'id="plot-heatmap_penalty_ratio"' in html
    for c in modelled_analysis.criteria:
        assert c.figure.replace(">", "&gt;") in html or c.figure in html
    assert "context_aware" in html and "beta_ms_per_token_pair" in html
    assert html.count("<tr>") > len(modelled_analysis.table)  # the whole table is there
