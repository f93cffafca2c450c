"""Benchmark: projections from config.json scored on a model NOT used to build them (leave one model out).

    python tests/benchmarks/bench_projection.py            # every measured model, every measured configuration
    python tests/benchmarks/bench_projection.py --jobs 1 --markdown FILE   # also write the table (below)
    python tests/benchmarks/bench_projection.py --quick    # D 1 and 4, P 2048 and 8192 at B = 8192, 3072 and 6144 (CI)

Each measured model (`pdexporter.predict.projection.MEASURED`: the MoE Qwen3-Coder-30B-A3B, the dense
Llama-3.1-8B, Qwen2.5-32B and Qwen3-14B, all on one H200 with vLLM 0.22) is projected from its config.json
with the calibrated profiles of the OTHER THREE only, with the rule before issue 36 ("carry": the first
reference's efficiencies, layer costs x layers) and the learned one (`pdexporter.sim.projection`),
the protocol run with each on the embedded engine for the model's measured configurations, and the
prediction scored per quantity: MAPE, median signed error. The row "own" scores the model's own
calibrated profile on the same configurations: not a projection, the yardstick, not a bound (the
Llama's projection within 3.5 points of its calibration; the MoE profile's own error over its 196
configurations is not under 10 % either). The last column is the penalty's MAPE over the prompts of two or more
chunks (P + D > B): a one-chunk prompt's measured penalty moves with the host's launch level
(results/h200-vllm0.22-qwen2.5-32b-instruct/RUN.md). The goal (issue 36): within
10 % per quantity. 26 s on 2 cores with --jobs 2; the figures, the reasons for the misses and the
rule changes tried: docs/sim.md, "Its error on a model not used to build it" (the four-model table:
results/h200-vllm0.22-qwen3-14b/projection-lomo.md, the three-model one before the 14B's calibration:
results/h200-vllm0.22-qwen2.5-32b-instruct/projection-lomo.md, the two-model one before the 32B's:
results/h200-vllm0.22-llama-3.1-8b-instruct/projection-lomo.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pdexporter.predict.projection import ProjectionScore, leave_one_model_out

QUANTITIES = ("baseline_tpot", "penalty", "penalty_p50", "prefill_duration", "aggregate_interference")
QUICK_KEYS = {(b, d, p) for b in (8192, 3072, 6144) for d in (1, 4) for p in (2048, 8192)}


def _fmt(x: float | None, sign: bool = False) -> str:
    return "-" if x is None else (f"{x:+.1f} %" if sign else f"{x:.1f} %")


def table(scores: list[ProjectionScore]) -> str:
    head = "| target | rule | references | n | " + " | ".join(QUANTITIES) + " | penalty, P + D > B |"
    lines = [head, "|" + "---|" * (5 + len(QUANTITIES))]
    for s in scores:
        if not s.n:
            lines.append(f"| {s.target} | - | - | 0 | {s.note} |" + " |" * len(QUANTITIES))
            continue
        cells = [f"{_fmt(s.mape[q])} ({_fmt(s.median_signed[q], sign=True)})" for q in QUANTITIES]
        cells.append(_fmt(s.multi_chunk.get("penalty")))
        lines.append(f"| {s.target} | {s.rule} | {', '.join(s.references)} | {s.n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keys", choices=("all", "quick"), default="all")
    ap.add_argument("--markdown", type=Path, help="also write the table here")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quickmode import parse_args

    args = parse_args(ap, jobs=1, keys="quick")
    t0 = time.perf_counter()
    scores = leave_one_model_out(keys=QUICK_KEYS if args.keys == "quick" else None, jobs=args.jobs)
    text = table(scores)
    print("MAPE (median signed error) per quantity; projected from config.json with the other models' calibrated "
          "profiles only ('own': the model's own calibrated profile, the yardstick)")
    print(text)
    for s in scores:
        if s.n and s.rule != "own":
            worst = max((s.mape[q] or 0.0) for q in QUANTITIES)
            print(f"{s.target} ({s.rule}): worst quantity {worst:.1f} % -> the 10 % goal "
                  + ("not judged (--quick)" if args.quick else "met" if worst <= 10 else "NOT met"))
    print(f"wall {time.perf_counter() - t0:.1f} s")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
