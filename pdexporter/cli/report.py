"""`pdexporter report RESULTS_DIR...`: one self-contained HTML file with the table, plots, fits, criteria."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdexporter.analysis import DEFAULT_TRANSFER_MS
from pdexporter.analysis.export import default_report_path
from pdexporter.cli._common import PoolOpt, TransferOpt, progress_bar, show

__all__ = ["default_report_path", "register", "report"]


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    results_dir: Annotated[list[Path], typer.Argument(
        help="Results directory of records (results/{chunk}/D{d}_P{p}.json); several are joined as by "
             "export-table.")],
    out: Annotated[Path | None, typer.Option(
        "--out", help="HTML file to write (default: results/reports/NAME.html, NAME the results directory's: "
        "never inside the directory it reads).")] = None,
    transfer_ms: TransferOpt = DEFAULT_TRANSFER_MS,
    offloaded: Annotated[list[Path] | None, typer.Option(
        "--offloaded", help="Records of the offloaded arm: adds both arms, the transfer model and the break-even "
                            "(docs/disaggregation.md); repeat it to join several directories.")] = None,
    pool: PoolOpt = False,
    injected: Annotated[Path | None, typer.Option(
        "--injected", help="Passive records (run --passive --out): injected records of the same engine, to draw "
                           "the event-fitted model's error against them vs minutes of traffic.")] = None,
    campaign_variation: Annotated[Path | None, typer.Option(
        "--campaign-variation", help="held_out.json of `pdexporter validate`: carried into the intervals and "
                                     "thresholds, its held-out errors quoted (as export-table).")] = None,
) -> None:
    """Write one HTML file (images embedded, no external assets) describing the results."""
    from pdexporter.analysis.export import report_job

    job = report_job(results_dir, out=out, transfer_ms=transfer_ms, offloaded=offloaded, pool=pool, injected=injected,
                     campaign_variation=campaign_variation)
    with progress_bar(job.steps, "report") as tick:
        shown = job.run(tick)
    show(shown)
    print(job.target)
