"""`pdexporter compare BEFORE AFTER`: what an engine change did to each configuration's cost.

Both directories are results directories (records); their tables are built as export-table builds
them and compared where they share a configuration. Writes comparison.csv, comparison.json and
plots/compare_<metric>.png|svg (change in % over P x D, per chunk size).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdexporter.cli._common import progress_bar, show


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)


def compare(
    before: Annotated[Path, typer.Argument(help="Results directory measured before the change.")],
    after: Annotated[Path, typer.Argument(help="Results directory measured after it.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("results/comparison"),
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the change heatmaps.")] = True,
) -> None:
    """Per configuration: penalty, prefill duration, aggregate interference and baseline, before and after."""
    from pdexporter.analysis.comparisons import compare_job

    job = compare_job(before, after, out=out, plots=plots)
    with progress_bar(job.steps, "compare") as tick:
        shown = job.run(tick)
    show(shown)
    print(out / "comparison.csv")
