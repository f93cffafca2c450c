"""Benchmark: the router thresholds of a committed two-arm decision document, every (B, D) with its bootstrap
replicates, the replicates judged one by one against judged as arrays (`offload_thresholds(stack=numpy.asarray)`,
what `compute_thresholds` uses: `pdexporter thresholds`, the report, export-table's two-arm documents, the live
exporter's thresholds).

    python tests/benchmarks/bench_thresholds.py [--doc results/h200-arms-decodebench/decision.json] [--replicates 101]
    python tests/benchmarks/bench_thresholds.py --quick   # one chunk size, 10 replicates (CI)

Prints per path the wall and CPU seconds (best of `--repeat`), the calls, and whether both gave the same thresholds
(they must: the same arithmetic, element by element). Target: the array path under 1.5 s for the committed
two-arm document's 48 (B, D) x 101 replicates (one by one: ~6 s on the 2-core development machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from quickmode import best_of, parse_args  # noqa: E402

from pdexporter.analysis.decision_eval import offload_thresholds  # noqa: E402
from pdexporter.analysis.thresholds import array_stack, compute_thresholds  # noqa: E402

TARGET_S = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--doc", type=Path, default=ROOT / "results" / "h200-arms-decodebench" / "decision.json")
    parser.add_argument("--replicates", type=int, default=101)
    parser.add_argument("--chunk-sizes", type=int, nargs="*", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parse_args(parser, replicates=10, chunk_sizes=[8192], repeat=1)
    doc = json.loads(args.doc.read_text())
    stack = array_stack()
    if stack is None:
        print("numpy without the Python array API (< 2.0): the replicates are judged one by one only")
    shape = compute_thresholds(doc, replicates=0, chunk_sizes=args.chunk_sizes)
    cells = [(t.chunk_size, t.decode_batch_size) for t in shape.records]
    n_reps = min(args.replicates, len(doc["replicates"]["model"]))
    reps = (None, *range(n_reps))
    print(f"{args.doc.relative_to(ROOT) if args.doc.is_relative_to(ROOT) else args.doc}: {len(cells)} (B, D) x "
          f"{n_reps} replicates, mode {shape.mode}")
    results = {}
    for name, how in (("one by one", None), ("as arrays", stack)):
        if name == "as arrays" and how is None:
            continue
        best_wall, best_cpu, results[name] = best_of(
            args.repeat, lambda how=how: [offload_thresholds(doc, d, b, reps, stack=how) for b, d in cells])
        print(f"  {name:>10}: {best_wall:.2f} s wall, {best_cpu:.2f} s CPU (best of {args.repeat}), "
              f"{best_wall / len(cells) * 1e3:.1f} ms a (B, D)")
    same = len({json.dumps(v) for v in results.values()}) == 1
    print(f"  the same thresholds both ways: {'yes' if same else 'NO'}")
    if len(results) == 2 and not args.quick:
        verdict = "met" if best_wall < TARGET_S else "missed"
        print(f"  target < {TARGET_S:.1f} s for the arrays: {verdict}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
