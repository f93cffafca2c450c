"""`pdexporter compare BEFORE AFTER`: what an engine change did to each configuration's cost.

Both directories are results directories (records); their tables are built as export-table builds
them and compared where they share a configuration. Writes comparison.csv, comparison.json and
plots/compare_<metric>.png|svg (change in % over P x D, per chunk size).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from pdexporter.cli._common import console
from pdexporter.cli.export_table import progress_bar

PLOTTED = ("tpot_penalty_ms", "prefill_duration_ms")


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)


def compare(
    before: Annotated[Path, typer.Argument(help="Results directory measured before the change.")],
    after: Annotated[Path, typer.Argument(help="Results directory measured after it.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("results/comparison"),
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the change heatmaps.")] = True,
) -> None:
    """Per configuration: penalty, prefill duration, aggregate interference and baseline, before and after."""
    from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
    from pdexporter._internal.writable import check_writable
    from pdexporter.analysis.compare import compare_tables, distinct_names, summarise
    from pdexporter.analysis.job import load_results, record_paths
    from pdexporter.analysis.table import any_modelled, build_table

    check_writable(out)
    started = time.perf_counter()
    total = len(record_paths(before)) + len(record_paths(after)) + (len(PLOTTED) if plots else 0)
    with progress_bar(total, "compare") as tick:
        tables = {name: build_table(load_results(path, tick)) for name, path in (("before", before), ("after", after))}
        comparison = compare_tables(tables["before"], tables["after"])
        summary = summarise(comparison)
        modelled = {name: any_modelled(t) for name, t in tables.items()}
        summary.update(before=str(before), after=str(after), modelled=modelled)
        written = [atomic_write_text(out / "comparison.csv", comparison.to_csv(index=False)),
                   atomic_write_json(out / "comparison.json", summary)]
        if plots:
            from pdexporter.analysis.plots import grid_heatmap, write_plots

            names = distinct_names(before, after)  # two sweeps named quick: their paths tell them apart
            for metric in PLOTTED:
                title = f"{metric}: change (%) from {names[0]} to {names[1]}"
                if any(modelled.values()):
                    title = f"MODELLED ({', '.join(k for k, v in modelled.items() if v)}): {title}"
                plot = grid_heatmap(comparison, f"{metric}_change_pct", "change (%)", title, f"compare_{metric}",
                                    cmap="RdBu_r", symmetric=True)
                written += write_plots([plot], out / "plots")
                plot.figure.clear()
                tick(metric)
    _print(summary)
    console.print(f"wrote {len(written)} files to {out} in {time.perf_counter() - started:.2f} s")
    print(out / "comparison.csv")


def _print(summary: dict[str, Any]) -> None:
    for name, flag in summary["modelled"].items():
        if flag:
            console.print(f"[bold yellow]MODELLED DATA[/] in {name} ({summary[name]})")
    table = Table(title=f"{summary['configurations']} configurations in both: change from before to after")
    for column in ("metric", "median", "smallest (B, D, P)", "largest (B, D, P)"):
        table.add_column(column)
    for metric, row in summary["metrics"].items():
        if row is None:
            table.add_row(metric, "n/a", "", "")
            continue
        table.add_row(metric, f"{row['median_change_pct']:+.1f} %",
                      f"{row['min_change_pct']:+.1f} % {tuple(row['min_at'])}",
                      f"{row['max_change_pct']:+.1f} % {tuple(row['max_at'])}")
    console.print(table)
