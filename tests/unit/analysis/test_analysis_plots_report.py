"""Plots render to PNG and SVG and say MODELLED; the HTML report is self-contained."""

from __future__ import annotations

import math
import re

import pytest
from matplotlib.colors import LogNorm

from pdexporter.analysis.job import analyse
from pdexporter.analysis.plots import all_plots, breakeven, heatmap, write_plots
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
    scripts = re.findall(r"<script([^>]*)>", html)
    assert scripts == [""]  # one inline script (table sorting), nothing loaded from anywhere
    assert "@import" not in html and "url(" not in html
    assert 'id="plot-heatmap_penalty_ratio"' in html
    for c in modelled_analysis.criteria:
        assert c.figure.replace(">", "&gt;") in html or c.figure in html
    assert "context_aware" in html and "beta_ms_per_token_pair" in html
    assert html.count("<tr>") > len(modelled_analysis.table)  # the whole table is there


def test_heatmap_uses_a_log_scale_and_prints_every_value(modelled_analysis):
    table = modelled_analysis.table
    plot = heatmap(table)
    panels = [ax for ax in plot.figure.axes if ax.images]
    assert len(panels) == table["chunk_size"].nunique()
    ratios = table["penalty_ratio"].dropna()
    assert ratios.max() / ratios.min() > 5  # a spread a linear scale would wash out
    for ax in panels:
        (image,) = ax.images
        assert isinstance(image.norm, LogNorm)
        assert image.norm.vmin == pytest.approx(ratios.min()) and image.norm.vmax == pytest.approx(ratios.max())
        b = int(ax.get_title().split("B=")[1])
        shown = sorted(float(t.get_text()) for t in ax.texts)
        expected = sorted(table[(table["chunk_size"] == b) & table["penalty_ratio"].notna()]["penalty_ratio"])
        assert shown == pytest.approx(expected, rel=0.01)  # every cell printed (2-3 significant digits)
        # D = 0 has no ratio anywhere: its row is left out rather than drawn as a grey band
        assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "4", "8"]
        # the colour of a 2x point and a 20x point differ on the scale's position by their log ratio
        low, high = float(image.norm(ratios.min())), float(image.norm(ratios.max()))
        assert (low, high) == (0.0, 1.0)
        mid = math.sqrt(ratios.min() * ratios.max())
        assert float(image.norm(mid)) == pytest.approx(0.5)
    colourbar = plot.figure.axes[-1]
    assert "log scale" in colourbar.get_ylabel()


def test_breakeven_legend_says_modelled_or_measured(modelled_analysis, measured_analysis):
    for analysis, word in ((modelled_analysis, "modelled"), (measured_analysis, "measured")):
        plot = breakeven(analysis.table, analysis.fits.best.model, 8192, 50.0)
        labels = [t.get_text() for t in plot.figure.axes[0].get_legend().get_texts()]
        assert labels == [f"{word}: offload wins (> 50 ms)", f"{word}: keep local"]


def test_report_table_is_full_height_and_sortable(modelled_analysis):
    html = render_report(modelled_analysis)
    assert '<table id="interference-table" class="sortable">' in html
    assert 'class="scroll"' not in html  # no small scroll box around it
    assert "tpot_<wbr>penalty_<wbr>ms" in html


def test_report_table_ends_with_the_bootstrap_intervals(modelled_analysis):
    """The report's table is the interference table: its last headers are the 95 % intervals, and
    a row with a penalty shows one."""
    from pdexporter.analysis.table import CI_COLUMNS

    html = render_report(modelled_analysis).replace("<wbr>", "")
    heads = [re.findall(r"<th[^>]*>([^<]*)</th>", head) for head in re.findall(r"<thead>(.*?)</thead>", html)]
    (data,) = [h for h in heads if h[:3] == ["chunk_size", "decode_batch_size", "new_prefill_tokens"]]
    assert data == list(modelled_analysis.table.columns) and tuple(data[-len(CI_COLUMNS):]) == CI_COLUMNS
    row = modelled_analysis.table.dropna(subset=["tpot_penalty_ms_ci95_low"]).iloc[0]
    assert row["tpot_penalty_ms_ci95_low"] <= row["tpot_penalty_ms"] <= row["tpot_penalty_ms_ci95_high"]


@pytest.mark.slow
def test_report_renders_both_arms_of_the_committed_h200_data() -> None:
    """The DecodeBench arm measured no KV transfer (its integer columns hold pandas' NA): the
    report's both-arms section must still render (it once raised on NA)."""
    from pathlib import Path

    from pdexporter.analysis.job import analyse, load_results
    from pdexporter.analysis.report import render_report

    root = Path(__file__).parents[3] / "results"
    colocated, offloaded = (
        root / "h200-vllm0.22-qwen3-coder-30b-a3b",
        root / "h200-vllm0.22-qwen3-coder-30b-a3b-decodebench",
    )
    analysis = analyse(load_results(colocated), source=str(colocated), offloaded=load_results(offloaded),
                       offloaded_source=str(offloaded))
    html_text = render_report(analysis, plots=[])
    assert 'id="arms-table"' in html_text and "DecodeBench" in html_text
    # issue 24: the table showed `n/a` for missing floats and `<NA>` for missing integers
    assert "&lt;NA&gt;" not in html_text and "<NA>" not in html_text and ">n/a<" in html_text


def _drawn(plot):  # type: ignore[no-untyped-def]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(plot.figure).draw()
    return plot


@pytest.mark.parametrize(("low", "high"), [(8.2, 11.9), (9.0, 11.5), (2.2, 19.0), (3.8, 9.0), (1.05, 1.3)])
def test_a_narrow_log_colour_bar_has_at_least_three_labels(modelled_analysis, low: float, high: float) -> None:
    """Issue 24: a ratio range inside one 1-2-5 step (8.2 to 11.9) got a colour bar with the one label 10."""
    table = modelled_analysis.table.copy()
    ratios = table["penalty_ratio"]
    table["penalty_ratio"] = low + (ratios - ratios.min()) / (ratios.max() - ratios.min()) * (high - low)
    bar = _drawn(heatmap(table)).figure.axes[-1]
    shown = [t.get_text() for t, y in zip(bar.get_yticklabels(), bar.get_yticks())
             if low * 0.999 <= y <= high * 1.001 and t.get_text()]
    assert len(shown) >= 3, shown


def test_breakeven_shows_whole_decodes_and_whole_markers(modelled_analysis) -> None:
    """Issue 24: D axes read 1.5, 2.5 with few decode batch sizes; the outer points' markers were cut
    in half at the plot's edges."""
    from pdexporter.analysis.job import analyse
    from pdexporter.analysis.synthetic import SyntheticTruth, seed_grid, synthetic_records

    grid = list(seed_grid(chunks=(8192,), decodes=(0, 1, 2, 3), prefills=(2048, 4096, 8192)))
    small = analyse([samples_from_record(r) for r in synthetic_records(SyntheticTruth(), grid, reps=2)], source="s")
    ax = _drawn(breakeven(small.table, small.fits.best.model, 8192, 50.0)).figure.axes[0]
    assert all(float(y).is_integer() for y in ax.get_yticks())
    left, right = ax.get_xlim()
    assert left < 2048 and right > 8192  # the outer points sit inside the axes, not on their edge
    from matplotlib.collections import PathCollection

    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(points) == 2 and all(not c.get_clip_on() for c in points)  # the markers are drawn whole


def test_a_results_directory_of_one_decode_batch_size_gets_its_break_even_plot() -> None:
    """The secrets audit's aside: `report` on one `measure` (D = 1) raised matplotlib's "Input z must
    be at least a (2, 2) shaped array": the break-even map had one row of D."""
    grid = list(seed_grid(chunks=(8192,), decodes=(1,), prefills=(512,)))
    one = analyse([samples_from_record(r) for r in synthetic_records(SyntheticTruth(), grid, reps=2)], source="s")
    ax = _drawn(breakeven(one.table, one.fits.best.model, 8192, 50.0)).figure.axes[0]
    bottom, top = ax.get_ylim()
    assert bottom <= 1 and top >= 2  # D 1 and 2: a grid a contour can be drawn on
