"""GPU session 30's validation points on CUDA graphs (results/h100-vllm0.22-qwen3-coder-30b-a3b-validation-graphs-s30,
campaign s30-h100, read by no fit) predicted by the fit of another campaign on the same flags: session 29's seed grid
on graphs (s29-h100, another day and H100 host).

Two sets of predictions are scored against what s30 measured (aggregate interference, `interference_table.csv`):
- **as committed before the run** (`predictions*.json`, the code of the plan's commit);
- **now**: the same records of session 29 through the code as it is (its `decision.json`, re-derived by
  scripts/results.sh), with the H200 campaigns' variation carried for the intervals (`--campaign-variation`).
Per chunk size and kind of point: P < 512 (below the grid's smallest P, so extrapolated: the fit cannot tell a graph
step's fixed part from its per-token part there), one-chunk graph steps (P + D <= 2064), one eager chunk, several
chunks. MAPE, and the share inside the 90 % interval, bootstrap-only and with the campaign variation.

    python scripts/graphs_validation.py [--out results/.../scores.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from pdexporter.analysis.campaigns import fold_variation, load_variation
from pdexporter.analysis.decision_eval import evaluate_decision

RESULTS = Path(__file__).resolve().parents[1] / "results"
S30 = RESULTS / "h100-vllm0.22-qwen3-coder-30b-a3b-validation-graphs-s30"
S29 = RESULTS / "h100-vllm0.22-qwen3-coder-30b-a3b-1gpu-graphs" / "decision.json"
VARIATION = RESULTS / "h200-held-out" / "held_out.json"
SUFFIX = {8192: "", 6144: "-b6144", 12288: "-b12288", 3072: "-b3072"}
GRAPH_MAX = 2064  # the flags' largest capture size (sweeps/h200-validation-graphs.yaml)
Key = tuple[int, int, int]


def kind(b: int, d: int, p: int) -> str:
    if p < 512:
        return "P < 512 (extrapolated)"
    if p + d <= GRAPH_MAX:
        return "one graph step"
    return "one eager chunk" if p + d <= b else "several chunks"


def measured(directory: Path) -> dict[Key, float]:
    df = pd.read_csv(directory / "interference_table.csv")
    df = df[df["aggregate_interference_ms"].notna() & (df["decode_batch_size"] >= 1)]
    return {(int(r.chunk_size), int(r.decode_batch_size), int(r.new_prefill_tokens)): float(r.aggregate_interference_ms)
            for r in df.itertuples()}


def committed(b: int, variation: bool) -> dict[Key, tuple[float, list[float]]]:
    name = f"predictions{SUFFIX[b]}{'-campaign-variation' if variation else ''}.json"
    points = json.loads((S30 / name).read_text())["points"]
    return {(p["chunk_size"], p["decode_batch_size"], p["new_prefill_tokens"]):
            (p["colocated_aggregate_interference_ms"], p["colocated_interval_90"]) for p in points}


def now(doc: Mapping[str, Any], keys: Sequence[Key]) -> dict[Key, tuple[float, list[float]]]:
    out = {}
    for b, d, p in keys:
        v = evaluate_decision(doc, d, p, b)
        out[(b, d, p)] = (float(v["cost_ms"]), list(v["intervals"]["colocated_cost_ms"]))
    return out


def row(label: str, truth: Mapping[Key, float], pred: Mapping[Key, tuple[float, list[float]]],
        wide: Mapping[Key, tuple[float, list[float]]], keep: Callable[[Key], bool]) -> str:
    keys = [k for k in truth if k in pred and keep(k)]
    if not keys:
        return f"| {label} | 0 | | | | |"
    errors = [100.0 * (pred[k][0] / truth[k] - 1.0) for k in keys]
    inside = sum(pred[k][1][0] <= truth[k] <= pred[k][1][1] for k in keys)
    inside_wide = sum(wide[k][1][0] <= truth[k] <= wide[k][1][1] for k in keys)
    mape = statistics.fmean(abs(e) for e in errors)
    return (f"| {label} | {len(keys)} | {mape:.1f} | {statistics.median(errors):+.1f} "
            f"| {100 * inside / len(keys):.0f} % | {100 * inside_wide / len(keys):.0f} % |")


Predicted = dict[Key, tuple[float, list[float]]]


def table(title: str, truth: Mapping[Key, float], pred: Callable[[bool], Predicted]) -> list[str]:
    plain, wide = pred(False), pred(True)
    lines = [f"### {title}", "", "| points | n | MAPE % | median error | inside 90 % (bootstrap) "
             "| inside 90 % (campaign variation) |", "|---|---|---|---|---|---|"]
    for b in SUFFIX:
        lines.append(row(f"B = {b}, all", truth, plain, wide, lambda k, b=b: k[0] == b))
    lines.append(row("all four B", truth, plain, wide, lambda k: True))
    lines.append(row("all four B, P >= 512 (the fit's range)", truth, plain, wide, lambda k: k[2] >= 512))
    for name in ("P < 512 (extrapolated)", "one graph step", "one eager chunk", "several chunks"):
        lines.append(row(f"all four B, {name}", truth, plain, wide, lambda k, n=name: kind(*k) == n))
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=S30 / "scores.md")
    args = parser.parse_args()
    truth = measured(S30)
    doc = json.loads(S29.read_text())
    wide_doc = fold_variation(doc, *load_variation(VARIATION))
    keys = sorted(truth)
    current = {False: now(doc, keys), True: now(wide_doc, keys)}
    lines = ["# GPU session 30's points on graphs, predicted by session 29's fit (another campaign, same flags)", "",
             "Written by `python scripts/graphs_validation.py` (run by scripts/results.sh); the measured values are "
             "this directory's `interference_table.csv`. Median error: predicted over measured, signed.", ""]
    lines += table("As predicted before the run (`predictions*.json`, the plan's code)", truth,
                   lambda v: {k: x for b in SUFFIX for k, x in committed(b, v).items()})
    lines += table("Now (session 29's records through the current code)", truth, lambda v: current[v])
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
