"""The seed's plots, built on matplotlib's object API with the Agg canvas (no pyplot, no display).

- `heatmap_penalty_ratio`: penalty ratio over (P, D), one panel per chunk size B, one logarithmic
  colour scale (ratios span 1.1 to hundreds), the value printed in every cell.
- `chunk_sensitivity`: for a fixed D, total prefill duration, per-step TPOT penalty and aggregate
  interference against chunk size, one line per P (the seed's deliverable 4).
- `breakeven_<B>`: where offloading wins for a transfer budget at chunk size B (8192 by default):
  the fitted model's cost over (D, P), the budget's contour, and the grid's points on top (called
  "measured" or "modelled", as the records are).

Every figure built from modelled data says MODELLED in its title. Figures are rendered to PNG
and SVG bytes; writing them is the caller's (atomic) business.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

__all__ = [
    "DPI",
    "FORMATS",
    "MODELLED_TAG",
    "PLOTS_WITH_MODEL",
    "EnoughLogTicks",
    "Plot",
    "all_plots",
    "arms_plot",
    "breakeven",
    "breakeven_chunk",
    "chunk_sensitivity",
    "grid_heatmap",
    "heatmap",
    "passive_convergence",
    "sensitivity_decode",
    "write_plots",
]

matplotlib.use("Agg")  # harmless when already Agg; we never touch pyplot

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, Locator, MaxNLocator, NullFormatter

from pdexporter._internal.atomic import atomic_write_bytes
from pdexporter.analysis.breakeven import DEFAULT_TRANSFER_MS, offload_region
from pdexporter.analysis.models import CostModel
from pdexporter.engines import DEFAULT_CHUNK_SIZE

FORMATS = ("png", "svg")
MODELLED_TAG = "MODELLED"
DPI = 100


@dataclass(frozen=True)
class Plot:
    name: str
    title: str
    figure: Figure

    def render(self, fmt: str) -> bytes:
        buffer = io.BytesIO()
        FigureCanvasAgg(self.figure)
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "pdexporter"}):
            self.figure.savefig(buffer, format=fmt, dpi=DPI, metadata=_metadata(fmt))
        return buffer.getvalue()


def _metadata(fmt: str) -> dict[str, str | None]:
    # Keep the bytes reproducible: no creation dates in the files.
    if fmt == "svg":
        return {"Date": None}
    if fmt == "png":
        return {"Software": None}
    return {}


# Plain numbers on log axes: matplotlib's default 10^k labels go through mathtext, which costs
# more than drawing the rest of a figure.
_PLAIN = FuncFormatter(lambda value, _pos: f"{value:g}")


class EnoughLogTicks(Locator):
    """Ticks of a logarithmic axis, at least `least` of them inside the view: 1-2-5 steps per
    decade; within a decade (ratios 3.8 to 9 gave a colour bar with the single label 5), every
    whole step (3, 4, ..., 9); within a step, evenly spaced round values."""

    def __init__(self, least: int = 3) -> None:
        self.least = least

    def __call__(self) -> Sequence[float]:
        vmin, vmax = self.axis.get_view_interval() if self.axis is not None else (1.0, 10.0)
        return self.tick_values(vmin, vmax)

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        lo, hi = sorted((float(vmin), float(vmax)))
        if not (lo > 0 and math.isfinite(hi)):
            return MaxNLocator(5).tick_values(lo, hi)
        decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        ticks: list[float] = []
        for subs in ((1.0, 2.0, 5.0), tuple(float(m) for m in range(1, 10))):
            ticks = [m * 10.0**k for k in decades for m in subs if lo * (1 - 1e-9) <= m * 10.0**k <= hi * (1 + 1e-9)]
            if len(ticks) >= self.least:
                return ticks
        steps = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10], min_n_ticks=self.least)
        return [t for t in steps.tick_values(lo, hi) if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9) and t > 0] or ticks


def _plain_log_axis(axis, decimal: bool = True) -> None:
    if decimal:  # 1-2-5 steps, more where a decade holds fewer than three (EnoughLogTicks)
        axis.set_major_locator(EnoughLogTicks())
    axis.set_major_formatter(_PLAIN)
    axis.set_minor_formatter(NullFormatter())


def _title(text: str, modelled: bool) -> str:
    return f"{MODELLED_TAG}: {text}" if modelled else text


def _modelled(frame: pd.DataFrame) -> bool:
    return bool(frame["modelled"].any()) if len(frame) else False


def heatmap(table: pd.DataFrame) -> Plot:
    """One panel per chunk size, one colour scale for all, so chunk sizes compare at a glance. The
    scale is logarithmic: ratios span 1.1 to hundreds, and 3x must not look like 50x."""
    title = _title("TPOT penalty ratio (penalty / baseline) over P x D, per chunk size", _modelled(table))
    return grid_heatmap(table, "penalty_ratio", "penalty ratio (penalty / baseline), log scale", title,
                        "heatmap_penalty_ratio", log=True)


def _cell_text(v: float) -> str:
    if not math.isfinite(v):
        return "n/a"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def grid_heatmap(table: pd.DataFrame, column: str, label: str, title: str, name: str, *,
                 cmap: str = "magma_r", symmetric: bool = False, log: bool = False) -> Plot:
    """`column` over (P, D), one panel per chunk size, one colour scale, the value printed in every
    cell. `log` spaces the colours by ratio (when every value is > 0); `symmetric` centres a linear
    scale on 0 (a change: one colour for less, another for more). Rows of D with no value in any
    panel (penalty ratios at D = 0) are left out."""
    sizes = sorted(int(b) for b in table["chunk_size"].unique())
    values_of = pd.to_numeric(table[column], errors="coerce")
    with_value = table[np.isfinite(values_of.to_numpy(np.float64))]
    decodes = sorted(int(d) for d in with_value["decode_batch_size"].unique()) or \
        sorted(int(d) for d in table["decode_batch_size"].unique())
    prefills = sorted(int(p) for p in table["new_prefill_tokens"].unique())
    ncols = min(len(sizes), 2) or 1
    nrows = max(math.ceil(len(sizes) / ncols), 1)
    panel_w = 0.85 * max(len(prefills), 4) + 1.3
    panel_h = 0.48 * max(len(decodes), 4) + 1.2
    width = ncols * panel_w + 1.4
    # A title wider than a small grid is wrapped, not cut at both edges (~8.5 characters an inch).
    title = textwrap.fill(title, width=max(30, int(width * 8.5)))
    lines = title.count("\n") + 1
    height = nrows * panel_h + 1.2 + 0.25 * (lines - 1)
    fig = Figure(figsize=(width, height))
    # Margins in inches, so a one-row grid keeps room for the title and the axis label.
    fig.subplots_adjust(left=0.07, right=0.87, bottom=0.6 / height, top=1 - (0.5 + 0.25 * lines) / height,
                        wspace=0.22, hspace=0.42 * 4 / max(nrows * panel_h, 4))
    finite = values_of.to_numpy(np.float64)
    finite = finite[np.isfinite(finite)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    norm: Normalize
    if symmetric:
        vmax = max(abs(vmin), abs(vmax)) or 1.0
        norm = Normalize(-vmax, vmax)
    elif log and finite.size and vmin > 0:
        norm = LogNorm(vmin, max(vmax, vmin * 1.01))
    else:
        norm = Normalize(vmin, vmax if vmax > vmin else vmin + 1.0)
    colours = matplotlib.colormaps[cmap].with_extremes(bad="#dddddd")
    image = None
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax, b in zip(axes.ravel(), sizes):
        rows = table[table["chunk_size"] == b]
        values = np.full((len(decodes), len(prefills)), np.nan)
        row_of = {d: i for i, d in enumerate(decodes)}
        col_of = {p: j for j, p in enumerate(prefills)}
        for d, p, value in zip(rows["decode_batch_size"], rows["new_prefill_tokens"], pd.to_numeric(rows[column])):
            if int(d) in row_of:
                values[row_of[int(d)], col_of[int(p)]] = value
        shown = np.ma.masked_invalid(np.where(values > 0, values, np.nan) if isinstance(norm, LogNorm) else values)
        image = ax.imshow(shown, cmap=colours, norm=norm, aspect="auto", origin="lower")
        ax.set_xticks(range(len(prefills)), [_tokens(p) for p in prefills], fontsize=9)
        ax.set_yticks(range(len(decodes)), [str(d) for d in decodes], fontsize=9)
        ax.set_xlabel("new_prefill_tokens (P)", fontsize=9)
        ax.set_ylabel("decode_batch_size (D)", fontsize=9)
        ax.set_title(f"chunk size B={b}", fontsize=10)
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                v = values[i, j]
                dark = math.isfinite(v) and not np.ma.is_masked(shown[i, j]) and (
                    abs(float(norm(v)) - 0.5) > 0.3 if symmetric else float(norm(v)) > 0.55)
                ax.text(j, i, _cell_text(v), ha="center", va="center", fontsize=8.5,
                        color="white" if dark else "black")
    for ax in axes.ravel()[len(sizes):]:
        ax.set_visible(False)
    if image is not None:
        cax = fig.add_axes((0.895, 0.15, 0.018, 0.7))
        bar = fig.colorbar(image, cax=cax, label=label)
        if isinstance(norm, LogNorm):
            _plain_log_axis(bar.ax.yaxis)
    fig.suptitle(title)
    return Plot(name, title, fig)


def _tokens(p: float) -> str:
    p = int(p)
    return f"{p // 1024}K" if p >= 1024 and p % 1024 == 0 else str(p)


def sensitivity_decode(table: pd.DataFrame, preferred: int = 4) -> int | None:
    """The D for the sensitivity plot: `preferred` if it has two or more chunk sizes, else the nearest that does."""
    rows = table[table["decode_batch_size"] >= 1]
    counts = rows.groupby("decode_batch_size")["chunk_size"].nunique()
    # pandas-stubs types the index's labels as Hashable; here they are D values
    candidates = [int(d) for d, n in counts.items() if n >= 2] or [int(d) for d in counts.index]  # type: ignore[call-overload]
    if not candidates:
        return None
    return min(candidates, key=lambda d: (abs(d - preferred), d))


def chunk_sensitivity(table: pd.DataFrame, decode_batch_size: int | None = None) -> Plot:
    d = decode_batch_size if decode_batch_size is not None else sensitivity_decode(table)
    rows = table[table["decode_batch_size"] == d] if d is not None else table.iloc[0:0]
    fig = Figure(figsize=(15, 4.6))
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.14, top=0.86, wspace=0.28)
    axes = fig.subplots(1, 3)
    panels = (
        ("prefill_duration_ms", "total prefill duration (ms)"),
        ("tpot_penalty_ms", "TPOT penalty during the prefill (ms)"),
        ("aggregate_interference_ms", "aggregate interference (ms, D x per stream)"),
    )
    p: Any  # pandas-stubs types a group key as any scalar; here a prompt length
    for ax, (column, label) in zip(axes, panels):
        for p, group in rows.sort_values("chunk_size").groupby("new_prefill_tokens"):
            ax.plot(group["chunk_size"], group[column], marker="o", label=f"P={_tokens(p)}")
        ax.set_xscale("log", base=2)
        _plain_log_axis(ax.xaxis, decimal=False)
        sizes = sorted(int(b) for b in rows["chunk_size"].unique())
        if sizes:
            ax.set_xticks(sizes, [str(b) for b in sizes])
            ax.minorticks_off()
        ax.set_xlabel("chunk size B (max_num_batched_tokens)")
        ax.set_ylabel(label)
        if column != "tpot_penalty_ms" and len(rows) and (rows[column] > 0).any():
            ax.set_yscale("log")
            _plain_log_axis(ax.yaxis)
        ax.grid(True, which="both", alpha=0.3)
    if len(rows):
        axes[2].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.subplots_adjust(right=0.92)
    title = _title(f"Chunk-size sensitivity at D={d}: fewer, longer chunks vs more, shorter ones", _modelled(rows))
    fig.suptitle(title)
    return Plot("chunk_sensitivity", title, fig)


def breakeven(table: pd.DataFrame, model: CostModel, chunk_size: int = DEFAULT_CHUNK_SIZE,
              transfer_ms: float = DEFAULT_TRANSFER_MS) -> Plot:
    rows = table[(table["chunk_size"] == chunk_size) & (table["decode_batch_size"] >= 1)]
    fitted = table[table["decode_batch_size"] >= 1]
    d_max = int(max(fitted["decode_batch_size"].max(), 1)) if len(fitted) else 12
    p_lo = float(fitted["new_prefill_tokens"].min()) if len(fitted) else 512.0
    p_hi = float(fitted["new_prefill_tokens"].max()) if len(fitted) else 32768.0
    p_lo, p_hi = min(p_lo, p_hi / 2), max(p_hi, p_lo * 2)
    decodes = np.arange(1, max(d_max, 2) + 1)  # two rows at least: a contour needs a (2, 2) grid
    # a quarter of an octave past the outer grid points, so their markers are not cut at the edges
    prefills = np.unique(np.geomspace(p_lo / 2**0.25, p_hi * 2**0.25, 120).round())
    region = offload_region(model, chunk_size, decodes, prefills, transfer_ms)
    fig = Figure(figsize=(9, 5.6))
    fig.subplots_adjust(left=0.08, right=0.93, bottom=0.18, top=0.92)
    ax = fig.add_subplot()
    cost = np.clip(region.cost_ms, 1e-3, None)
    mesh = ax.pcolormesh(prefills, decodes, cost, norm=LogNorm(vmin=cost.min(), vmax=max(cost.max(), cost.min() * 10)),
                         cmap="viridis", shading="nearest", rasterized=True)
    bar = fig.colorbar(mesh, ax=ax, pad=0.02, label=f"aggregate interference (ms), {model.name} model")
    _plain_log_axis(bar.ax.yaxis)
    if (region.cost_ms > transfer_ms).any() and (region.cost_ms <= transfer_ms).any():
        ax.contour(prefills, decodes, region.cost_ms, levels=[transfer_ms], colors="white", linewidths=2)
    ax.contourf(prefills, decodes, region.offload.astype(float), levels=[0.5, 1.5], colors="none", hatches=["//"])
    wins = rows[rows["aggregate_interference_ms"] > transfer_ms]
    loses = rows[~(rows["aggregate_interference_ms"] > transfer_ms)]
    seen = "modelled" if _modelled(rows if len(rows) else table) else "measured"
    ax.scatter(wins["new_prefill_tokens"], wins["decode_batch_size"], marker="o", s=50, c="red",
               edgecolors="white", label=f"{seen}: offload wins (> {transfer_ms:g} ms)", clip_on=False, zorder=3)
    ax.scatter(loses["new_prefill_tokens"], loses["decode_batch_size"], marker="o", s=50, facecolors="none",
               edgecolors="red", label=f"{seen}: keep local", clip_on=False, zorder=3)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # D is a count: no D = 1.5
    ax.set_xscale("log", base=2)
    _plain_log_axis(ax.xaxis, decimal=False)
    ticks = sorted(int(p) for p in fitted["new_prefill_tokens"].unique()) if len(fitted) else []
    if ticks:
        ax.set_xticks(ticks, [_tokens(p) for p in ticks])
        ax.minorticks_off()
    ax.set_xlabel("new_prefill_tokens (P)")
    ax.set_ylabel("decode_batch_size (D)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8, frameon=False)
    title = _title(f"Offload wins (hatched) where interference > {transfer_ms:g} ms transfer, B={chunk_size}",
                   _modelled(table))
    ax.set_title(title)
    return Plot(f"breakeven_{chunk_size}", title, fig)


def breakeven_chunk(table: pd.DataFrame, preferred: int = DEFAULT_CHUNK_SIZE) -> int:
    sizes = sorted(int(b) for b in table["chunk_size"].unique())
    if not sizes or preferred in sizes:
        return preferred
    return min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(preferred)), s))


PLOTS_WITH_MODEL = 3  # heatmap, chunk sensitivity, break-even


def all_plots(table: pd.DataFrame, model: CostModel | None, transfer_ms: float = DEFAULT_TRANSFER_MS) -> list[Plot]:
    plots = [heatmap(table), chunk_sensitivity(table)]
    if model is not None:
        plots.append(breakeven(table, model, breakeven_chunk(table), transfer_ms))
    return plots


def write_plots(plots: Iterable[Plot], out_dir: str | Path, formats: Iterable[str] = FORMATS) -> list[Path]:
    out = Path(out_dir)
    written = []
    for plot in plots:
        for fmt in formats:
            written.append(atomic_write_bytes(out / f"{plot.name}.{fmt}", plot.render(fmt)))
    return written


def arms_plot(joined: pd.DataFrame, doc: dict | None = None) -> Plot | None:
    """Both arms (docs/disaggregation.md): per D, the decode time offloading saves (colocated -
    offloaded aggregate interference, solid) and what the request pays in TTFT (offloaded -
    colocated TTFT, dashed) over P, measured points; offloading wins where solid is above dashed.
    With `doc` (decision.json with `two_arm`), the models' curves (thin) and the measured transfer."""
    from pdexporter.analysis.decision_eval import evaluate_decision

    rows = joined[(joined["decode_batch_size"] >= 1) & joined["offloaded_aggregate_interference_ms"].notna()]
    if not len(rows):
        return None
    b = int(rows["chunk_size"].max())
    rows = rows[rows["chunk_size"] == b]
    fig = Figure(figsize=(8.5, 5.0))
    fig.subplots_adjust(left=0.1, right=0.78, top=0.88, bottom=0.12)
    ax = fig.subplots()
    colours = matplotlib.colormaps["viridis"]
    decodes = sorted(int(d) for d in rows["decode_batch_size"].unique())
    for i, d in enumerate(decodes):
        part = rows[rows["decode_batch_size"] == d].sort_values("new_prefill_tokens")
        colour = colours(i / max(len(decodes) - 1, 1))
        p = part["new_prefill_tokens"].to_numpy(np.float64)
        saved = (part["aggregate_interference_ms"] - part["offloaded_aggregate_interference_ms"]).to_numpy(np.float64)
        ax.plot(p, saved, "o-", color=colour, label=f"D={d} saved")
        offloaded_ttft = part["offloaded_ttft_ms"] if part["offloaded_ttft_ms"].notna().any() else None
        if offloaded_ttft is not None:
            cost = (offloaded_ttft - part["colocated_ttft_ms"]).to_numpy(np.float64)
            ax.plot(p, cost, "s--", color=colour, label=f"D={d} TTFT cost")
        if doc and doc.get("two_arm"):
            grid = np.geomspace(max(64.0, p.min() / 2), p.max() * 1.5, 40)
            model = [evaluate_decision(doc, d, int(x), b, mode="two-arm") for x in grid]
            ax.plot(grid, [m["saved_ms"] for m in model], "-", color=colour, lw=0.8, alpha=0.6)
            ax.plot(grid, [m["ttft_cost_ms"] for m in model], "--", color=colour, lw=0.8, alpha=0.6)
    ax.set_xscale("log")
    _plain_log_axis(ax.xaxis, decimal=False)
    lowest = min((float(np.nanmin(np.asarray(line.get_ydata(), dtype=np.float64))) for line in ax.get_lines()),
                 default=1.0)
    if lowest > 0:
        ax.set_yscale("log")
    else:  # offloading can shorten the request's TTFT, or cost the decodes more: negative values
        ax.set_yscale("symlog", linthresh=10)
    ax.set_xlabel("new_prefill_tokens (P)")
    ax.set_ylabel("ms")
    transfer = ((doc or {}).get("two_arm", {}).get("terms") or {}).get("transfer", {}) if doc else {}
    note = (f"; transfer {transfer.get('latency_ms')} ms + {transfer.get('gb_per_s')} GB/s (measured)"
            if transfer.get("source") == "measured" else "")
    ax.set_title(_title(f"Offloading: decode time saved vs TTFT paid, B={b}{note}", _modelled(joined)), fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, which="both", alpha=0.3)
    return Plot("arms_saved_vs_ttft", ax.get_title(), fig)


def passive_convergence(series: Sequence[Any], modelled: bool = False, goal: float = 0.15) -> Plot:
    """Passive mode's answer as traffic comes (`analysis.passive_model.Convergence` per refit):
    left, the error of the predicted aggregate interference against the injected table of the same
    engine over the reached cells (mean and median |relative error|, the goal dashed), when an
    injected table was given; right, the median relative half-width of the 95 % intervals and the
    events behind the fit."""
    minutes = [c.minutes for c in series]
    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    errors = [(c.minutes, c.errors) for c in series if c.errors is not None and c.errors.mape is not None]
    if errors:
        left.plot([m for m, _ in errors], [e.mape * 100 for _, e in errors], "o-", label="mean |error| (MAPE)")
        left.plot([m for m, _ in errors], [e.median * 100 for _, e in errors], "s--", label="median |error|")
        left.axhline(goal * 100, color="grey", ls=":", label=f"goal {goal:.0%}")
        left.set_ylim(bottom=0)
        left.legend(fontsize=8)
    else:
        left.text(0.5, 0.5, "no injected table given\n(export-table --injected DIR)", ha="center", va="center",
                  transform=left.transAxes)
    left.set_xlabel("minutes of traffic")
    left.set_ylabel("% vs injected, reached cells")
    left.set_title("prediction error vs injection", fontsize=9)
    widths = [(c.minutes, c.halfwidth) for c in series if c.halfwidth is not None]
    right.plot([m for m, _ in widths], [w * 100 for _, w in widths], "o-", color="tab:purple",
               label="95 % interval half-width (median over reached cells)")
    right.set_ylim(bottom=0)
    right.set_xlabel("minutes of traffic")
    right.set_ylabel("% of the prediction")
    events = right.twinx()
    events.plot(minutes, [c.events for c in series], "^:", color="tab:green", label="events used")
    events.set_ylabel("events")
    events.set_ylim(bottom=0)
    right.set_title("how sure the passive answer is", fontsize=9)
    handles = right.get_legend_handles_labels()[0] + events.get_legend_handles_labels()[0]
    labels = right.get_legend_handles_labels()[1] + events.get_legend_handles_labels()[1]
    right.legend(handles, labels, fontsize=8, loc="upper right")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    title = _title("Passive mode: the event-fitted model as traffic comes", modelled)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return Plot("passive_convergence", title, fig)
