"""`pdexporter export-table`: records (or Prometheus) -> table, fits, decision, criteria, plots
(`pdexporter.analysis.export.export_job`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pdexporter.analysis import DEFAULT_TRANSFER_MS
from pdexporter.cli._common import PoolOpt, TransferOpt, console, duration_option, progress_bar, show


def register(app: typer.Typer) -> None:
    app.command("export-table")(export_table)


def export_table(
    results_dir: Annotated[list[Path] | None, typer.Argument(
        help="Results directory of records (results/{chunk}/D{d}_P{p}.json); several are joined into one "
        "table (e.g. one per chunk size from a Kubernetes Indexed Job).")] = None,
    prometheus: Annotated[str | None, typer.Option(
        "--prometheus", help="Prometheus base URL to pull the exporter's windows from instead.")] = None,
    from_: Annotated[str, typer.Option(
        "--from", help="Start: RFC3339, unix seconds, 'now' or a duration before now (-1h, -30m).")] = "-1h",
    to: Annotated[str, typer.Option(
        "--to", help="End: RFC3339, unix seconds, 'now' or a duration before now (-5m).")] = "now",
    step: Annotated[str, duration_option("--step", "query_range resolution; at most the scrape interval")] = "1s",
    out: Annotated[Path | None, typer.Option(
        "--out", help="Output directory (default: RESULTS_DIR, the common parent of several, or ./results).")] = None,
    transfer_ms: TransferOpt = DEFAULT_TRANSFER_MS,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the PNG/SVG plots.")] = True,
    parquet: Annotated[bool, typer.Option("--parquet/--no-parquet", help="Also write Parquet (needs pyarrow).")] = True,
    offloaded: Annotated[list[Path] | None, typer.Option(
        "--offloaded", help="Records of the offloaded arm (DecodeBench or a P/D pair's decode instance): the table "
        "gains its columns, decision.json the two-arm verdict (docs/disaggregation.md); "
        "repeat it to join several directories.")] = None,
    pool: PoolOpt = False,
    mode: Annotated[str, typer.Option(
        "--mode", help="Which windows: 'active' (injected prefills) or 'passive' (production prefills of `run "
        "--passive`, with event counts and bootstrap intervals).")] = "active",
    grid: Annotated[Path | None, typer.Option(
        "--grid", help="--mode passive: re-bin the cells to this sweep file's D and P values (e.g. "
        "sweeps/seed.yaml).")] = None,
    min_events: Annotated[int, typer.Option(
        "--min-events", min=1, help="--mode passive: cells with fewer events are marked too_few_events.")] = 5,
    injected: Annotated[Path | None, typer.Option(
        "--injected", help="--mode passive: injected records of the same engine; the event-fitted model's "
        "predictions are compared with them as traffic comes (passive_model.json, plots/passive_convergence).")
    ] = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", help="Tabulate this engine's windows only (its adapter's name, e.g. vllm, sglang); needed when "
        "the records or Prometheus hold several engines' (one table is one engine's).")] = None,
    campaign_variation: Annotated[Path | None, typer.Option(
        "--campaign-variation", help="held_out.json of `pdexporter validate`: the campaign variation it measured is "
        "carried into decision.json's intervals, verdicts, thresholds (and --mode passive's table), its held-out "
        "errors quoted.")] = None,
) -> None:
    """Write interference_table.csv (+ .parquet), fits.json, decision.json, criteria.json and plots/."""
    from pdexporter.analysis.export import ExportRequest, export_job
    from pdexporter.sweep.job import grid_axes

    job = export_job(ExportRequest(results_dir, prometheus, _pull(prometheus, from_, to, step), out, transfer_ms, plots,
                                   parquet, offloaded, pool, mode, grid, min_events, injected, engine,
                                   campaign_variation, grid_axes))
    if prometheus is not None:
        with console.status(f"querying {prometheus} ..."):
            job.pull()
    with progress_bar(job.steps, "export-table") as tick:
        done = job.run(tick)
    show(done.shown)
    print(done.out_dir / "interference_table.csv")


def _pull(url: str | None, from_: str, to: str, step: str) -> Any:
    """--prometheus: how the range's windows are fetched (the times read when they are)."""
    def pull(mode: str, engine: str | None) -> Any:
        import time

        from pdexporter.exporter.prometheus import PrometheusAPI, parse_duration, parse_time
        from pdexporter.exporter.prometheus import pull as pull_range

        now = time.time()
        start, end = parse_time(from_, now, "--from"), parse_time(to, now, "--to")
        return pull_range(PrometheusAPI(url or ""), start, end, parse_duration(step, "--step"), mode=mode,
                          engine=engine)

    return pull
