"""`pdexporter export-table`: records (or Prometheus) -> table, fits, decision, criteria, plots."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from pdexporter._internal.text import plural
from pdexporter.analysis import DEFAULT_TRANSFER_MS
from pdexporter.cli._common import console, duration_option
from pdexporter.errors import ConfigError

if TYPE_CHECKING:
    from pdexporter.analysis.job import Analysis
    from pdexporter.analysis.table import ConfigSamples

TransferOpt = Annotated[
    float,
    typer.Option("--transfer-ms", min=0.0, max=1e7,
                 help="Transfer budget (ms) an offload must beat; the seed's 50 ms."),
]
PoolOpt = Annotated[
    bool,
    typer.Option("--pool/--no-pool", help="A grid point in several RESULTS_DIRs (or --offloaded dirs): pool its "
                                          "repetitions (one engine, GPU and model measured in two sessions) "
                                          "instead of refusing the join."),
]


def register(app: typer.Typer) -> None:
    app.command("export-table")(export_table)


@contextmanager
def progress_bar(total: int, description: str) -> Iterator[Callable[[str], None]]:
    """A bar with ETA while the job runs; transient, so an error stays the only line and the summary
    printed afterwards is what remains on the screen."""
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[step]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, refresh_per_second=4, transient=True,
    ) as bar:
        task = bar.add_task(description, total=total, step="")

        def tick(step: str) -> None:
            bar.update(task, advance=1, step=step)

        yield tick
        bar.update(task, completed=total, step="done")


def export_table(
    results_dir: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Results directory of records (results/{chunk}/D{d}_P{p}.json); several are joined into one "
            "table (e.g. one per chunk size from a Kubernetes Indexed Job)."
        ),
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option("--prometheus", help="Prometheus base URL to pull the exporter's windows from instead."),
    ] = None,
    from_: Annotated[
        str, typer.Option("--from", help="Start: RFC3339, unix seconds, 'now' or a duration before now (-1h, -30m).")
    ] = "-1h",
    to: Annotated[
        str, typer.Option("--to", help="End: RFC3339, unix seconds, 'now' or a duration before now (-5m).")
    ] = "now",
    step: Annotated[str, duration_option("--step", "query_range resolution; at most the scrape interval")] = "1s",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Output directory (default: RESULTS_DIR, the common parent of several, or ./results)."
        ),
    ] = None,
    transfer_ms: TransferOpt = DEFAULT_TRANSFER_MS,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the PNG/SVG plots.")] = True,
    parquet: Annotated[bool, typer.Option("--parquet/--no-parquet", help="Also write Parquet (needs pyarrow).")] = True,
    offloaded: Annotated[
        list[Path] | None,
        typer.Option(
            "--offloaded",
            help="Records of the offloaded arm (DecodeBench or a P/D pair's decode instance): the table "
            "gains its columns, decision.json the two-arm verdict (docs/disaggregation.md); "
            "repeat it to join several directories.",
        ),
    ] = None,
    pool: PoolOpt = False,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            help="Which windows: 'active' (injected prefills) or 'passive' "
            "(production prefills of `run --passive`, with event counts and bootstrap "
            "intervals).",
        ),
    ] = "active",
    grid: Annotated[
        Path | None,
        typer.Option(
            "--grid",
            help="--mode passive: re-bin the cells to this sweep file's D and P values (e.g. sweeps/seed.yaml).",
        ),
    ] = None,
    min_events: Annotated[
        int,
        typer.Option("--min-events", min=1, help="--mode passive: cells with fewer events are marked too_few_events."),
    ] = 5,
    injected: Annotated[
        Path | None,
        typer.Option(
            "--injected",
            help="--mode passive: injected records of the same engine; the event-fitted model's "
            "predictions are compared with them as traffic comes (passive_model.json, "
            "plots/passive_convergence).",
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="Tabulate this engine's windows only (its adapter's name, e.g. vllm, sglang); needed when "
            "the records or Prometheus hold several engines' (one table is one engine's).",
        ),
    ] = None,
    campaign_variation: Annotated[
        Path | None,
        typer.Option(
            "--campaign-variation",
            help="held_out.json of `pdexporter validate`: the campaign variation it measured is carried into "
            "decision.json's intervals, verdicts, thresholds (and --mode passive's table), its held-out errors quoted.",
        ),
    ] = None,
) -> None:
    """Write interference_table.csv (+ .parquet), fits.json, decision.json, criteria.json and plots/."""
    from pdexporter._internal.writable import check_writable
    from pdexporter.analysis.campaigns import check_fit_inputs, load_variation
    from pdexporter.analysis.job import (
        analyse,
        joined_out_dir,
        load_joined,
        progress_steps,
        record_paths,
        write_outputs,
    )
    from pdexporter.analysis.table import parquet_available

    started = time.perf_counter()
    results_dir = results_dir or None  # typer gives [] for none
    offloaded = offloaded or None
    variation = load_variation(campaign_variation) if campaign_variation is not None else None
    if (results_dir is None) == (prometheus is None):
        raise ConfigError("give either RESULTS_DIR or --prometheus URL (exactly one)")
    if offloaded is not None and results_dir is None:
        raise ConfigError("--offloaded: only with a RESULTS_DIR of the colocated arm")
    if mode not in ("active", "passive"):
        raise ConfigError(f"--mode {mode!r}: expected 'active' or 'passive'")
    if grid is not None and mode != "passive":
        raise ConfigError(f"--grid {grid}: only with --mode passive (active windows sit on their grid already)")
    if injected is not None and (mode != "passive" or results_dir is None):
        raise ConfigError(f"--injected {injected}: only with --mode passive and a RESULTS_DIR of passive records")
    default_out = joined_out_dir(results_dir) if results_dir else Path("results")
    check_writable(out or default_out, "--out" if out else "output")
    if prometheus is not None:
        analysis, out_dir, extra = _from_prometheus(prometheus, from_, to, step, transfer_ms, out, mode, grid,
                                                    min_events, engine)
        total = progress_steps(0, plots) - 3  # no record ticks; table/fits/criteria done before the bar
        with progress_bar(total, "export-table") as tick:
            written = write_outputs(analysis, out_dir, plots=plots, parquet=parquet, tick=tick)
    else:
        assert results_dir is not None
        out_dir = out or joined_out_dir(results_dir)
        paths = [path for directory in results_dir for path in record_paths(directory)]
        off_paths = [path for directory in offloaded or [] for path in record_paths(directory)]
        passive_steps = 2 if mode == "passive" else 0  # the event model, its convergence plot
        campaigns = check_fit_inputs([*results_dir, *(offloaded or [])])
        with progress_bar(progress_steps(len(paths) + len(off_paths), plots) + passive_steps, "export-table") as tick:
            source = " + ".join(str(d) for d in results_dir)
            samples, counts, extra = _of_mode(
                one_engine(load_joined(results_dir, tick, pool=pool), engine, source), None, mode, grid, source
            )
            off_samples = load_joined(offloaded, tick, pool=pool) if offloaded is not None else None
            analysis = analyse(samples, transfer_ms, source=source, tick=tick, offloaded=off_samples,
                               offloaded_source=" + ".join(map(str, offloaded or [])),
                               passive_events=counts, min_events=min_events if mode == "passive" else None,
                               campaign_variation=variation)
            if analysis.decision is not None and campaigns:
                analysis.decision["campaigns"] = campaigns
            if mode == "passive":
                analysis = _event_model(analysis, results_dir, grid, injected, variation)
                tick("event model")
            written = write_outputs(analysis, out_dir, plots=plots, parquet=parquet, tick=tick)
    if parquet and not parquet_available():
        extra.append("no Parquet written: pyarrow cannot be imported (pip install pyarrow); the CSV has the same table")
    if analysis.passive is not None:
        extra += _passive_lines(analysis.passive)
    if mode == "passive":
        few = int(analysis.table["too_few_events"].sum())
        extra.append(f"passive: {int(analysis.table['events'].sum())} events in {len(analysis.table)} cells, {few} "
                     f"with fewer than {min_events} events (marked too_few_events)")
    print_summary(analysis, extra)
    console.print(f"wrote {len(written)} files to {out_dir} in {time.perf_counter() - started:.2f} s")
    print(Path(out_dir) / "interference_table.csv")


def one_engine(samples: list[ConfigSamples], engine: str | None, source: str) -> list[ConfigSamples]:
    """The samples of one engine: `engine`'s (--engine), or all of them when they are one engine's."""
    engines = sorted({s.engine for s in samples})
    if engine is not None:
        chosen = [s for s in samples if s.engine == engine]
        if not chosen:
            raise ConfigError(f"--engine {engine}: {source} holds no records of that engine (engines: "
                              f"{', '.join(engines)})")
        return chosen
    if len(engines) > 1:
        raise ConfigError(f"{source} holds records of {len(engines)} engines ({', '.join(engines)}): one table is one "
                          "engine's, add --engine NAME")
    return samples


def _from_prometheus(url: str, from_: str, to: str, step: str, transfer_ms: float, out: Path | None, mode: str,
                     grid: Path | None, min_events: int, engine: str | None = None) -> tuple[Analysis, Path, list[str]]:
    from pdexporter.analysis.job import analyse
    from pdexporter.exporter.prometheus import PrometheusAPI, parse_duration, parse_time, pull

    now = time.time()
    start, end = parse_time(from_, now, "--from"), parse_time(to, now, "--to")
    step_s = parse_duration(step, "--step")
    with console.status(f"querying {url} ..."):
        result = pull(PrometheusAPI(url), start, end, step_s, mode=mode, engine=engine)
    extra = [f"{result.windows} {mode} windows rebuilt from Prometheus"]
    if result.missed:
        extra.append(f"{result.missed} windows fell between two scrapes of the same grid point and their values are "
                     "lost (scrape more often than windows happen)" + ("; they still count as events" if mode ==
                                                                       "passive" else ""))
    samples, counts, notes = _of_mode(result.samples, result.counts, mode, grid, f"prometheus {url}")
    analysis = analyse(samples, transfer_ms, source=f"prometheus {url}", passive_events=counts,
                       min_events=min_events if mode == "passive" else None)
    return analysis, out or Path("results"), extra + notes


def _event_model(analysis: Analysis, results_dir: list[Path], grid: Path | None, injected: Path | None,
                 variation: tuple[dict[str, Any], dict[str, Any]] | None = None) -> Analysis:
    """--mode passive from records: the model fitted on the events (analysis.passive_model)."""
    from pdexporter.analysis.job import analyse_passive, injected_values, load_passive_events

    d_values = p_values = None
    if grid is not None:
        from pdexporter.sweep.spec import load_sweep

        spec = load_sweep(grid)
        d_values, p_values = spec.grid.decode_batch_sizes, spec.grid.new_prefill_tokens
    reference = injected_values(injected) if injected is not None else None
    return analyse_passive(analysis, load_passive_events(results_dir), decode_batch_sizes=d_values,
                           prefill_tokens=p_values, injected=reference, campaign_variation=variation)


def _passive_lines(result: Any) -> list[str]:
    """The event model in a few lines: events, how sure, reach, error against injection."""
    s = result.summary()
    width = s["median_relative_halfwidth"]
    lines = [f"passive event model: {s['events_used']} events over {s['traffic_minutes']:.1f} min of traffic "
             f"({s['events_left_out']} outside the grid's prompt span), {s['cells_reached']} of {s['cells']} cells "
             f"reached, 95 % intervals ± {'n/a' if width is None else f'{width:.1%}'} (median)"]
    for why, keys in result.not_reached.items():
        lines.append(f"  not reached ({len(keys)} cells): {why}")
    if s["vs_injected"] is not None and s["vs_injected"]["mape"] is not None:
        v = s["vs_injected"]
        lines.append(f"  vs injected: mean |error| {v['mape']:.1%}, median {v['median_abs_error']:.1%}, max "
                     f"{v['max_abs_error']:.1%} over {v['cells']} reached cells")
    steps = [c for c in result.convergence if c.errors is not None and c.errors.mape is not None]
    if steps:
        lines.append("  error vs minutes: " + ", ".join(f"{c.minutes:g} min {c.errors.mape:.1%}" for c in steps))
    return lines


def _of_mode(samples: list, counts: dict | None, mode: str, grid: Path | None,
             source: str) -> tuple[list, dict | None, list[str]]:
    """The samples of one mode, re-binned to --grid when given (analysis.passive)."""
    from pdexporter.errors import RecordError

    chosen = [s for s in samples if s.passive == (mode == "passive")]
    if not chosen:
        other = len(samples) - len(chosen)
        hint = f" ({other} {'passive' if mode == 'active' else 'active'} grid points: use --mode " \
               f"{'passive' if mode == 'active' else 'active'})" if other else ""
        raise RecordError(f"{source}: no {mode} windows to tabulate{hint}")
    notes: list[str] = []
    if grid is not None:
        from pdexporter.analysis.passive import rebin
        from pdexporter.sweep.spec import load_sweep

        spec = load_sweep(grid)
        rebinned = rebin(chosen, spec.grid.decode_batch_sizes, spec.grid.new_prefill_tokens, counts)
        if rebinned.dropped_cells:
            notes.append(f"{rebinned.dropped_cells} passive cells ({rebinned.dropped_events} events) lie outside "
                         f"every bin of {grid}'s grid and are left out")
        if not rebinned.samples:
            raise RecordError(f"{source}: no passive cell falls in a bin of {grid}'s grid")
        return rebinned.samples, rebinned.events, notes
    return chosen, counts, notes


def print_summary(analysis: Analysis, extra: list[str] | None = None) -> None:
    """The run in a few lines: grid, model, criteria, warnings."""
    if analysis.modelled:
        # The notes say MODELLED (or SYNTHETIC) themselves; the banner word is not repeated.
        notes = [n.removeprefix("MODELLED: ") for n in analysis.modelled_notes] or ["records say modelled: true"]
        console.print("[bold yellow]MODELLED DATA:[/] " + "; ".join(notes), highlight=False)
    reps = sum(len(s.reps) for s in analysis.samples)
    console.print(f"{plural(len(analysis.samples), 'grid point')}, {plural(reps, 'repetition')}")
    for line in extra or []:
        console.print(line)
    if analysis.fits:
        f = analysis.fits
        best = f.best
        r2 = f.held_out_r2()
        if r2 is None:
            console.print(f"cost model: [bold]{f.chosen}[/], in-sample R^2 {_fmt(best.in_sample_r2)}; {f.reason}")
        else:
            console.print(f"cost model: [bold]{f.chosen}[/] held-out R^2 {_fmt(r2)} ({f.primary_scheme}), "
                          f"in-sample {_fmt(best.in_sample_r2)}; {f.reason}")
        for c in best.model.coefficients()[:8]:
            err = f" ± {c.stderr:.3g}" if c.stderr is not None else ""
            note = f" ({c.note})" if c.note else ""
            value = "unmeasured (no step of the data ran in this regime)" if c.value != c.value else f"{c.value:.4g}"
            console.print(f"  {c.name} = {value}{err} {c.unit}{note}", highlight=False)
        generalisation = [f"{scheme} MAPE {h.mape:.1%} ({h.predicted} points)" for scheme, h in best.held_out.items()
                          if h.mape is not None]
        if generalisation:
            console.print(f"  held out within this data ({f.chosen}): " + "; ".join(generalisation))
    if analysis.decision is not None:
        from pdexporter.analysis.decision_eval import held_out_text

        console.print(held_out_text(analysis.decision), highlight=False, soft_wrap=True)
    for note in analysis.notes:
        console.print(f"[yellow]{note}[/]")
    if analysis.arms is not None:
        arms = analysis.arms
        t = arms.transfer
        console.print(f"offloaded arm: {len(arms.samples)} grid points from {arms.source} "
                      f"({', '.join(sorted({s.engine for s in arms.samples}))}); transfer model: "
                      + (t.describe() if t is not None else "none measured (the seed's constant stands in)"),
                      highlight=False, soft_wrap=True)
    table = Table(title="Success criteria (seed)")
    table.add_column("#")
    table.add_column("criterion")
    table.add_column("verdict")
    table.add_column("figure")
    colours = {True: "green", False: "red", None: "yellow"}
    for criterion in analysis.criteria:
        table.add_row(str(criterion.number), criterion.name, f"[{colours[criterion.passed]}]{criterion.verdict}[/]",
                      criterion.figure)
    console.print(table)
    if analysis.mismatches:
        console.print(f"[yellow]{len(analysis.mismatches)} record top-level values differ from the medians of their "
                      f"repetitions; the table uses the medians. First: {analysis.mismatches[0]}[/]")


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
