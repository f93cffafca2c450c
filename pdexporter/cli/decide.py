"""`pdexporter decide -D 4 -P 16384 --chunk-size 8192`: offload this prefill or keep it local?"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pdexporter._internal.bounds import MAX_DECODE_BATCH, MAX_TOKENS
from pdexporter._internal.finite import NotFinite, loads_finite
from pdexporter._internal.text import plural
from pdexporter.analysis import DECISION_JSON, DECISION_SCHEMA
from pdexporter.analysis.decision_eval import DECIDED_SHARE, WEAK_R2, Verdict, chunk_context, held_out_text
from pdexporter.cli._common import console
from pdexporter.cli._vocab import B_FLAGS, D_FLAGS, P_FLAGS
from pdexporter.errors import ConfigError


def register(app: typer.Typer) -> None:
    app.command("decide")(decide)


def load_decision(path: Path, flag: str = "--model") -> dict[str, Any]:
    try:
        doc = loads_finite(path.read_text(encoding="utf-8"))  # NaN coefficients gave a "decided" verdict
    except NotFinite as exc:
        raise ConfigError(f"--model {path}: {exc}") from None
    except FileNotFoundError:
        raise ConfigError(f"{flag} {path}: no such file (write one with `pdexporter export-table`)") from None
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} {path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("schema") != DECISION_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        hint = (" (written by an older pdexporter: run export-table on its results again)"
                if found == "pdexporter.decision/v1" else "")
        raise ConfigError(f"{flag} {path}: schema {found!r}, expected {DECISION_SCHEMA!r}{hint}")
    from pdexporter.analysis.decision_schema import validate_decision

    validate_decision(doc, f"{flag} {path}")  # every field as the shipped schema says, every number finite
    return doc


def decide(
    decode_batch_size: Annotated[
        int, typer.Option(*D_FLAGS, min=0, max=MAX_DECODE_BATCH, help="Decodes running now (D, requests).")
    ],
    new_prefill_tokens: Annotated[
        int, typer.Option(*P_FLAGS, min=1, max=MAX_TOKENS, help="Prefill tokens to compute (P).")
    ],
    chunk_size: Annotated[
        int,
        typer.Option(*B_FLAGS, min=1, max=MAX_TOKENS, help="The engine's max_num_batched_tokens (tokens per step)."),
    ] = 8192,
    transfer_ms: Annotated[
        float | None,
        typer.Option("--transfer-ms", min=0.0, max=1e7,
                     help="Transfer time of an offload, ms (default: the model's, 50 ms)."),
    ] = None,
    model: Annotated[Path | None, typer.Option("--model", help=f"A {DECISION_JSON} written by export-table.")] = None,
    results: Annotated[Path | None, typer.Option("--results", help="Fit from this results directory instead.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdict as JSON.")] = False,
    offloaded: Annotated[
        Path | None,
        typer.Option(
            "--offloaded",
            help="With --results: the offloaded arm's records (DecodeBench or a P/D pair), for the "
            "two-arm verdict (docs/disaggregation.md).",
        ),
    ] = None,
    tpot_slo_ms: Annotated[
        float | None,
        typer.Option(
            "--tpot-slo-ms",
            min=0.0,
            help="Two-arm: the running decodes' TPOT while the prefill runs must stay under this, ms.",
        ),
    ] = None,
    ttft_slo_ms: Annotated[
        float | None,
        typer.Option("--ttft-slo-ms", min=0.0, help="Two-arm: the prefill request's TTFT must stay under this, ms."),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(
            "--mode", help="two-arm (default when both arms were measured) | seed (the seed's constant-budget rule)."
        ),
    ] = None,
    regime: Annotated[
        str,
        typer.Option(
            "--transfer-regime",
            help="nominal | degraded: the KV transfer as it usually ran, or as in the slow episodes "
            "the pair measured (docs/disaggregation.md).",
        ),
    ] = "nominal",
) -> None:
    """Answer offload or not, with the numbers behind it."""
    if model is not None and results is not None:
        raise ConfigError("give --model or --results, not both")
    if offloaded is not None and results is None:
        raise ConfigError("--offloaded: only with --results (a decision.json carries both arms already)")
    if mode not in (None, "two-arm", "seed"):
        raise ConfigError(f"--mode {mode!r}: expected two-arm or seed")
    if regime not in ("nominal", "degraded"):
        raise ConfigError(f"--transfer-regime {regime!r}: expected nominal or degraded")
    if decode_batch_size >= chunk_size:
        raise ConfigError(f"--decode-batch-size {decode_batch_size} with --chunk-size {chunk_size}: no room for a "
                          "prefill chunk")
    measured: dict[str, Any] | None = None
    if results is not None:
        doc, measured = _fit_from(results, decode_batch_size, new_prefill_tokens, chunk_size, offloaded)
    else:
        path = model or Path("results") / DECISION_JSON
        doc = load_decision(path)
    if mode == "two-arm" and not doc.get("two_arm"):
        raise ConfigError("--mode two-arm: the decision has one arm only (export-table RESULTS --offloaded DIR, or "
                          "decide --results RESULTS --offloaded DIR)")
    if (tpot_slo_ms is not None or ttft_slo_ms is not None) and (mode == "seed" or not doc.get("two_arm")):
        raise ConfigError("--tpot-slo-ms/--ttft-slo-ms: SLOs need the two-arm verdict (both arms measured)")
    from pdexporter.analysis.breakeven import evaluate_decision

    degraded = ((doc.get("two_arm") or {}).get("terms") or {}).get("transfer", {}).get("degraded")
    if regime == "degraded" and not degraded:
        raise ConfigError("--transfer-regime degraded: the decision's transfer had no degraded windows")
    verdict = evaluate_decision(doc, decode_batch_size, new_prefill_tokens, chunk_size, transfer_ms,
                                tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms, mode=mode, regime=regime)
    if degraded and regime == "nominal" and verdict["mode"] == "two-arm" and transfer_ms is None:
        other = evaluate_decision(doc, decode_batch_size, new_prefill_tokens, chunk_size, tpot_slo_ms=tpot_slo_ms,
                                  ttft_slo_ms=ttft_slo_ms, mode=mode, regime="degraded", intervals=False)
        verdict["degraded_regime"] = {"offload": other["offload"], "verdict": other["verdict"],
                                      "share_of_windows": degraded.get("share_of_windows"),
                                      "gb_per_s": degraded.get("gb_per_s")}
    if as_json:
        print(json.dumps({**verdict, "decode_batch_size": decode_batch_size, "new_prefill_tokens": new_prefill_tokens,
                          "chunk_size": chunk_size, "modelled": doc.get("modelled", False), "measured": measured},
                         indent=2))
        return
    if verdict["mode"] == "two-arm":
        _print_two_arm(doc, verdict, decode_batch_size, new_prefill_tokens, chunk_size, measured)
        return
    word = "OFFLOAD" if verdict["offload"] else "KEEP LOCAL"
    relation = ">" if verdict["offload"] else "<="
    if not verdict["decided"]:  # the interval holds the budget, or the resamples disagree
        word, relation = f"UNDECIDED (leaning {word.lower()})", "vs"
    print(f"{word}: interference {verdict['cost_ms']:.1f} ms{_iv(verdict['intervals'].get('colocated_cost_ms'))} "
          f"{relation} transfer {verdict['transfer_ms']:.1f} ms (margin {verdict['margin_ms']:+.1f} ms)")
    fit = doc.get("fit", {})
    r2 = fit.get("held_out_r2")
    score = ("not enough points for a held-out fit" if r2 is None
             else f"held-out R^2 {r2:.4f}, {fit.get('scheme', '?')}")
    print(f"  D={decode_batch_size} P={new_prefill_tokens} B={chunk_size}: {plural(verdict['chunks'], 'chunk')} of "
          f"<= {chunk_size - decode_batch_size} tokens; model {verdict['model']} ({score})")
    _print_footer(doc, verdict, measured, seed_note=bool(doc.get("two_arm")))


def _print_footer(doc: dict[str, Any], verdict: Verdict, measured: dict[str, Any] | None,
                  seed_note: bool = False) -> None:
    """The lines both verdicts end with: the point as measured, the fitted range, what the model was fitted on."""
    if measured is not None:
        seen = "modelled" if doc.get("modelled") else "measured"
        print(f"  {seen} at this point: {measured['aggregate_interference_ms']:.1f} ms aggregate "
              f"({plural(measured['reps'], 'rep')})")
    if not verdict["in_fitted_range"]:
        # what `evaluate_decision` found outside the fitted ranges, and its widest widening
        console.print(f"[yellow]pdexporter: warning: MODELLED beyond what was measured "
                      f"({'; '.join(verdict['extrapolated'])}); the intervals of the numbers resting on them "
                      f"widened (up to x{verdict['interval_widening']:.1f})[/]", highlight=False, soft_wrap=True)
    console.print(held_out_text(doc), highlight=False, soft_wrap=True)
    if seed_note:
        console.print("the seed's rule (--mode seed); the two-arm verdict is the default with both arms measured")
    if doc.get("modelled"):
        console.print("[yellow]MODELLED: the model was fitted on data from a model, not a GPU[/]")


def evaluate_graph_chunks(doc: dict[str, Any], d: int, p: int, b: int) -> int:
    """Chunks that run eagerly (the rest replay CUDA graphs)."""
    return int(chunk_context(doc, d, p, b)["eager_chunks"])


def _iv(interval: list[float] | None, signed: bool = False) -> str:
    """' (90 %: a..b ms)' for an interval; differences keep their sign, durations never have one."""
    if not interval:
        return ""
    lo, hi = interval
    if signed:
        return f" (90 %: {lo:+.0f}..{hi:+.0f} ms)"
    return f" (90 %: {max(lo, 0.0):.1f}..{max(hi, 0.0):.1f} ms)"


def _print_two_arm(doc: dict[str, Any], v: Verdict, d: int, p: int, b: int,
                   measured: dict[str, Any] | None) -> None:
    word = "UNDECIDED" if not v["decided"] else ("OFFLOAD" if v["offload"] else "KEEP LOCAL")
    print(f"{word}: {v['verdict'].split(': ', 1)[1]}" if v["decided"] else f"{word} {v['verdict'].split(' ', 1)[1]}")
    ivs = v["intervals"]
    split = v["offloaded_ttft_split_ms"]
    arms = doc["two_arm"]
    transfer = arms["terms"].get("transfer") or {}
    print(f"  decodes lose: colocated {v['colocated_cost_ms']:.1f} ms{_iv(ivs.get('colocated_cost_ms'))}, offloaded "
          f"{v['offloaded_cost_ms']:.1f} ms{_iv(ivs.get('offloaded_cost_ms'))}; saved {v['saved_ms']:+.1f} ms"
          f"{_iv(ivs.get('saved_ms'), signed=True)}")
    if v["transfer_source"] == "measured" and transfer.get("gb_per_s"):
        how = (f"{p * transfer['bytes_per_token'] / 1e9:.2f} GB at {transfer['gb_per_s']:.0f} GB/s + "
               f"{transfer['latency_ms']:.1f} ms")
    else:
        how = v["transfer_source"]
    print(f"  TTFT: colocated {v['colocated_ttft_ms']:.1f} ms{_iv(ivs.get('colocated_ttft_ms'))}; offloaded "
          f"{v['offloaded_ttft_ms']:.1f} ms{_iv(ivs.get('offloaded_ttft_ms'))} = prefill alone {split['prefill']:.1f} "
          f"+ KV transfer {split['transfer']:.1f} ({how}) + decode side {split['decode_side']:.1f} ms; "
          f"cost {v['ttft_cost_ms']:+.1f} ms{_iv(ivs.get('ttft_cost_ms'), signed=True)}")
    if v["colocated_tpot_ms"] is not None and v["offloaded_tpot_ms"] is not None and d > 0:
        print(f"  TPOT during the prefill: colocated {v['colocated_tpot_ms']:.1f} ms, offloaded "
              f"{v['offloaded_tpot_ms']:.1f} ms")
    for name, held in v["slos"].items():
        print(f"  {name} SLO: colocated {'held' if held['colocated'] else 'missed'}, offloaded "
              f"{'held' if held['offloaded'] else 'missed'}")
    graphs = v["chunks"] - (evaluate_graph_chunks(doc, d, p, b) if doc else 0)
    rule = doc.get("chunk_rule") or {}
    budget = b - d if rule.get("decodes_take_budget", True) else b
    print(f"  D={d} P={p} B={b}: {plural(v['chunks'], 'chunk')} of <= {budget} tokens"
          f"{f', {graphs} run as CUDA graphs' if graphs else ''}; offloaded arm: {arms.get('offloaded_setup')}; "
          f"rule: {v['reason']}")
    if v.get("agreement") is not None:
        n = len((doc.get("replicates") or {}).get("model") or [])
        print(f"  {v['agreement']:.0%} of {n} bootstrap resamples agree"
              + ("" if v["decided"] else f" (a decided verdict needs {DECIDED_SHARE:.0%})"))
    if v.get("degraded_regime"):
        deg = v["degraded_regime"]
        same = deg["offload"] == v["offload"]
        console.print(f"pdexporter: note: {deg['share_of_windows']:.0%} of the pair's KV transfers ran in a slow "
                      f"regime ({deg['gb_per_s']:g} GB/s); there the verdict is "
                      f"{'the same' if same else ('offload' if deg['offload'] else 'keep local')}"
                      f"{'' if same else ' (--transfer-regime degraded)'}", highlight=False, soft_wrap=True)
    if v.get("weak_fits"):
        console.print(f"pdexporter: warning: weak fit: {'; '.join(v['weak_fits'])} (held-out R^2 below "
                      f"{WEAK_R2:g}): the intervals say how little they pin down", highlight=False, soft_wrap=True)
    _print_footer(doc, v, measured)


def _fit_from(results: Path, d: int, p: int, b: int,
              offloaded: Path | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from pdexporter.analysis.job import analyse, load_results

    off = load_results(offloaded) if offloaded is not None else None
    analysis = analyse(load_results(results), source=str(results), offloaded=off,
                       offloaded_source=str(offloaded) if offloaded is not None else "")
    if analysis.decision is None:
        raise ConfigError(f"--results {results}: no grid point with D >= 1 and a measured cost; nothing to fit")
    table = analysis.table
    row = table[(table["chunk_size"] == b) & (table["decode_batch_size"] == d) & (table["new_prefill_tokens"] == p)]
    measured = None
    if len(row) and row["aggregate_interference_ms"].notna().iloc[0]:
        measured = {"aggregate_interference_ms": float(row["aggregate_interference_ms"].iloc[0]),
                    "reps": int(row["reps"].iloc[0])}
    return analysis.decision, measured
