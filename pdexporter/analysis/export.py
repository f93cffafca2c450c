"""The analysis commands as jobs: `export-table` (`export_job`) and `report` (`report_job`; `compare`
and `validate-pd` are in `comparisons`), each built from the command's options (checked first, one line naming the
option), counting the ticks of its progress, then run with a tick callback; what they show is
`Shown` (`_internal.sheet`), the summary of an analysis `summary`.

Prometheus, for `export-table --prometheus`, is reached through the `Pull` the caller gives, and a
sweep file's grid (--grid) read by its `GridAxes` (the exporter's and the sweep's packages stand
above this one)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdexporter._internal.sheet import Plain, Sheet, Shown, columns
from pdexporter._internal.text import plural
from pdexporter.analysis import DEFAULT_TRANSFER_MS
from pdexporter.errors import ConfigError, RecordError

if TYPE_CHECKING:
    from pdexporter.analysis.job import Analysis
    from pdexporter.analysis.table import ConfigSamples

__all__ = [
    "ExportJob", "ExportRequest", "Exported", "GridAxes", "Pull", "ReportJob", "default_report_path", "export_job",
    "one_engine", "report_job", "summary",
]


Tick = Callable[[str], None]
Pull = Callable[[str, str | None], Any]  # (mode, engine) -> exporter.prometheus.PullResult
GridAxes = Callable[[Path], tuple[Sequence[int], Sequence[int]]]  # a sweep file -> its D and P values


@dataclass
class ExportRequest:
    """`export-table`'s options (its --help says what each means); `prometheus`: the URL, and
    `pull`: how its windows are fetched; `grid_axes`: how --grid's sweep file is read."""

    results_dirs: list[Path] | None = None
    prometheus: str | None = None
    pull: Pull | None = None
    out: Path | None = None
    transfer_ms: float = DEFAULT_TRANSFER_MS
    plots: bool = True
    parquet: bool = True
    offloaded: list[Path] | None = None
    pool: bool = False
    mode: str = "active"
    grid: Path | None = None
    min_events: int = 5
    injected: Path | None = None
    engine: str | None = None
    campaign_variation: Path | None = None
    grid_axes: GridAxes | None = None

    def axes(self) -> tuple[Sequence[int], Sequence[int]] | None:
        if self.grid is None:
            return None
        assert self.grid_axes is not None
        return self.grid_axes(self.grid)


@dataclass
class Exported:
    analysis: Analysis
    out_dir: Path
    written: list[Path]
    shown: list[Shown]


@dataclass
class ExportJob:
    request: ExportRequest
    variation: tuple[dict[str, Any], dict[str, Any]] | None
    started: float = field(default_factory=time.perf_counter)
    pulled: tuple[Analysis, Path, list[str]] | None = None

    @property
    def steps(self) -> int:
        """The ticks `run` makes."""
        from pdexporter.analysis.job import progress_steps, record_paths

        r = self.request
        if r.results_dirs is None:
            return progress_steps(0, r.plots) - 3  # no record ticks; table/fits/criteria done by `pull`
        paths = [p for d in [*r.results_dirs, *(r.offloaded or [])] for p in record_paths(d)]
        return progress_steps(len(paths), r.plots) + (2 if r.mode == "passive" else 0)  # + the event model, its plot

    def pull(self) -> None:
        """--prometheus: the windows of the range, tabulated and analysed (before `run`)."""
        from pdexporter.analysis.job import analyse

        r = self.request
        assert r.pull is not None
        result = r.pull(r.mode, r.engine)
        extra = [f"{result.windows} {r.mode} windows rebuilt from Prometheus"]
        if result.missed:
            extra.append(f"{result.missed} windows fell between two scrapes of the same grid point and their values "
                         "are lost (scrape more often than windows happen)"
                         + ("; they still count as events" if r.mode == "passive" else ""))
        samples, counts, notes = _of_mode(result.samples, result.counts, r, f"prometheus {r.prometheus}")
        analysis = analyse(samples, r.transfer_ms, source=f"prometheus {r.prometheus}", passive_events=counts,
                           min_events=r.min_events if r.mode == "passive" else None)
        self.pulled = analysis, r.out or Path("results"), extra + notes

    def run(self, tick: Tick) -> Exported:
        from pdexporter.analysis.job import write_outputs
        from pdexporter.analysis.table import parquet_available

        r = self.request
        if self.pulled is not None:
            analysis, out_dir, extra = self.pulled
        else:
            analysis, out_dir, extra = self._from_records(tick)
        written = write_outputs(analysis, out_dir, plots=r.plots, parquet=r.parquet, tick=tick)
        if r.parquet and not parquet_available():
            extra.append("no Parquet written: pyarrow cannot be imported (pip install pyarrow); the CSV has the same "
                         "table")
        if analysis.passive is not None:
            extra += _passive_lines(analysis.passive)
        if r.mode == "passive":
            few = int(analysis.table["too_few_events"].sum())
            extra.append(f"passive: {int(analysis.table['events'].sum())} events in {len(analysis.table)} cells, {few} "
                         f"with fewer than {r.min_events} events (marked too_few_events)")
        shown = [*summary(analysis, extra),
                 f"wrote {len(written)} files to {out_dir} in {time.perf_counter() - self.started:.2f} s"]
        return Exported(analysis, Path(out_dir), written, shown)

    def _from_records(self, tick: Tick) -> tuple[Analysis, Path, list[str]]:
        from pdexporter.analysis.campaigns import check_fit_inputs
        from pdexporter.analysis.job import analyse, joined_out_dir, load_joined

        r = self.request
        assert r.results_dirs is not None
        out_dir = r.out or joined_out_dir(r.results_dirs)
        campaigns = check_fit_inputs([*r.results_dirs, *(r.offloaded or [])])
        source = " + ".join(str(d) for d in r.results_dirs)
        samples, counts, extra = _of_mode(one_engine(load_joined(r.results_dirs, tick, pool=r.pool), r.engine, source),
                                          None, r, source)
        off_samples = load_joined(r.offloaded, tick, pool=r.pool) if r.offloaded is not None else None
        variation, note = carried_variation(self.variation, [*samples, *(off_samples or [])])
        analysis = analyse(samples, r.transfer_ms, source=source, tick=tick, offloaded=off_samples,
                           offloaded_source=" + ".join(map(str, r.offloaded or [])),
                           passive_events=counts, min_events=r.min_events if r.mode == "passive" else None,
                           campaign_variation=variation)
        if analysis.decision is not None and campaigns:
            analysis.decision["campaigns"] = campaigns
        if r.mode == "passive":
            analysis = _event_model(analysis, r.results_dirs, r.axes(), r.injected, variation)
            tick("event model")
        return analysis, out_dir, extra + note


Variation = tuple[dict[str, Any], dict[str, Any]]


def carried_variation(given: Variation | None, samples: Sequence[ConfigSamples]) -> tuple[Variation | None, list[str]]:
    """The campaign variation a table's intervals carry: the one given (`--campaign-variation`), else,
    for a table the embedded engine made, its profile's (`campaigns.profile_variation`); and a line
    saying which, where one is carried."""
    from pdexporter.analysis.campaigns import profile_variation, variation_line

    chosen = given if given is not None else profile_variation(samples)
    return chosen, ([variation_line(chosen[0])] if chosen is not None else [])


def _check_injected(injected: Path | None) -> None:
    """`--injected` (export-table's and report's) names a directory that is there."""
    if injected is not None and not injected.is_dir():
        raise ConfigError(f"--injected {injected}: not a results directory (the injected records of the same engine)")


def export_job(request: ExportRequest) -> ExportJob:
    """`export-table`'s options checked, the output directory writable: the job, not yet run."""
    from pdexporter._internal.writable import check_writable
    from pdexporter.analysis.campaigns import load_variation
    from pdexporter.analysis.job import joined_out_dir

    r = request
    r.results_dirs = r.results_dirs or None  # typer gives [] for none
    r.offloaded = r.offloaded or None
    variation = load_variation(r.campaign_variation) if r.campaign_variation is not None else None
    if (r.results_dirs is None) == (r.prometheus is None):
        raise ConfigError("give either RESULTS_DIR or --prometheus URL (exactly one)")
    for directory in [*(r.results_dirs or []), *(r.offloaded or [])]:
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"{directory}: not a results directory (a file)")
    if r.offloaded is not None and r.results_dirs is None:
        raise ConfigError("--offloaded: only with a RESULTS_DIR of the colocated arm")
    if r.mode not in ("active", "passive"):
        raise ConfigError(f"--mode {r.mode!r}: expected 'active' or 'passive'")
    if r.grid is not None and r.mode != "passive":
        raise ConfigError(f"--grid {r.grid}: only with --mode passive (active windows sit on their grid already)")
    if r.injected is not None and (r.mode != "passive" or r.results_dirs is None):
        raise ConfigError(f"--injected {r.injected}: only with --mode passive and a RESULTS_DIR of passive records")
    _check_injected(r.injected)
    default_out = joined_out_dir(r.results_dirs) if r.results_dirs else Path("results")
    check_writable(r.out or default_out, "--out" if r.out else "output")
    return ExportJob(r, variation)


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


def _event_model(analysis: Analysis, results_dir: list[Path], axes: tuple[Sequence[int], Sequence[int]] | None,
                 injected: Path | None, variation: tuple[dict[str, Any], dict[str, Any]] | None = None) -> Analysis:
    """--mode passive from records: the model fitted on the events (analysis.passive_model)."""
    from pdexporter.analysis.job import analyse_passive, injected_values, load_passive_events

    d_values, p_values = axes if axes is not None else (None, None)
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
        inside = (f"; injected inside the 95 % interval in {v['inside_interval']}/{v['cells_with_interval']}"
                  if v.get("cells_with_interval") else "")
        lines.append(f"  vs injected: mean |error| {v['mape']:.1%}, median {v['median_abs_error']:.1%}, max "
                     f"{v['max_abs_error']:.1%} over {v['cells']} reached cells{inside}")
    steps = [c for c in result.convergence if c.errors is not None and c.errors.mape is not None]
    if steps:
        lines.append("  error vs minutes: " + ", ".join(f"{c.minutes:g} min {c.errors.mape:.1%}" for c in steps))
    return lines


def _of_mode(samples: list, counts: dict | None, request: ExportRequest,
             source: str) -> tuple[list, dict | None, list[str]]:
    """The samples of one mode, re-binned to --grid when given (analysis.passive)."""
    mode, grid = request.mode, request.grid
    chosen = [s for s in samples if s.passive == (mode == "passive")]
    if not chosen:
        other = len(samples) - len(chosen)
        hint = f" ({other} {'passive' if mode == 'active' else 'active'} grid points: use --mode " \
               f"{'passive' if mode == 'active' else 'active'})" if other else ""
        raise RecordError(f"{source}: no {mode} windows to tabulate{hint}")
    notes: list[str] = []
    if grid is not None:
        from pdexporter.analysis.passive import rebin

        d_values, p_values = request.axes() or ((), ())
        rebinned = rebin(chosen, d_values, p_values, counts)
        if rebinned.dropped_cells:
            notes.append(f"{rebinned.dropped_cells} passive cells ({rebinned.dropped_events} events) lie outside "
                         f"every bin of {grid}'s grid and are left out")
        if not rebinned.samples:
            raise RecordError(f"{source}: no passive cell falls in a bin of {grid}'s grid")
        return rebinned.samples, rebinned.events, notes
    return chosen, counts, notes


def summary(analysis: Analysis, extra: Sequence[str] = ()) -> list[Shown]:
    """The run in a few lines: grid, model, criteria, warnings."""
    shown: list[Shown] = []
    if analysis.modelled:
        # The notes say MODELLED (or SYNTHETIC) themselves; the banner word is not repeated.
        notes = [n.removeprefix("MODELLED: ") for n in analysis.modelled_notes] or ["records say modelled: true"]
        shown.append("[bold yellow]MODELLED DATA:[/] " + "; ".join(notes))
    reps = sum(len(s.reps) for s in analysis.samples)
    shown.append(f"{plural(len(analysis.samples), 'grid point')}, {plural(reps, 'repetition')}")
    shown += extra
    if analysis.fits:
        shown += _fit_lines(analysis)
    if analysis.decision is not None:
        from pdexporter.analysis.decision_eval import held_out_text

        shown.append(Plain(held_out_text(analysis.decision)))
    shown += [f"[yellow]{note}[/]" for note in analysis.notes]
    if analysis.arms is not None:
        arms = analysis.arms
        t = arms.transfer
        shown.append(Plain(f"offloaded arm: {len(arms.samples)} grid points from {arms.source} "
                           f"({', '.join(sorted({s.engine for s in arms.samples}))}); transfer model: "
                           + (t.describe() if t is not None else "none measured (the seed's constant stands in)")))
    table = Sheet("Success criteria (seed)", columns("#", "criterion", "verdict", "figure"))
    colours = {True: "green", False: "red", None: "yellow"}
    for criterion in analysis.criteria:
        table.add_row(str(criterion.number), criterion.name, f"[{colours[criterion.passed]}]{criterion.verdict}[/]",
                      criterion.figure)
    shown.append(table)
    if analysis.mismatches:
        shown.append(f"[yellow]{len(analysis.mismatches)} record top-level values differ from the medians of their "
                     f"repetitions; the table uses the medians. First: {analysis.mismatches[0]}[/]")
    return shown


MAX_COEFFICIENTS_SHOWN = 12  # the context-aware model's 9 to 11 terms; a seed_per_chunk table of many cells: 8


def _fit_lines(analysis: Analysis) -> list[str]:
    f = analysis.fits
    assert f is not None
    best = f.best
    r2 = f.held_out_r2()
    if r2 is None:
        shown = [f"cost model: [bold]{f.chosen}[/], in-sample R^2 {_fmt(best.in_sample_r2)}; {f.reason}"]
    else:
        shown = [f"cost model: [bold]{f.chosen}[/] held-out R^2 {_fmt(r2)} ({f.primary_scheme}), "
                 f"in-sample {_fmt(best.in_sample_r2)}; {f.reason}"]
    coefficients = best.model.coefficients()
    # the physical model's every term (graph0, kappa_large, delta where fitted); a per-cell table's first few
    listed = coefficients if len(coefficients) <= MAX_COEFFICIENTS_SHOWN else coefficients[:8]
    for c in listed:
        err = f" ± {c.stderr:.3g}" if c.stderr is not None else ""
        note = f" ({c.note})" if c.note else ""
        value = "unmeasured (no step of the data ran in this regime)" if c.value != c.value else f"{c.value:.4g}"
        shown.append(Plain(f"  {c.name} = {value}{err} {c.unit}{note}"))
    if len(listed) < len(coefficients):
        shown.append(Plain(f"  ... {len(coefficients) - len(listed)} more in fits.json"))
    generalisation = [f"{scheme} MAPE {h.mape:.1%} ({h.predicted} points)" for scheme, h in best.held_out.items()
                      if h.mape is not None]
    if generalisation:
        shown.append(f"  held out within this data ({f.chosen}): " + "; ".join(generalisation))
    return shown


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


@dataclass
class ReportJob:
    """`report`: one self-contained HTML file of the results (`report_job` checks the options)."""

    results_dirs: list[Path]
    target: Path
    transfer_ms: float
    offloaded: list[Path] | None
    pool: bool
    injected: Path | None
    variation: tuple[dict[str, Any], dict[str, Any]] | None

    @property
    def steps(self) -> int:
        """One tick per record, then table, fits, criteria, plots, html."""
        from pdexporter.analysis.job import record_paths

        return sum(len(record_paths(d)) for d in [*self.results_dirs, *(self.offloaded or [])]) + 5

    def run(self, tick: Tick) -> list[Shown]:
        from pdexporter.analysis.job import analyse, load_joined
        from pdexporter.analysis.plots import all_plots
        from pdexporter.analysis.report import write_report

        samples = load_joined(self.results_dirs, tick, pool=self.pool)
        off = load_joined(self.offloaded, tick, pool=self.pool) if self.offloaded else None
        variation, _ = carried_variation(self.variation, [*samples, *(off or [])])
        analysis = analyse(samples, self.transfer_ms, source=" + ".join(map(str, self.results_dirs)), tick=tick,
                           offloaded=off, offloaded_source=" + ".join(map(str, self.offloaded or [])),
                           campaign_variation=variation)
        plots = all_plots(analysis.table, analysis.fits.best.model if analysis.fits else None, self.transfer_ms)
        if samples and all(s.passive for s in samples):  # the event-fitted model and its convergence
            from pdexporter.analysis.job import analyse_passive, injected_values, load_passive_events
            from pdexporter.analysis.plots import passive_convergence

            reference = injected_values(self.injected) if self.injected is not None else None
            analysis = analyse_passive(analysis, load_passive_events([self.results_dirs[0]]), injected=reference,
                                       campaign_variation=variation)
            if analysis.passive is not None:
                plots.append(passive_convergence(analysis.passive.convergence, analysis.modelled))
        tick("plots")
        write_report(analysis, self.target, plots)
        tick("html")
        return [*summary(analysis), f"report written to {self.target}"]


def report_job(results_dirs: list[Path], *, out: Path | None = None, transfer_ms: float = DEFAULT_TRANSFER_MS,
               offloaded: list[Path] | None = None, pool: bool = False, injected: Path | None = None,
               campaign_variation: Path | None = None) -> ReportJob:
    from pdexporter._internal.writable import check_writable
    from pdexporter.analysis.campaigns import check_fit_inputs, load_variation

    # Not RESULTS_DIR/report.html: a command that reads a directory does not write into it unless
    # asked (a committed results directory's report.html was rewritten by a first look at it).
    offloaded = offloaded or None
    variation = load_variation(campaign_variation) if campaign_variation is not None else None
    check_fit_inputs([*results_dirs, *(offloaded or [])])  # a validation campaign in neither arm (as export-table)
    _check_injected(injected)
    target = check_writable(out or default_report_path(results_dirs[0]), "--out" if out else "output",
                            directory=False, suffixes=(".html", ".htm"))
    return ReportJob(results_dirs, target, transfer_ms, offloaded, pool, injected, variation)


def default_report_path(results_dir: Path) -> Path:
    """Where `report` writes without --out: results/reports/NAME.html in the current directory."""
    return Path("results") / "reports" / f"{results_dir.resolve().name or 'results'}.html"
