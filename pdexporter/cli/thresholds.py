"""`pdexporter thresholds --model decision.json [-B 8192] [--tpot-slo-ms X] [--transfer-ms X] [--out DIR]`:
per (B, D), the prefill length from which offloading wins, with its interval, as a table, as JSON
and as an llm-d decider snippet (`analysis.thresholds`: the one computation the report and the
live exporter use too)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdexporter._internal.bounds import MAX_DECODE_BATCH, MAX_TOKENS
from pdexporter.analysis import DECISION_JSON
from pdexporter.cli._common import console, show
from pdexporter.cli._vocab import B_FLAGS, D_FLAGS


def register(app: typer.Typer) -> None:
    app.command("thresholds")(thresholds)


def thresholds(
    model: Annotated[Path, typer.Option("--model", help=f"A {DECISION_JSON} written by export-table.")] = Path(
        "results"
    )
    / DECISION_JSON,
    tpot_slo_ms: Annotated[
        float | None, typer.Option("--tpot-slo-ms", min=0.0, help="Two-arm: the decodes' TPOT SLO, ms.")
    ] = None,
    ttft_slo_ms: Annotated[
        float | None, typer.Option("--ttft-slo-ms", min=0.0, help="Two-arm: the request's TTFT SLO, ms.")
    ] = None,
    mode: Annotated[
        str | None, typer.Option("--mode", help="two-arm | seed (default: two-arm when both arms were measured).")
    ] = None,
    regime: Annotated[
        str,
        typer.Option(
            "--transfer-regime",
            help="nominal | degraded: the KV transfer as it usually ran, or as in its slow episodes.",
        ),
    ] = "nominal",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write offload_thresholds.json and the llm-d snippet into this directory (nothing is written "
            "without it).",
        ),
    ] = None,
    decode_batch_size: Annotated[
        int | None,
        typer.Option(
            *D_FLAGS,
            min=1,
            max=MAX_DECODE_BATCH,
            help="D (decodes running, requests) the llm-d snippet's single "
            "threshold is for (default: the largest D fitted).",
        ),
    ] = None,
    chunk_size: Annotated[
        int | None,
        typer.Option(
            *B_FLAGS,
            min=1,
            max=MAX_TOKENS,
            help="Only this B (max_num_batched_tokens); the llm-d snippet is for it "
            "(default: every fitted B, the snippet for the largest where both arms were measured).",
        ),
    ] = None,
    p_max: Annotated[
        int, typer.Option("--p-max", min=64, max=MAX_TOKENS, help="Longest prefill scanned (tokens).")
    ] = 131072,
    replicates: Annotated[
        int, typer.Option("--replicates", min=0, max=1000, help="Bootstrap resamples behind each interval (0: none).")
    ] = 100,
    transfer_ms: Annotated[
        float | None,
        typer.Option("--transfer-ms", min=0.0, max=1e7,
                     help="Transfer time of an offload, ms (default: the measured transfer model, else the seed's "
                          "50 ms)."),
    ] = None,
) -> None:
    """Export, per (B, D), the prefill length from which offloading wins, for a P/D router."""
    options = dict(locals())
    from pdexporter.analysis.verdicts import thresholds_job

    job = thresholds_job(**options)
    with console.status("scanning prefill lengths ..."):
        rendered = job.run()
    print("\n".join(rendered.out))
    show(rendered.notes, console)
