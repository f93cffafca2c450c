"""Issue 30: the predictions of the committed models at the validation campaign's points, written
before the campaign ran (results/h200-vllm0.22-qwen3-coder-30b-a3b-validation/predictions.json).

A two-arm decision.json predicts both arms; a one-arm one (the seed's rule) the colocated arm alone. A sweep
without `only` is predicted at every point of its grid.

    python3 scripts/gpu/validation_predict.py [--model results/h200-arms-decodebench/decision.json] \
        [--sweep sweeps/h200-validation.yaml] --out FILE
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdexporter.analysis.decision_eval import evaluate_decision
from pdexporter.sweep.spec import load_sweep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="results/h200-arms-decodebench/decision.json")
    ap.add_argument("--sweep", default="sweeps/h200-validation.yaml")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    doc = json.loads(Path(args.model).read_text())
    spec = load_sweep(args.sweep)
    points = []
    grid = spec.grid
    cells = grid.only or list(itertools.product(grid.chunk_sizes, grid.decode_batch_sizes, grid.new_prefill_tokens))
    for b, d, p in cells:
        v = evaluate_decision(doc, d, p, b)
        iv = v["intervals"]
        point = {
            "chunk_size": b, "decode_batch_size": d, "new_prefill_tokens": p,
            "colocated_aggregate_interference_ms": round(v.get("colocated_cost_ms", v.get("cost_ms")), 2),
            "colocated_interval_90": [round(x, 2) for x in iv["colocated_cost_ms"]],
            "offload": v["offload"], "decided": v["decided"], "extrapolated": v["extrapolated"],
        }
        if "offloaded_cost_ms" in v:
            point["offloaded_aggregate_interference_ms"] = round(v["offloaded_cost_ms"], 2)
            point["offloaded_interval_90"] = [round(x, 2) for x in iv["offloaded_cost_ms"]]
        points.append(point)
    out = {"model": args.model, "sweep": args.sweep, "points": points}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(points)} points -> {args.out}")


if __name__ == "__main__":
    main()
