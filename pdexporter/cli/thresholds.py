"""`pdexporter thresholds --model decision.json [--tpot-slo-ms X] [--ttft-slo-ms Y]`: per (B, D),
the prefill length from which offloading wins, as JSON and as an llm-d decider snippet."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdexporter.analysis import DECISION_JSON
from pdexporter.cli._common import console
from pdexporter.cli._vocab import B_FLAGS, D_FLAGS
from pdexporter.errors import ConfigError


def register(app: typer.Typer) -> None:
    app.command("thresholds")(thresholds)


def thresholds(
    model: Annotated[Path, typer.Option("--model", help=f"A {DECISION_JSON} written by export-table.")] = Path("results")
    / DECISION_JSON,
    tpot_slo_ms: Annotated[float | None, typer.Option(
        "--tpot-slo-ms", min=0.0, help="Two-arm: the decodes' TPOT SLO, ms.")] = None,
    ttft_slo_ms: Annotated[float | None, typer.Option(
        "--ttft-slo-ms", min=0.0, help="Two-arm: the request's TTFT SLO, ms.")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="two-arm | seed (default: two-arm when both arms were measured).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Directory for offload_thresholds.json and the llm-d snippet "
                                                           "(default: beside --model).")] = None,
    decode_batch_size: Annotated[int | None, typer.Option(
        *D_FLAGS, min=1, help="D (decodes running, requests) the llm-d snippet's single threshold is for (default: "
        "the largest D fitted).")] = None,
    chunk_size: Annotated[int | None, typer.Option(
        *B_FLAGS, min=1, help="B (max_num_batched_tokens, tokens per step) the llm-d snippet is for (default: the "
        "largest fitted).")] = None,
    p_max: Annotated[int, typer.Option("--p-max", min=64, help="Longest prefill scanned (tokens).")] = 131072,
) -> None:
    """Export, per (B, D), the prefill length above which offloading wins, for a P/D router."""
    from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
    from pdexporter.analysis.arms import LLMD_SNIPPET, THRESHOLDS_JSON, llmd_snippet
    from pdexporter.analysis.arms import thresholds as compute
    from pdexporter.cli.decide import load_decision

    doc = load_decision(model)
    if mode not in (None, "two-arm", "seed"):
        raise ConfigError(f"--mode {mode!r}: expected two-arm or seed")
    two_arm = bool(doc.get("two_arm")) and mode != "seed"
    if mode == "two-arm" and not doc.get("two_arm"):
        raise ConfigError(f"--mode two-arm: {model} has one arm only (export-table RESULTS --offloaded DIR)")
    if (tpot_slo_ms is not None or ttft_slo_ms is not None) and not two_arm:
        raise ConfigError("--tpot-slo-ms/--ttft-slo-ms: SLOs need the two-arm verdict (both arms measured)")
    with console.status("scanning prefill lengths ..."):
        result = compute(doc, tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms, mode=mode, p_max=p_max)
    per_b = result["min_prefill_tokens"]
    if not per_b or not any(per_b.values()):
        raise ConfigError(f"{model}: no (B, D) with D >= 1 in its fitted range")
    b = chunk_size if chunk_size is not None else max(int(k) for k in per_b)
    if str(b) not in per_b:
        raise ConfigError(f"--chunk-size {b}: {model} has thresholds for B = {', '.join(per_b)}")
    d = decode_batch_size if decode_batch_size is not None else max(int(k) for k in per_b[str(b)])
    if str(d) not in per_b[str(b)]:
        raise ConfigError(f"--decode-batch-size {d}: {model} has thresholds for D = {', '.join(per_b[str(b)])}")
    target = out or model.parent
    atomic_write_json(target / THRESHOLDS_JSON, result)
    atomic_write_text(target / LLMD_SNIPPET, llmd_snippet(result, b, d))
    for bb, per_d in per_b.items():
        print(f"B={bb}: " + ", ".join(f"D={k} {'never' if v is None else f'>= {v}'}" for k, v in per_d.items()))
    if doc.get("modelled"):
        console.print("[yellow]MODELLED: the model was fitted on data from a model, not a GPU[/]")
    print(target / THRESHOLDS_JSON)
    print(target / LLMD_SNIPPET)
