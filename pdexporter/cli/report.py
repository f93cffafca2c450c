"""`pdexporter report RESULTS_DIR...`: one self-contained HTML file with the table, plots, fits, criteria."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdexporter.analysis import DEFAULT_TRANSFER_MS
from pdexporter.cli._common import console
from pdexporter.cli.export_table import PoolOpt, TransferOpt, print_summary, progress_bar


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
    from pdexporter._internal.writable import check_writable
    from pdexporter.analysis.campaigns import check_fit_inputs, load_variation
    from pdexporter.analysis.job import analyse, load_joined, record_paths
    from pdexporter.analysis.plots import all_plots
    from pdexporter.analysis.report import write_report

    # Not RESULTS_DIR/report.html: a command that reads a directory does not write into it unless
    # asked (a committed results directory's report.html was rewritten by a first look at it).
    results_dirs, first_dir = results_dir, results_dir[0]
    offloaded = offloaded or None
    variation = load_variation(campaign_variation) if campaign_variation is not None else None
    check_fit_inputs([*results_dirs, *(offloaded or [])])  # a validation campaign in neither arm (as export-table)
    target = check_writable(out or default_report_path(first_dir), "--out" if out else "output", directory=False)
    paths = [path for directory in results_dirs for path in record_paths(directory)]
    off_paths = [path for directory in offloaded or [] for path in record_paths(directory)]
    # one tick per record, then table, fits, criteria, plots, html
    with progress_bar(len(paths) + len(off_paths) + 5, "report") as tick:
        samples = load_joined(results_dirs, tick, pool=pool)
        off = load_joined(offloaded, tick, pool=pool) if offloaded else None
        analysis = analyse(samples, transfer_ms, source=" + ".join(map(str, results_dirs)), tick=tick,
                           offloaded=off, offloaded_source=" + ".join(map(str, offloaded or [])),
                           campaign_variation=variation)
        plots = all_plots(analysis.table, analysis.fits.best.model if analysis.fits else None, transfer_ms)
        if samples and all(s.passive for s in samples):  # the event-fitted model and its convergence
            from pdexporter.analysis.job import analyse_passive, injected_values, load_passive_events
            from pdexporter.analysis.plots import passive_convergence

            reference = injected_values(injected) if injected is not None else None
            analysis = analyse_passive(analysis, load_passive_events([first_dir]), injected=reference,
                                       campaign_variation=variation)
            if analysis.passive is not None:
                plots.append(passive_convergence(analysis.passive.convergence, analysis.modelled))
        tick("plots")
        write_report(analysis, target, plots)
        tick("html")
    print_summary(analysis)
    console.print(f"report written to {target}")
    print(target)


def default_report_path(results_dir: Path) -> Path:
    """Where `report` writes without --out: results/reports/NAME.html in the current directory."""
    return Path("results") / "reports" / f"{results_dir.resolve().name or 'results'}.html"
