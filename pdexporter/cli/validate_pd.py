"""`pdexporter validate-pd COLOCATED_DIR --decode-bench DIR --pair DIR`: predict the saving at a P/D
pair's points from one GPU's two tables and the pair's transfer model, and compare with what the
pair measured (docs/disaggregation.md, "Validation")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdexporter.cli._common import show


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
    from pdexporter.analysis.comparisons import validate_pd_job

    show(validate_pd_job(colocated, decode_bench, pair, out=out, goal_pct=goal_pct))
    if out is not None:
        print(out / "pd_validation.csv")
