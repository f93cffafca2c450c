"""`pdexporter thresholds --model decision.json [-B 8192] [--tpot-slo-ms X] [--out DIR]`: per
(B, D), the prefill length from which offloading wins, with its interval, as a table, as JSON and
as an llm-d decider snippet."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
) -> None:
    """Export, per (B, D), the prefill length from which offloading wins, for a P/D router."""
    from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
    from pdexporter._internal.writable import check_writable
    from pdexporter.analysis.arms import LLMD_SNIPPET, THRESHOLDS_JSON, llmd_snippet
    from pdexporter.analysis.arms import thresholds as compute
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
        result = compute(doc, tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms, mode=mode, p_max=p_max,
                         replicates=replicates, regime=regime,
                         chunk_sizes=[chunk_size] if chunk_size is not None else None)
    per_b = result["chunk_sizes"]
    if not per_b or not any(v["by_decode_batch_size"] for v in per_b.values()):
        raise ConfigError(f"{model}: no (B, D) with D >= 1 in its fitted range")
    measured = [int(b) for b, v in per_b.items() if not v["modelled"]]
    b = chunk_size if chunk_size is not None else max(measured or [int(k) for k in per_b])
    decodes = per_b[str(b)]["by_decode_batch_size"]
    d = decode_batch_size if decode_batch_size is not None else max(int(k) for k in decodes)
    if str(d) not in decodes:
        raise ConfigError(f"--decode-batch-size {d}: {model} has thresholds for D = {', '.join(decodes)}")
    for bb, entry in per_b.items():
        where = "MODELLED: the offloaded arm was not measured here" if entry["modelled"] else "measured"
        print(f"B={bb} ({where}):")
        for k, v in entry["by_decode_batch_size"].items():
            print(f"  D={k}: {_text(v, p_max)}")
    for line in result["rises_with_d"]:
        console.print(f"pdexporter: warning: a threshold rises with D ({line}): look at the terms' fits",
                      highlight=False)
    if doc.get("modelled"):
        console.print("[yellow]MODELLED: the model was fitted on data from a model, not a GPU[/]")
    snippet = llmd_snippet(result, b, d)
    if out is None:
        print(f"\n# llm-d ({THRESHOLDS_JSON} and {LLMD_SNIPPET}: --out DIR)")
        print(snippet, end="")
        return
    atomic_write_json(out / THRESHOLDS_JSON, result)
    atomic_write_text(out / LLMD_SNIPPET, snippet)
    print(out / THRESHOLDS_JSON)
    print(out / LLMD_SNIPPET)


def _text(entry: dict[str, Any], p_max: int) -> str:
    if entry["threshold"] is None:
        return f"never (up to {p_max} tokens)"
    iv = entry.get("interval")
    span = "" if not iv else f" (90 %: {iv[0]}..{iv[1] if iv[1] is not None else 'never'})"
    if entry["status"] == "undecided":
        assert iv, "an undecided threshold has its interval (analysis.arms)"
        return f"undecided between {iv[0]} and {iv[1] if iv[1] is not None else 'never'} (central {entry['threshold']})"
    modelled = " MODELLED beyond what was measured" if entry.get("extrapolated") else ""
    return f">= {entry['threshold']}{span}{modelled}"
