"""The one-chunk cells of one H100 campaign predicted by another campaign's fit, on default flags and on CUDA graphs
(GPU session 29, results/h100-vllm0.22-qwen3-coder-30b-a3b-1gpu-graphs/RUN.md).

Session 28's engine A/B (`results/h100-vllm0.22-qwen3-coder-30b-a3b-engine-ab/`) measured six cells (B = 8192, D 4/12 x
P 512/1024/2048) in blocks `a` (the seed grid's flags) and `b` (graphs captured to 2064 tokens). Nothing fits on it.
Each block's aggregate interference is predicted by the decision.json of another campaign with the same flags:
session 27's seed grid for `a`, session 29's grid on graphs for `b`. Prints each cell and the MAPE per flag set.

    python scripts/graphs_held_out.py [--ab DIR] [--default DECISION] [--graphs DECISION]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from pdexporter.analysis.decision_eval import chunk_context, colocated_cost

RESULTS = Path(__file__).resolve().parents[1] / "results"
AB = RESULTS / "h100-vllm0.22-qwen3-coder-30b-a3b-engine-ab" / "qwen3-coder-30b-a3b-b8192"
DEFAULT = RESULTS / "h100-vllm0.22-qwen3-coder-30b-a3b-1gpu" / "decision.json"
GRAPHS = RESULTS / "h100-vllm0.22-qwen3-coder-30b-a3b-1gpu-graphs" / "decision.json"


def errors(ab: Path, decision: Path, condition: str) -> list[tuple[str, int, int, float, float]]:
    """(block, D, P, measured, predicted) aggregate interference, ms, of every record of `condition`'s blocks."""
    doc = json.loads(decision.read_text())
    out = []
    for record_path in sorted(ab.glob(f"b*-{condition}/*/D*_P*.json")):
        record = json.loads(record_path.read_text())
        c = record["config"]
        d, p, b = c["decode_batch_size"], c["new_prefill_tokens"], c["chunk_size"]
        predicted, _ = colocated_cost(doc, chunk_context(doc, d, p, b))
        out.append((record_path.parts[-3], d, p, record["derived"]["aggregate_interference_ms"], predicted))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ab", type=Path, default=AB)
    parser.add_argument("--default", type=Path, default=DEFAULT)
    parser.add_argument("--graphs", type=Path, default=GRAPHS)
    args = parser.parse_args()
    print("| flags | fitted on | block | D | P | measured ms | predicted ms | error |")
    print("|---|---|---|---|---|---|---|---|")
    summary = []
    for flags, decision, condition in (("default", args.default, "a"), ("graphs to 2064", args.graphs, "b")):
        rows = errors(args.ab, decision, condition)
        errs = [100.0 * (pred / meas - 1.0) for *_, meas, pred in rows]
        for (block, d, p, meas, pred), e in zip(rows, errs, strict=True):
            print(f"| {flags} | {decision.parent.name} | {block} | {d} | {p} | {meas:.1f} | {pred:.1f} | {e:+.1f} % |")
        summary.append(f"{flags}: {len(errs)} cells, MAPE {statistics.fmean(abs(e) for e in errs):.1f} %, median "
                       f"{statistics.median(errs):+.1f} %, max {max(abs(e) for e in errs):.1f} %")
    print()
    for line in summary:
        print(line)


if __name__ == "__main__":
    main()
