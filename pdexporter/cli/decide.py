"""`pdexporter decide -D 4 -P 16384 --chunk-size 8192`: offload this prefill or keep it local?
(`pdexporter.analysis.verdicts.decide_job`)"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdexporter._internal.bounds import MAX_DECODE_BATCH, MAX_TOKENS
from pdexporter.analysis import DECISION_JSON
from pdexporter.cli._common import console, show
from pdexporter.cli._vocab import B_FLAGS, D_FLAGS, P_FLAGS
from pdexporter.engines import DEFAULT_CHUNK_SIZE


def register(app: typer.Typer) -> None:
    app.command("decide")(decide)


def decide(
    decode_batch_size: Annotated[int, typer.Option(
        *D_FLAGS, min=0, max=MAX_DECODE_BATCH, help="Decodes running now (D, requests).")],
    new_prefill_tokens: Annotated[int, typer.Option(
        *P_FLAGS, min=1, max=MAX_TOKENS, help="Prefill tokens to compute (P).")],
    chunk_size: Annotated[int, typer.Option(
        *B_FLAGS, min=1, max=MAX_TOKENS, help="The engine's max_num_batched_tokens (tokens per step).")
    ] = DEFAULT_CHUNK_SIZE,
    transfer_ms: Annotated[float | None, typer.Option(
        "--transfer-ms", min=0.0, max=1e7, help="Transfer time of an offload, ms (default: the model's, 50 ms).")
    ] = None,
    model: Annotated[Path | None, typer.Option("--model", help=f"A {DECISION_JSON} written by export-table.")] = None,
    results: Annotated[Path | None, typer.Option("--results", help="Fit from this results directory instead.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdict as JSON.")] = False,
    offloaded: Annotated[Path | None, typer.Option(
        "--offloaded", help="With --results: the offloaded arm's records (DecodeBench or a P/D pair), for the "
        "two-arm verdict (docs/disaggregation.md).")] = None,
    tpot_slo_ms: Annotated[float | None, typer.Option(
        "--tpot-slo-ms", min=0.0, help="Two-arm: the running decodes' TPOT while the prefill runs must stay under "
        "this, ms.")] = None,
    ttft_slo_ms: Annotated[float | None, typer.Option(
        "--ttft-slo-ms", min=0.0, help="Two-arm: the prefill request's TTFT must stay under this, ms.")] = None,
    mode: Annotated[str | None, typer.Option(
        "--mode", help="two-arm (default when both arms were measured) | seed (the seed's constant-budget rule).")
    ] = None,
    regime: Annotated[str, typer.Option(
        "--transfer-regime", help="nominal | degraded: the KV transfer as it usually ran, or as in the slow episodes "
        "the pair measured (docs/disaggregation.md).")] = "nominal",
) -> None:
    """Answer offload or not, with the numbers behind it."""
    from pdexporter.analysis.verdicts import decide_job

    decided = decide_job(decode_batch_size, new_prefill_tokens, chunk_size, transfer_ms=transfer_ms, model=model,
                         results=results, offloaded=offloaded, tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms,
                         mode=mode, regime=regime)
    if as_json:
        print(decided.to_json())
        return
    rendered = decided.render()
    print("\n".join(rendered.out))
    show(rendered.notes, console)
