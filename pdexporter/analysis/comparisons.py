"""Two sets of results side by side, as the commands' jobs: `compare BEFORE AFTER` (what an engine
change did to each configuration's cost: `compare_job`) and `validate-pd` (the saving predicted from
one GPU's two arms against what a P/D pair measured: `validate_pd_job`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdexporter._internal.sheet import Sheet, Shown, columns
from pdexporter.errors import RecordError

__all__ = [
    "PLOTTED", "CompareJob", "compare_job", "validate_pd_job",
]

Tick = Callable[[str], None]


PLOTTED = ("tpot_penalty_ms", "prefill_duration_ms")  # the metrics `compare` draws


@dataclass
class CompareJob:
    """`compare BEFORE AFTER`: both results directories' tables, compared where they share a
    configuration: comparison.csv, comparison.json and plots/compare_<metric>.png|svg."""

    before: Path
    after: Path
    out: Path
    plots: bool
    started: float = field(default_factory=time.perf_counter)

    @property
    def steps(self) -> int:
        from pdexporter.analysis.job import record_paths

        return len(record_paths(self.before)) + len(record_paths(self.after)) + (len(PLOTTED) if self.plots else 0)

    def run(self, tick: Tick) -> list[Shown]:
        from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
        from pdexporter.analysis.compare import compare_tables, distinct_names, summarise
        from pdexporter.analysis.job import load_results
        from pdexporter.analysis.table import any_modelled, build_table

        out = self.out
        tables = {name: build_table(load_results(path, tick)) for name, path in (("before", self.before),
                                                                                 ("after", self.after))}
        comparison = compare_tables(tables["before"], tables["after"])
        summary = summarise(comparison)
        modelled = {name: any_modelled(t) for name, t in tables.items()}
        summary.update(before=str(self.before), after=str(self.after), modelled=modelled)
        written = [atomic_write_text(out / "comparison.csv", comparison.to_csv(index=False)),
                   atomic_write_json(out / "comparison.json", summary)]
        if self.plots:
            from pdexporter.analysis.plots import grid_heatmap, write_plots

            names = distinct_names(self.before, self.after)  # two sweeps named quick: their paths tell them apart
            for metric in PLOTTED:
                title = f"{metric}: change (%) from {names[0]} to {names[1]}"
                if any(modelled.values()):
                    title = f"MODELLED ({', '.join(k for k, v in modelled.items() if v)}): {title}"
                plot = grid_heatmap(comparison, f"{metric}_change_pct", "change (%)", title, f"compare_{metric}",
                                    cmap="RdBu_r", symmetric=True)
                written += write_plots([plot], out / "plots")
                plot.figure.clear()
                tick(metric)
        return [*_comparison(summary),
                f"wrote {len(written)} files to {out} in {time.perf_counter() - self.started:.2f} s"]


def compare_job(before: Path, after: Path, *, out: Path, plots: bool = True) -> CompareJob:
    from pdexporter._internal.writable import check_writable

    check_writable(out)
    return CompareJob(before, after, out, plots)


def _comparison(summary: dict[str, Any]) -> list[Shown]:
    shown: list[Shown] = [f"[bold yellow]MODELLED DATA[/] in {name} ({summary[name]})"
                          for name, flag in summary["modelled"].items() if flag]
    table = Sheet(f"{summary['configurations']} configurations in both: change from before to after",
                  columns("metric", "median", "smallest (B, D, P)", "largest (B, D, P)"))
    for metric, row in summary["metrics"].items():
        if row is None:
            table.add_row(metric, "n/a", "", "")
            continue
        table.add_row(metric, f"{row['median_change_pct']:+.1f} %",
                      f"{row['min_change_pct']:+.1f} % {tuple(row['min_at'])}",
                      f"{row['max_change_pct']:+.1f} % {tuple(row['max_at'])}")
    return [*shown, table]


def validate_pd_job(colocated: Path, decode_bench: Path, pair: Path, *, out: Path | None = None,
                    goal_pct: float = 15.0) -> list[Shown]:
    """`validate-pd`: the saving (and TTFT cost) at a P/D pair's points, predicted from one GPU's two
    tables and the pair's transfer model, against what the pair measured (pd_validation.csv/.json
    into `out`)."""
    from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
    from pdexporter._internal.writable import check_writable
    from pdexporter.analysis.arms import fit_transfer, predict_pair, two_arm_section, validation_summary
    from pdexporter.analysis.breakeven import decision_document
    from pdexporter.analysis.job import load_results
    from pdexporter.analysis.models import fit_data, fit_models
    from pdexporter.analysis.table import build_table

    if out is not None:
        check_writable(out)
    col, db, pd_ = load_results(colocated), load_results(decode_bench), load_results(pair)
    for path, samples, arm in ((colocated, col, "colocated"), (decode_bench, db, "offloaded"),
                               (pair, pd_, "offloaded")):
        wrong = sorted({s.arm for s in samples if s.arm != arm})
        if wrong:
            raise RecordError(f"{path}: records of the {', '.join(wrong)} arm, expected {arm}")
    col_t, db_t, pd_t = build_table(col), build_table(db), build_table(pd_)
    transfer = fit_transfer(pd_)
    shown: list[Shown] = [] if transfer is not None else [
        "[yellow]the pair's records carry no measured transfer: the prediction has no transfer term for the TTFT[/]"]
    data = fit_data(col_t, col)
    doc = None
    if len(data):
        doc = decision_document(fit_models(data), col_t, data=data)
        section = two_arm_section(col, db, transfer, doc, source=str(decode_bench))
        if section is not None:
            doc["two_arm"] = section
    frame = predict_pair(col_t, db_t, pd_t, transfer, doc)
    summary = validation_summary(frame, goal_pct)
    summary.update(colocated=str(colocated), decode_bench=str(decode_bench), pair=str(pair),
                   transfer=transfer.to_dict() if transfer else None,
                   modelled=any(s.modelled for s in (*col, *db, *pd_)))
    if out is not None:
        atomic_write_text(out / "pd_validation.csv", frame.to_csv(index=False))
        atomic_write_json(out / "pd_validation.json", {"summary": summary, "points": frame.to_dict(orient="records")})
    table = Sheet("saving of offloading: predicted from one GPU (colocated - DecodeBench) vs measured on the pair",
                  columns("B", "D", "P", "predicted saved ms", "measured saved ms", "error %", "pred. TTFT cost",
                          "meas. TTFT cost", "error %", justify="right"))

    def f(x: object) -> str:
        return "-" if x is None or x != x else f"{x:.1f}"  # noqa: PLR0124 (NaN)

    for r in frame.itertuples():
        table.add_row(str(r.chunk_size), str(r.decode_batch_size), str(r.new_prefill_tokens), f(r.predicted_saved_ms),
                      f(r.measured_saved_ms), f(r.saved_error_pct), f(r.predicted_ttft_cost_ms),
                      f(r.measured_ttft_cost_ms), f(r.ttft_cost_error_pct))
    shown += [table, f"saving: median |error| {summary['saved_median_abs_error_pct']} %, "
                     f"max {summary['saved_max_abs_error_pct']} %, "
                     f"{summary['saved_within_goal']}/{summary['points_compared']} within {goal_pct:g} %"]
    if summary["modelled"]:
        shown.append("[yellow]MODELLED: some records come from the embedded engine, not a GPU[/]")
    return shown
