"""Issue 30: score the predictions committed before the validation campaign ran
(results/h200-vllm0.22-qwen3-coder-30b-a3b-validation/predictions.json) against what it measured.

For every point: the measured aggregate_interference_ms (the interference_table.csv of
`export-table`) against the predicted colocated cost (the colocated arm's directory) and the
predicted offloaded cost (the DecodeBench arm's directory). Per arm: MAPE and the share of measured
values inside the predicted 90 % interval, overall, for the 44 validation points (in no committed
grid) and for the 15 reference points (D in {1, 4, 12}, re-measured every campaign).

    python3 scripts/gpu/validation_score.py \
        [--predictions results/h200-vllm0.22-qwen3-coder-30b-a3b-validation/predictions.json] \
        [--colocated results/h200-vllm0.22-qwen3-coder-30b-a3b-validation] \
        [--offloaded results/h200-vllm0.22-qwen3-coder-30b-a3b-decodebench-validation] \
        --out results/h200-vllm0.22-qwen3-coder-30b-a3b-validation/scores_before.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

REFERENCE_D = {1, 4, 12}  # sweeps/h200-validation.yaml: the reference points are D in {1, 4, 12}
KEY = ["chunk_size", "decode_batch_size", "new_prefill_tokens"]


def measured(directory: str | None) -> dict[tuple[int, int, int], float]:
    if not directory:
        return {}
    path = Path(directory) / "interference_table.csv"
    if not path.exists():
        return {}
    df = pd.read_csv(path)
    df = df[df["aggregate_interference_ms"].notna()]
    return {(int(r.chunk_size), int(r.decode_batch_size), int(r.new_prefill_tokens)): float(r.aggregate_interference_ms)
            for r in df.itertuples()}


def summary(rows: list[dict]) -> dict:
    done = [r for r in rows if r["measured_ms"] is not None]
    if not done:
        return {"points": len(rows), "measured": 0, "mape_pct": None, "median_ape_pct": None, "max_ape_pct": None,
                "mape_pct_without_worst": None, "mean_signed_error_pct": None,
                "inside_interval_90": None, "inside_share": None,
                "below_interval": 0, "above_interval": 0}
    apes = sorted(r["ape_pct"] for r in done)
    n = len(apes)
    median = apes[n // 2] if n % 2 else (apes[n // 2 - 1] + apes[n // 2]) / 2
    inside = sum(r["inside"] for r in done)
    return {
        "points": len(rows), "measured": n,
        "mape_pct": round(sum(apes) / n, 2), "median_ape_pct": round(median, 2),
        "max_ape_pct": round(apes[-1], 2),
        "mape_pct_without_worst": round(sum(apes[:-1]) / (n - 1), 2) if n > 1 else None,
        "mean_signed_error_pct": round(sum(r["signed_pct"] for r in done) / n, 2),
        "inside_interval_90": inside, "inside_share": round(inside / n, 3),
        "below_interval": sum(r["measured_ms"] < r["interval_90"][0] for r in done),
        "above_interval": sum(r["measured_ms"] > r["interval_90"][1] for r in done),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--predictions", default="results/h200-vllm0.22-qwen3-coder-30b-a3b-validation/predictions.json")
    ap.add_argument("--colocated", default="results/h200-vllm0.22-qwen3-coder-30b-a3b-validation")
    ap.add_argument("--offloaded", default="results/h200-vllm0.22-qwen3-coder-30b-a3b-decodebench-validation")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    pred = json.loads(Path(args.predictions).read_text())
    arms = {"colocated": measured(args.colocated), "offloaded": measured(args.offloaded)}
    out: dict = {"predictions": args.predictions, "model": pred.get("model"),
                 "measured_from": {"colocated": f"{args.colocated}/interference_table.csv",
                                   "offloaded": f"{args.offloaded}/interference_table.csv"},
                 "quantity": "aggregate_interference_ms", "arms": {}, "points": []}
    per_arm: dict[str, list[dict]] = {a: [] for a in arms}
    for p in pred["points"]:
        key = tuple(int(p[k]) for k in KEY)
        group = "reference" if key[1] in REFERENCE_D else "validation"
        row = {"chunk_size": key[0], "decode_batch_size": key[1], "new_prefill_tokens": key[2], "group": group}
        for arm, table in arms.items():
            if f"{arm}_aggregate_interference_ms" not in p:
                continue  # a one-arm model predicted the colocated arm alone
            predicted = float(p[f"{arm}_aggregate_interference_ms"])
            lo, hi = (float(x) for x in p[f"{arm}_interval_90"])
            m = table.get(key)
            r = {"arm": arm, "group": group, "predicted_ms": predicted, "interval_90": [lo, hi], "measured_ms": m}
            if m is not None and not math.isnan(m) and m != 0:
                r["ape_pct"] = abs(predicted - m) / abs(m) * 100
                r["signed_pct"] = (predicted - m) / abs(m) * 100
                r["inside"] = lo <= m <= hi
            else:
                r["measured_ms"] = None
            per_arm[arm].append(r)
            row[f"{arm}_predicted_ms"] = predicted
            row[f"{arm}_interval_90"] = [lo, hi]
            row[f"{arm}_measured_ms"] = None if r["measured_ms"] is None else round(r["measured_ms"], 3)
            row[f"{arm}_ape_pct"] = round(r["ape_pct"], 2) if "ape_pct" in r else None
            row[f"{arm}_inside_90"] = r.get("inside")
        out["points"].append(row)
    for arm, rows in per_arm.items():
        if not rows:
            continue
        out["arms"][arm] = {
            "all": summary(rows),
            "validation": summary([r for r in rows if r["group"] == "validation"]),
            "reference": summary([r for r in rows if r["group"] == "reference"]),
        }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for arm, s in out["arms"].items():
        for g, v in s.items():
            print(f"{arm:9s} {g:10s} measured {v['measured']}/{v['points']}  MAPE {v['mape_pct']} %  "
                  f"(median {v['median_ape_pct']} %, without the worst {v['mape_pct_without_worst']} %)  "
                  f"inside 90 % {v['inside_interval_90']} ({v['inside_share']})")


if __name__ == "__main__":
    main()
