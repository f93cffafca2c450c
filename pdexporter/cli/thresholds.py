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
from pdexporter.cli._common import console
from pdexporter.cli._vocab import B_FLAGS, D_FLAGS
from pdexporter.errors import ConfigError


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
    from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
    from pdexporter._internal.writable import check_writable
    from pdexporter.analysis.thresholds import LLMD_SNIPPET, THRESHOLDS_JSON, compute_thresholds, llmd_snippet
    from pdexporter.cli.decide import load_decision

    doc = load_decision(model)
    if out is not None:
        check_writable(out)
    if mode not in (None, "two-arm", "seed"):
        raise ConfigError(f"--mode {mode!r}: expected two-arm or seed")
    if regime not in ("nominal", "degraded"):
        raise ConfigError(f"--transfer-regime {regime!r}: expected nominal or degraded")
    two_arm = bool(doc.get("two_arm")) and mode != "seed"
    if mode == "two-arm" and not doc.get("two_arm"):
        raise ConfigError(f"--mode two-arm: {model} has one arm only (export-table RESULTS --offloaded DIR)")
    if (tpot_slo_ms is not None or ttft_slo_ms is not None) and not two_arm:
        raise ConfigError("--tpot-slo-ms/--ttft-slo-ms: SLOs need the two-arm verdict (both arms measured)")
    fitted = sorted({int(b) for b in ((doc.get("valid_range") or {}).get("chunk_sizes") or [])})
    if chunk_size is not None and fitted and not min(fitted) <= chunk_size <= max(fitted):
        raise ConfigError(f"--chunk-size {chunk_size}: {model} was fitted on B = {', '.join(map(str, fitted))}")
    with console.status("scanning prefill lengths ..."):
        result = compute_thresholds(doc, tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms, mode=mode, p_max=p_max,
                                    replicates=replicates, regime=regime, transfer_ms=transfer_ms,
                                    chunk_sizes=[chunk_size] if chunk_size is not None else None)
    if not result.records:
        raise ConfigError(f"{model}: no (B, D) with D >= 1 in its fitted range")
    measured = [b for b in result.chunk_sizes() if not any(t.modelled_b for t in result.by_chunk_size(b))]
    b = chunk_size if chunk_size is not None else max(measured or result.chunk_sizes())
    decodes = [t.decode_batch_size for t in result.by_chunk_size(b)]
    d = decode_batch_size if decode_batch_size is not None else max(decodes)
    if d not in decodes:
        raise ConfigError(f"--decode-batch-size {d}: {model} has thresholds for D = {', '.join(map(str, decodes))}")
    where_p = (f"; measured P {result.measured_p[0]}..{result.measured_p[1]}" if result.measured_p else "")
    print(f"{result.mode} verdict, {result.budget.text()}{where_p}")
    for bb in result.chunk_sizes():
        entries = result.by_chunk_size(bb)
        where = "MODELLED: the offloaded arm was not measured here" if any(t.modelled_b for t in entries) \
            else "measured"
        print(f"B={bb} ({where}):")
        for t in entries:
            print(f"  D={t.decode_batch_size}: {t.text(result.step, p_max, result.measured_p)}")
    for line in result.rising():
        console.print(f"pdexporter: warning: a threshold rises with D ({line}): look at the terms' fits",
                      highlight=False)
    if doc.get("modelled"):
        console.print("[yellow]MODELLED: the model was fitted on data from a model, not a GPU[/]")
    snippet = llmd_snippet(result, b, d)
    if out is None:
        print(f"\n# llm-d ({THRESHOLDS_JSON} and {LLMD_SNIPPET}: --out DIR)")
        print(snippet, end="")
        return
    atomic_write_json(out / THRESHOLDS_JSON, result.to_dict())
    atomic_write_text(out / LLMD_SNIPPET, snippet)
    print(out / THRESHOLDS_JSON)
    print(out / LLMD_SNIPPET)
