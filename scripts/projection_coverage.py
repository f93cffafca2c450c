"""How a projection's numbers hold with what moves between campaigns carried into them (issue 30 item 2,
issue 36): a comparison of a projection against a GPU run it never saw (`comparison-*.csv`, written by
`scripts/gpu/dense_report.py compare`), each configuration's aggregate interference given the 90 % band
the campaign variation of the H200 campaigns gives it (x exp(+-1.645 s), s by the point's regime as
`validate` scores the cost model: `analysis.decision_eval.cost_regime` under the model of `--regimes`), and
the share of measurements inside it, by regime. A projected profile inherits no campaign variation of its
own (`sim.profile.CampaignVariation`); this says whether the H200 campaigns' would cover it.

    python scripts/projection_coverage.py COMPARISON.csv --regimes DECISION.json [--variation held_out.json]
        [--out FILE.md]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdexporter.analysis.campaigns import inside_log_band, load_variation  # noqa: E402
from pdexporter.analysis.decision_eval import campaign_log_sd, chunk_context, cost_regime  # noqa: E402
from pdexporter.errors import RecordError  # noqa: E402

QUANTITY = "aggregate_interference"


def coverage(comparison: Path, regimes: Path, variation: Path) -> str:
    try:
        doc = json.loads(regimes.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{regimes}: not readable as a decision.json ({exc.__class__.__name__})") from None
    try:
        var, _ = load_variation(variation)
    except RecordError as exc:
        raise SystemExit(str(exc)) from None
    if not comparison.is_file():
        raise SystemExit(f"{comparison}: no such comparison (scripts/gpu/dense_report.py compare writes it)")
    by: dict[str, list[tuple[float, bool]]] = {}
    with comparison.open() as f:
        for row in csv.DictReader(f):
            measured, projected = row[f"{QUANTITY} measured"], row[f"{QUANTITY} projected"]
            if not measured or not projected or float(measured) <= 0 or float(projected) <= 0:
                continue
            b, d, p = int(row["B"]), int(row["D"]), int(row["P"])
            regime = cost_regime(doc, chunk_context(doc, d, p, b))
            s = campaign_log_sd(var, "colocated", regime)
            by.setdefault(regime, []).append((abs(float(projected) / float(measured) - 1) * 100,
                                              inside_log_band(float(measured), float(projected), s)))
    every = [x for xs in by.values() for x in xs]
    if not every:
        raise SystemExit(f"{comparison}: no configuration with a measured and a projected {QUANTITY}")
    lines = [f"{comparison.name} ({QUANTITY}; regimes by the model of {regimes}, the variation of {variation})", "",
             "| regime | points | s carried (log) | MAPE | median abs. error | inside the 90 % band |",
             "|---|---|---|---|---|---|"]
    for regime in sorted(by) + ["all"]:
        xs = every if regime == "all" else by[regime]
        s = "" if regime == "all" else f"{campaign_log_sd(var, 'colocated', regime):.2f}"
        inside = sum(ok for _, ok in xs)
        mape, median = statistics.fmean(e for e, _ in xs), statistics.median(e for e, _ in xs)
        lines.append(f"| {regime} | {len(xs)} | {s} | {mape:.1f} % | {median:.1f} % | "
                     f"{inside}/{len(xs)} ({100 * inside / len(xs):.0f} %) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("comparison", type=Path, nargs="+")
    ap.add_argument("--regimes", type=Path, required=True, help="a decision.json whose context-aware model sorts "
                    "the points into regimes (the H200 run of the same model)")
    ap.add_argument("--variation", type=Path, default=Path("results/h200-held-out/held_out.json"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    text = "\n".join(coverage(c, args.regimes, args.variation) for c in args.comparison)
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
