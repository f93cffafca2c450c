"""`pdexporter validate --colocated DIR ... [--offloaded DIR ...] --out DIR`: every model's error on
GPU campaigns it was never fitted on (leave one campaign out), the coverage of its 90 % intervals,
and the campaign variation `export-table --campaign-variation` carries into decision.json
(docs/analysis.md, "Held-out campaigns")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdexporter.cli._common import console


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)


def validate(
    colocated: Annotated[list[Path], typer.Option(
        "--colocated", help="Records of the colocated arm, one directory per option; each directory's campaign.yaml "
                            "says its campaign (id, date, role: fit | validation).")],
    offloaded: Annotated[list[Path] | None, typer.Option(
        "--offloaded", help="Records of the offloaded arm (DecodeBenchConnector), likewise.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Where held_out.json, held_out.csv and held_out.md go.")]
    = Path("results/held-out"),
) -> None:
    """Leave one campaign out: errors and interval coverage on campaigns the models never saw."""
    from pdexporter._internal.writable import check_writable
    from pdexporter.analysis import campaigns
    from pdexporter.analysis.job import validate_campaigns
    from pdexporter.cli._common import progress_bar

    check_writable(out, "--out")
    count = len(campaigns.find_campaigns([(d, "colocated") for d in colocated]
                                         + [(d, "offloaded") for d in offloaded or []]))
    with progress_bar(count, "validate: campaigns predicted") as tick:  # one fit per campaign left out
        result = validate_campaigns(colocated, offloaded or [], tick=tick)
    written = campaigns.write_outputs(result, out)
    console.print(campaigns.render_markdown(result), highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(str(p) for p in written)}")
