"""Benchmark: the bootstrap replicates of every held-out point `pdexporter validate` predicts, one by one against as
arrays (`replicate_costs(stack=numpy.asarray)`, what `analysis.campaigns` uses), on a committed two-arm decision
document and the (B, D, P) points of the committed `results/h200-held-out/held_out.csv`, each arm.

    python tests/benchmarks/bench_held_out.py [--doc results/h200x2-arms/decision.json] [--points 0]
    python tests/benchmarks/bench_held_out.py --quick   # 40 points (CI)

Prints per path the wall and CPU seconds (best of `--repeat`) and whether both gave the same replicates (they must:
the same arithmetic, element by element). Target: the arrays under 1.5 s for the committed points (0.04 s against 0.78
s one by one on the 2-core development machine, session 41; `validate` repeats this for its five fits' documents).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from quickmode import best_of, parse_args  # noqa: E402

from pdexporter.analysis.decision_eval import chunk_context, replicate_costs  # noqa: E402
from pdexporter.analysis.thresholds import array_stack  # noqa: E402

TARGET_S = 1.5
KEYS = {"colocated": "colocated_cost_ms", "offloaded": "offloaded_cost_ms"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--doc", type=Path, default=ROOT / "results" / "h200x2-arms" / "decision.json")
    parser.add_argument("--held-out", type=Path, default=ROOT / "results" / "h200-held-out" / "held_out.csv")
    parser.add_argument("--points", type=int, default=0, help="the first N points (0: all)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parse_args(parser, points=40, repeat=1)
    doc = json.loads(args.doc.read_text())
    with args.held_out.open() as f:
        rows = [r for r in csv.DictReader(f) if r["arm"] in KEYS and (r["arm"] == "colocated" or doc.get("two_arm"))]
    points = sorted({(int(r["chunk_size"]), int(r["decode_batch_size"]), int(r["new_prefill_tokens"]), r["arm"])
                     for r in rows})
    points = points[:args.points] if args.points else points
    work = {key: [(d, p, b, (chunk_context(doc, d, p, b), chunk_context(doc, 0, p, b)))
                  for b, d, p, arm in points if KEYS[arm] == key] for key in KEYS.values()}
    count = sum(len(v) for v in work.values())
    n_reps = len(doc["replicates"]["model"])
    print(f"{args.doc.relative_to(ROOT) if args.doc.is_relative_to(ROOT) else args.doc}: {count} held-out "
          f"points x {n_reps} replicates")
    stack = array_stack()
    results = {}
    for name, how in (("one by one", None), ("as arrays", stack)):
        if name == "as arrays" and how is None:
            print("numpy without the Python array API (< 2.0): one by one only")
            continue
        best_wall, best_cpu, results[name] = best_of(
            args.repeat, lambda how=how: [replicate_costs(doc, key, these, stack=how) for key, these in work.items()])
        print(f"  {name:>10}: {best_wall:.2f} s wall, {best_cpu:.2f} s CPU (best of {args.repeat}), "
              f"{best_wall / count * 1e3:.2f} ms a point")
    same = len({json.dumps(v) for v in results.values()}) == 1
    print(f"  the same replicates both ways: {'yes' if same else 'NO'}")
    if len(results) == 2 and not args.quick:
        print(f"  target < {TARGET_S:.1f} s for the arrays: {'met' if best_wall < TARGET_S else 'missed'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
