"""Benchmark: projections from config.json scored on a model NOT used to build them (leave one model out).

    python tests/benchmarks/bench_projection.py            # every measured model, every measured configuration
    python tests/benchmarks/bench_projection.py --markdown results/projection.md
    python tests/benchmarks/bench_projection.py --quick    # B = 8192, D 1 and 4, P 2048 and 8192 (CI)

Each measured model (`pdexporter.predict.projection.MEASURED`: the MoE Qwen3-Coder-30B-A3B, the dense
Llama-3.1-8B once its H200 run is committed) is projected from its config.json with the calibrated
profiles of the other measured models only, with the rule before issue 36 ("carry": the first
reference's efficiencies, layer costs x layers) and the learned one (`pdexporter.sim.projection`),
the protocol run with each on the embedded engine for the model's measured configurations, and the
prediction scored per quantity: MAPE, median signed error, range. The goal (issue 36): within 10 %
per quantity. A model with no other calibrated model to learn from is named, not scored; with
`--quick` and no such pair, the MoE model is scored from its own profile, marked in-sample, so that
the code path runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pdexporter.predict.projection import MEASURED, ProjectionScore, leave_one_model_out, project, score, signed

QUANTITIES = ("baseline_tpot", "penalty", "penalty_p50", "prefill_duration", "aggregate_interference")
QUICK_KEYS = {(8192, d, p) for d in (1, 4) for p in (2048, 8192)}


def _fmt(x: float | None, sign: bool = False) -> str:
    return "-" if x is None else (f"{x:+.1f} %" if sign else f"{x:.1f} %")


def table(scores: list[ProjectionScore]) -> str:
    head = "| target | rule | references | n | " + " | ".join(QUANTITIES) + " |"
    lines = [head, "|" + "---|" * (4 + len(QUANTITIES))]
    for s in scores:
        if not s.n:
            lines.append(f"| {s.target} | - | - | 0 | {s.note} |" + " |" * (len(QUANTITIES) - 1))
            continue
        cells = [f"{_fmt(s.mape[q])} ({_fmt(s.median_signed[q], sign=True)})" for q in QUANTITIES]
        lines.append(f"| {s.target} | {s.rule} | {', '.join(s.references)} | {s.n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def in_sample_quick() -> list[ProjectionScore]:
    """The MoE model from its own calibrated profile on the quick keys (no pair of measured models yet)."""
    model = MEASURED[0]
    ref = model.reference()
    assert ref is not None
    profiles = [project(model, [ref], rule) for rule in ("carry", "learned")]
    out = []
    for rule, report in zip(("carry", "learned"), score(profiles, model.records(), keys=QUICK_KEYS)):
        stats = {q: signed(report, q) for q in QUANTITIES}
        out.append(ProjectionScore(model.name, rule + " (in-sample)", (ref.name,), len(QUICK_KEYS),
                                   {q: report.metric_mape(q) for q in QUANTITIES},
                                   {q: v[0] for q, v in stats.items()}, {q: (v[1], v[2]) for q, v in stats.items()}))
    return out


# issue 36: the old rule's signed errors on a dense 32B model (Qwen2.5-32B shapes, vLLM 0.22, H200, B = 3072), a
# run the project never committed: (lowest, highest) per quantity
ISSUE36_32B = {"baseline_p50_ms": (0.13, 0.13), "penalty_mean_ms": (-0.35, -0.16),
               "prefill_duration_ms": (-0.15, -0.11), "aggregate_interference_ms": (-0.18, -0.14)}


def third_model_estimate(references: list[str] | None = None) -> list[str]:
    """The 32B model of issue 36 projected with the old and the learned rule (from the shipped calibrated
    profiles): the learned rule's error estimated from the old rule's reported one, per quantity, as
    (1 + old error) x learned / old projection - 1 (medians over D 1-12, P 2K-32K at B = 3072: an
    estimate, the run's own configurations are not committed)."""
    import statistics

    from pdexporter.predict.calibrate import PointFigures
    from pdexporter.predict.grid import predict_records
    from pdexporter.sim.modelconfig import load_config, profile_from_config
    from pdexporter.sim.modelconfig import references as default_refs

    cfg, source = load_config("qwen2.5-32b-instruct")
    refs = default_refs(references)
    keys = [(3072, d, p) for d in (1, 4, 8, 12) for p in (2048, 8192, 16384, 32768)]
    out = {}
    for rule in ("carry", "learned"):
        prof = profile_from_config(cfg, "H200", source=source, carry_from=refs, rule=rule, max_model_len=40960,
                                   max_num_batched_tokens=3072, dummy_weights=True)
        out[rule] = {k: PointFigures.of(r) for k, r in predict_records(prof, keys, mode="fast").items()}
    lines = [f"Qwen2.5-32B (issue 36's run, not committed), learned rule from {', '.join(p.name for p in refs)}:"]
    for field, (lo, hi) in ISSUE36_32B.items():
        ratios = [getattr(out["learned"][k], field) / getattr(out["carry"][k], field) for k in keys
                  if getattr(out["carry"][k], field)]
        r = statistics.median(ratios)
        lines.append(f"  {field:26s} old rule {lo:+.0%}..{hi:+.0%} (reported) -> learned about "
                     f"{(1 + lo) * r - 1:+.0%}..{(1 + hi) * r - 1:+.0%} (learned / old {r:.3f})")
    return lines


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
    if args.quick and not any(s.n for s in scores):
        scores += in_sample_quick()
    text = table(scores)
    print("MAPE (median signed error) per quantity; projected from config.json with the other models' calibrated "
          "profiles only")
    print(text)
    for s in scores:
        if s.n:
            worst = max((s.mape[q] or 0.0) for q in QUANTITIES)
            print(f"{s.target} ({s.rule}): worst quantity {worst:.1f} % -> the 10 % goal "
                  + ("not judged (--quick)" if args.quick else "met" if worst <= 10 else "NOT met"))
    if not args.quick:
        print("\n".join(third_model_estimate()))
    print(f"wall {time.perf_counter() - t0:.1f} s")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
