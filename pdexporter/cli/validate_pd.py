"""`pdexporter validate-pd COLOCATED_DIR --decode-bench DIR --pair DIR`: predict the saving at a P/D
pair's points from one GPU's two tables and the pair's transfer model, and compare with what the
pair measured (docs/disaggregation.md, "Validation")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdexporter.cli._common import console


def register(app: typer.Typer) -> None:
    app.command("validate-pd")(validate_pd)


def validate_pd(
    colocated: Annotated[Path, typer.Argument(help="Records of the colocated arm (one GPU).")],
    decode_bench: Annotated[Path, typer.Option("--decode-bench", help="Records of the DecodeBench arm (one GPU).")],
    pair: Annotated[Path, typer.Option("--pair", help="Records of the measured 1P1D pair.")],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write pd_validation.csv/.json into this directory (nothing is written without it).")] = None,
    goal_pct: Annotated[float, typer.Option("--goal-pct", min=0.0, help="Error goal for the saving (%).")] = 15.0,
) -> None:
    """Predicted vs measured saving (and TTFT cost) at the pair's points, with % errors."""
    from rich.table import Table

    from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
    from pdexporter._internal.writable import check_writable
    from pdexporter.analysis.arms import fit_transfer, predict_pair, two_arm_section, validation_summary
    from pdexporter.analysis.breakeven import decision_document
    from pdexporter.analysis.job import load_results
    from pdexporter.analysis.models import fit_data, fit_models
    from pdexporter.analysis.table import build_table
    from pdexporter.errors import RecordError

    if out is not None:
        check_writable(out)
    col = load_results(colocated)
    db = load_results(decode_bench)
    pd_ = load_results(pair)
    for path, samples, arm in (
        (colocated, col, "colocated"),
        (decode_bench, db, "offloaded"),
        (pair, pd_, "offloaded"),
    ):
        wrong = sorted({s.arm for s in samples if s.arm != arm})
        if wrong:
            raise RecordError(f"{path}: records of the {', '.join(wrong)} arm, expected {arm}")
    col_t, db_t, pd_t = build_table(col), build_table(db), build_table(pd_)
    transfer = fit_transfer(pd_)
    if transfer is None:
        console.print("[yellow]the pair's records carry no measured transfer: the prediction has no transfer term "
                      "for the TTFT[/]")
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
    table = Table(
        title="saving of offloading: predicted from one GPU (colocated - DecodeBench) vs measured on the pair"
    )
    for name in (
        "B",
        "D",
        "P",
        "predicted saved ms",
        "measured saved ms",
        "error %",
        "pred. TTFT cost",
        "meas. TTFT cost",
        "error %",
    ):
        table.add_column(name, justify="right")

    def f(x: object) -> str:
        return "-" if x is None or x != x else f"{x:.1f}"  # noqa: PLR0124 (NaN)

    for r in frame.itertuples():
        table.add_row(str(r.chunk_size), str(r.decode_batch_size), str(r.new_prefill_tokens), f(r.predicted_saved_ms),
                      f(r.measured_saved_ms), f(r.saved_error_pct), f(r.predicted_ttft_cost_ms),
                      f(r.measured_ttft_cost_ms), f(r.ttft_cost_error_pct))
    console.print(table)
    console.print(
        f"saving: median |error| {summary['saved_median_abs_error_pct']} %, "
        f"max {summary['saved_max_abs_error_pct']} %, "
        f"{summary['saved_within_goal']}/{summary['points_compared']} within {goal_pct:g} %"
    )
    if summary["modelled"]:
        console.print("[yellow]MODELLED: some records come from the embedded engine, not a GPU[/]")
    if out is not None:
        print(out / "pd_validation.csv")
