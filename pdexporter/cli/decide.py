"""`pdexporter decide -D 4 -P 16384 --chunk-size 8192`: offload this prefill or keep it local?"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pdexporter._internal.text import plural
from pdexporter.analysis import DECISION_JSON, DECISION_SCHEMA
from pdexporter.cli._common import console
from pdexporter.errors import ConfigError


def register(app: typer.Typer) -> None:
    app.command("decide")(decide)


def load_decision(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--model {path}: no such file (write one with `pdexporter export-table`)") from None
    except OSError as exc:
        raise ConfigError(f"--model {path}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--model {path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("schema") != DECISION_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ConfigError(f"--model {path}: schema {found!r}, expected {DECISION_SCHEMA!r}")
    return doc


def decide(
    decode_batch_size: Annotated[int, typer.Option("--decode-batch-size", "-D", min=0, help="Decodes running now.")],
    new_prefill_tokens: Annotated[int, typer.Option("--new-prefill-tokens", "-P", min=1, help="Prefill tokens to compute.")],
    chunk_size: Annotated[int, typer.Option("--chunk-size", "-B", min=1, help="The engine's max_num_batched_tokens.")] = 8192,
    transfer_ms: Annotated[float | None, typer.Option("--transfer-ms", min=0.0, help="Transfer time of an offload (default: the model's, 50 ms).")] = None,
    model: Annotated[Path | None, typer.Option("--model", help=f"A {DECISION_JSON} written by export-table.")] = None,
    results: Annotated[Path | None, typer.Option("--results", help="Fit from this results directory instead.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdict as JSON.")] = False,
) -> None:
    """Answer offload or not, with the numbers behind it."""
    if model is not None and results is not None:
        raise ConfigError("give --model or --results, not both")
    if decode_batch_size >= chunk_size:
        raise ConfigError(f"-D {decode_batch_size} with --chunk-size {chunk_size}: no room for a prefill chunk")
    measured: dict[str, Any] | None = None
    if results is not None:
        doc, measured = _fit_from(results, decode_batch_size, new_prefill_tokens, chunk_size)
    else:
        path = model or Path("results") / DECISION_JSON
        doc = load_decision(path)
    from pdexporter.analysis.breakeven import evaluate_decision

    verdict = evaluate_decision(doc, decode_batch_size, new_prefill_tokens, chunk_size, transfer_ms)
    if as_json:
        print(json.dumps({**verdict, "decode_batch_size": decode_batch_size, "new_prefill_tokens": new_prefill_tokens,
                          "chunk_size": chunk_size, "modelled": doc.get("modelled", False), "measured": measured},
                         indent=2))
        return
    word = "OFFLOAD" if verdict["offload"] else "KEEP LOCAL"
    relation = ">" if verdict["offload"] else "<="
    print(f"{word}: interference {verdict['cost_ms']:.1f} ms {relation} transfer {verdict['transfer_ms']:.1f} ms "
          f"(margin {verdict['margin_ms']:+.1f} ms)")
    fit = doc.get("fit", {})
    r2 = fit.get("held_out_r2")
    score = ("not enough points for a held-out fit" if r2 is None
             else f"held-out R^2 {r2:.4f}, {fit.get('scheme', '?')}")
    print(f"  D={decode_batch_size} P={new_prefill_tokens} B={chunk_size}: {plural(verdict['chunks'], 'chunk')} of "
          f"<= {chunk_size - decode_batch_size} tokens; model {verdict['model']} ({score})")
    if measured is not None:
        seen = "modelled" if doc.get("modelled") else "measured"
        print(f"  {seen} at this point: {measured['aggregate_interference_ms']:.1f} ms aggregate "
              f"({plural(measured['reps'], 'rep')})")
    if not verdict["in_fitted_range"]:
        console.print(f"[yellow]{outside_range_line(doc.get('valid_range') or {}, decode_batch_size, new_prefill_tokens, chunk_size)}[/]",
                      highlight=False, soft_wrap=True)
    if doc.get("modelled"):
        console.print("[yellow]MODELLED: the model was fitted on data from a model, not a GPU[/]")


_RANGE_NAMES = (("decode_batch_size", "D"), ("new_prefill_tokens", "P"), ("chunk_size", "B"))


def outside_range_line(valid_range: dict[str, Any], d: int, p: int, b: int) -> str:
    """One line: which of D, P, B lie outside the fitted range, and that range."""
    values = {"decode_batch_size": d, "new_prefill_tokens": p, "chunk_size": b}
    outside = []
    for key, letter in _RANGE_NAMES:
        lo, hi = (valid_range.get(key) or (None, None))
        if lo is not None and not lo <= values[key] <= hi:
            outside.append(f"{letter}={values[key]} (fitted {lo}..{hi})")
    return f"an extrapolation: {', '.join(outside)} outside the fitted range"


def _fit_from(results: Path, d: int, p: int, b: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from pdexporter.analysis.job import analyse, load_results

    analysis = analyse(load_results(results), source=str(results))
    if analysis.decision is None:
        raise ConfigError(f"--results {results}: no grid point with D >= 1 and a measured cost; nothing to fit")
    table = analysis.table
    row = table[(table["chunk_size"] == b) & (table["decode_batch_size"] == d) & (table["new_prefill_tokens"] == p)]
    measured = None
    if len(row) and row["aggregate_interference_ms"].notna().iloc[0]:
        measured = {"aggregate_interference_ms": float(row["aggregate_interference_ms"].iloc[0]),
                    "reps": int(row["reps"].iloc[0])}
    return analysis.decision, measured
