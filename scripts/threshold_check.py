"""The threshold checked on a real pair (issue 21): predict before the run, measure, score after.

    python scripts/threshold_check.py predict DECISION_JSON --out DIR [-B 8192] [-D 4 -D 12]
        The predicted threshold P* (with its 90 % interval) for each D, and the check points
        P*/2, P* and 2 P* with the predicted saving and TTFT cost of offloading there (and their
        intervals): DIR/prediction.json. Commit it before the pair runs.
    python scripts/threshold_check.py sweep DIR/prediction.json --pair-sweep sweeps/h200x2-pd.yaml \\
            --colocated-sweep sweeps/h200.yaml
        Writes DIR/pair.yaml and DIR/colocated.yaml: the two sweep files at exactly the check points
        (grid.only), the pair's launcher and the colocated engine as in the given files.
    python scripts/threshold_check.py score DIR/prediction.json --pair PAIR_RESULTS --colocated COLOCATED_RESULTS
        The measured saving and TTFT cost at each check point, the arm that won by the measured
        saving, whether the verdict was right on both sides of P*, and the predicted saving's error
        (goal: within 15 %): DIR/threshold_check.json.

The measured saving at a point is the colocated arm's aggregate interference minus the pair's,
its TTFT cost the pair's routed TTFT minus the colocated TTFT (docs/disaggregation.md)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdexporter._internal.atomic import atomic_write_json, atomic_write_text  # noqa: E402
from pdexporter.analysis.decision_eval import evaluate_decision  # noqa: E402
from pdexporter.analysis.thresholds import compute_thresholds  # noqa: E402

GOAL_PCT = 15.0


def _round_p(p: float, step: int = 64) -> int:
    return max(step, int(round(p / step)) * step)


def predict(args: argparse.Namespace) -> None:
    doc = json.loads(Path(args.decision).read_text())
    result = compute_thresholds(doc, chunk_sizes=[args.chunk_size], decode_batch_sizes=args.decode_batch_size,
                                replicates=args.replicates, p_max=args.p_max)
    per = result.to_dict()["chunk_sizes"][str(args.chunk_size)]["by_decode_batch_size"]
    out: dict[str, Any] = {"decision": str(args.decision), "chunk_size": args.chunk_size,
                           "goal": f"verdict right on both sides of P*, predicted saving within {GOAL_PCT:g} %",
                           "predictions": []}
    for d in args.decode_batch_size:
        entry = per[str(d)]
        p_star = entry["threshold"]
        points = []
        if p_star is not None:
            for label, p in (("P*/2", _round_p(p_star / 2)), ("P*", p_star), ("2 P*", _round_p(2 * p_star))):
                v = evaluate_decision(doc, d, p, args.chunk_size)
                points.append(
                    {
                        "at": label,
                        "new_prefill_tokens": p,
                        "offload": v["offload"],
                        "decided": v["decided"],
                        "saved_ms": v["saved_ms"],
                        "saved_ms_interval": v["intervals"]["saved_ms"],
                        "ttft_cost_ms": v["ttft_cost_ms"],
                        "ttft_cost_ms_interval": v["intervals"]["ttft_cost_ms"],
                        "extrapolated": v["extrapolated"],
                    }
                )
        out["predictions"].append({"decode_batch_size": d, "threshold": p_star, "interval": entry["interval"],
                                   "status": entry["status"], "points": points})
    target = Path(args.out)
    atomic_write_json(target / "prediction.json", out)
    for pred in out["predictions"]:
        print(f"D={pred['decode_batch_size']}: P* = {pred['threshold']} (90 %: {pred['interval']}, {pred['status']})")
        for pt in pred["points"]:
            print(f"  {pt['at']:>5} P={pt['new_prefill_tokens']:>6}: {'offload' if pt['offload'] else 'keep local'}, "
                  f"saved {pt['saved_ms']:.1f} ms, TTFT cost {pt['ttft_cost_ms']:.1f} ms")
    print(target / "prediction.json")


def sweep(args: argparse.Namespace) -> None:
    prediction = json.loads(Path(args.prediction).read_text())
    b = prediction["chunk_size"]
    points = sorted({(b, pred["decode_batch_size"], pt["new_prefill_tokens"])
                     for pred in prediction["predictions"] for pt in pred["points"]})
    if not points:
        raise SystemExit(f"{args.prediction}: no check point (no threshold predicted)")
    target = Path(args.prediction).parent
    for name, source in (("pair", args.pair_sweep), ("colocated", args.colocated_sweep)):
        spec = yaml.safe_load(Path(source).read_text())
        spec["name"] = f"threshold-check-{name}"
        spec["grid"] = {"chunk_sizes": [b], "decode_batch_sizes": sorted({d for _, d, _ in points}),
                        "new_prefill_tokens": sorted({p for _, _, p in points}), "only": [list(k) for k in points]}
        spec["output"] = str(target / name)
        atomic_write_text(target / f"{name}.yaml", f"# made by scripts/threshold_check.py sweep from {source}\n"
                          + yaml.safe_dump(spec, sort_keys=False))
        print(target / f"{name}.yaml")


def _table(path: str) -> dict[tuple[int, int, int], dict[str, Any]]:
    from pdexporter.analysis.job import load_results
    from pdexporter.analysis.table import build_table

    table = build_table(load_results(path))
    return {(int(r.chunk_size), int(r.decode_batch_size), int(r.new_prefill_tokens)): r._asdict()
            for r in table.itertuples()}


def score(args: argparse.Namespace) -> None:
    prediction = json.loads(Path(args.prediction).read_text())
    pair, col = _table(args.pair), _table(args.colocated)
    b = prediction["chunk_size"]
    results, right, within = [], 0, 0
    compared = 0
    for pred in prediction["predictions"]:
        d = pred["decode_batch_size"]
        for pt in pred["points"]:
            key = (b, d, pt["new_prefill_tokens"])
            if key not in pair or key not in col:
                results.append({**pt, "decode_batch_size": d, "measured": None})
                continue
            saved = col[key]["aggregate_interference_ms"] - pair[key]["aggregate_interference_ms"]
            cost = pair[key]["offload_ttft_ms"] - col[key]["prefill_duration_ms"]
            offload = saved > cost
            error = None if saved == 0 or not math.isfinite(saved) else 100.0 * (pt["saved_ms"] - saved) / abs(saved)
            compared += 1
            right += offload == pt["offload"]
            within += error is not None and abs(error) <= GOAL_PCT
            results.append({**pt, "decode_batch_size": d, "measured": {
                "saved_ms": saved, "ttft_cost_ms": cost, "offload": offload, "verdict_right": offload == pt["offload"],
                "saved_error_pct": None if error is None else round(error, 2)}})
    summary = {"points": len(results), "compared": compared, "verdict_right": right,
               "saving_within_goal": within, "goal_pct": GOAL_PCT,
               "passed": compared == len(results) and right == compared and within == compared}
    target = Path(args.prediction).parent
    atomic_write_json(target / "threshold_check.json", {"summary": summary, "points": results,
                                                        "prediction": args.prediction, "pair": args.pair,
                                                        "colocated": args.colocated})
    print(json.dumps(summary))
    print(target / "threshold_check.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("predict")
    p.add_argument("decision")
    p.add_argument("--out", required=True)
    p.add_argument("-B", "--chunk-size", type=int, default=8192)
    p.add_argument("-D", "--decode-batch-size", type=int, action="append")
    p.add_argument("--replicates", type=int, default=200)
    p.add_argument("--p-max", type=int, default=131072)
    s = sub.add_parser("sweep")
    s.add_argument("prediction")
    s.add_argument("--pair-sweep", default=str(ROOT / "sweeps" / "h200x2-pd.yaml"))
    s.add_argument("--colocated-sweep", default=str(ROOT / "sweeps" / "h200.yaml"))
    c = sub.add_parser("score")
    c.add_argument("prediction")
    c.add_argument("--pair", required=True)
    c.add_argument("--colocated", required=True)
    args = parser.parse_args()
    if args.verb == "predict" and not args.decode_batch_size:
        args.decode_batch_size = [4, 12]
    {"predict": predict, "sweep": sweep, "score": score}[args.verb](args)


if __name__ == "__main__":
    main()
