"""How the embedded engine's predictions, with the campaign variation its profile carries, hold on
GPU campaigns (issue 30 item 2): every colocated point of `results/h200-held-out/held_out.csv`
predicted by the shipped H200 profile (fast mode, one repetition, virtual time), its error against
the measured aggregate interference, and the share of measurements inside the 90 % band the carried
variation gives the prediction (x exp(+-1.645 s), s by the point's regime): with the profile's s (every
campaign's, what `export-table` carries) and nested (s from the other campaigns only, as `validate`
scores the cost model). The campaign the profile was calibrated on (s1-h200) is left out.

    python scripts/sim_coverage.py [--held-out results/h200-held-out/held_out.csv] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from pdexporter.analysis.campaigns import HeldOutPoint, inside_log_band, variation_from
from pdexporter.analysis.table import build_table, samples_from_record
from pdexporter.predict.grid import predict_records
from pdexporter.sim.profile import load_profile

PROFILE = "h200-qwen3-coder-30b-a3b"


def rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


def nested_s(rows: list[dict[str, str]], exclude: str) -> dict[str, float]:
    """The colocated log sd by regime from every campaign but `exclude`, by validate's own rule
    (`campaigns.variation_from`: a regime with fewer than MIN_REGIME_POINTS points takes the pooled s)."""
    points = [HeldOutPoint(r["campaign"], r["role"], r["arm"], int(r["chunk_size"]), int(r["decode_batch_size"]),
                           int(r["new_prefill_tokens"]), r["regime"], float(r["measured_ms"]), float(r["predicted_ms"]),
                           ()) for r in rows]
    arm = variation_from(points, exclude=exclude).get("colocated") or {}
    return {regime: float(s) for regime, s in (arm.get("by_regime") or {}).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held-out", type=Path, default=Path("results/h200-held-out/held_out.csv"))
    parser.add_argument("--out", type=Path, default=None, help="write sim_coverage.csv and .md there")
    args = parser.parse_args(argv)
    profile = load_profile(PROFILE)
    carried = profile.campaign_variation
    assert carried is not None and carried.colocated is not None
    with args.held_out.open() as f:
        rows = [r for r in csv.DictReader(f) if r["arm"] == "colocated"]
    fit_campaign = "s1-h200"  # the records the profile was calibrated on (its calibration_source)
    scored = [r for r in rows if r["campaign"] != fit_campaign]
    keys = sorted({(int(r["chunk_size"]), int(r["decode_batch_size"]), int(r["new_prefill_tokens"])) for r in scored})
    t0 = time.perf_counter()
    records = predict_records(profile, keys, mode="fast")
    table = build_table([samples_from_record(rec) for rec in records.values()])
    predicted = {(int(b), int(d), int(p)): float(v) for b, d, p, v in
                 zip(table["chunk_size"], table["decode_batch_size"], table["new_prefill_tokens"],
                     table["aggregate_interference_ms"]) if v == v}
    took = time.perf_counter() - t0
    by_campaign: dict[str, list[tuple[float, bool, bool, str]]] = defaultdict(list)
    lines = []
    nested = {c: nested_s(rows, c) for c in {r["campaign"] for r in scored}}
    for r in scored:
        key = (int(r["chunk_size"]), int(r["decode_batch_size"]), int(r["new_prefill_tokens"]))
        if key not in predicted:
            continue
        measured, pred, regime = float(r["measured_ms"]), predicted[key], r["regime"]
        s_all = carried.colocated.by_regime.get(regime, carried.colocated.log_sd)
        s_nested = nested[r["campaign"]].get(regime, rms(list(nested[r["campaign"]].values())))
        err = abs(pred / measured - 1) * 100
        inside_all, inside_nested = inside_log_band(measured, pred, s_all), inside_log_band(measured, pred, s_nested)
        by_campaign[r["campaign"]].append((err, inside_all, inside_nested, regime))
        lines.append([r["campaign"], *key, regime, measured, round(pred, 3), round(err, 2),
                      inside_all, inside_nested, abs(float(r["error_pct"]))])
    header = ["campaign", "points", "sim MAPE %", "median %", "launch MAPE %", "compute MAPE %", "graph MAPE %",
              "inside (profile's s)", "inside (nested s)", "cost model MAPE %"]
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    every: list[tuple[float, bool, bool, str]] = []
    for cid in sorted(by_campaign, key=lambda c: (len(c.split("-")[0]), c)):
        pts = by_campaign[cid]
        every += pts
        cm = [row[-1] for row in lines if row[0] == cid]

        def mape(regime: str, pts: list[tuple[float, bool, bool, str]] = pts) -> str:
            errs = [e for e, _, _, g in pts if g == regime]
            return f"{statistics.fmean(errs):.1f}" if errs else "–"

        md.append(f"| {cid} | {len(pts)} | {statistics.fmean(e for e, *_ in pts):.1f} | "
                  f"{statistics.median(e for e, *_ in pts):.1f} | {mape('launch')} | {mape('compute')} | "
                  f"{mape('graph')} | "
                  f"{sum(a for _, a, _, _ in pts) / len(pts):.0%} | {sum(b for _, _, b, _ in pts) / len(pts):.0%} | "
                  f"{statistics.fmean(cm):.1f} |")
    md.append(f"| all | {len(every)} | {statistics.fmean(e for e, *_ in every):.1f} | "
              f"{statistics.median(e for e, *_ in every):.1f} | | | | "
              f"{sum(a for _, a, _, _ in every) / len(every):.0%} | "
              f"{sum(b for _, _, b, _ in every) / len(every):.0%} | {statistics.fmean(row[-1] for row in lines):.1f} |")
    md.append("")
    md.append(f"{len(keys)} configurations predicted by {PROFILE} (fast mode, 1 repetition, virtual time); "
              f"{fit_campaign}, its calibration campaign, left out. The cost model's column: `validate`'s "
              "held-out error of the same points (leave one campaign out).")
    print(f"predicted in {took:.1f} s", file=sys.stderr)
    print("\n".join(md))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sim_coverage.md").write_text("\n".join(md) + "\n")
        with (args.out / "sim_coverage.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["campaign", "chunk_size", "decode_batch_size", "new_prefill_tokens", "regime", "measured_ms",
                        "sim_predicted_ms", "sim_error_pct", "inside_profile_s", "inside_nested_s",
                        "cost_model_error_pct"])
            w.writerows(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
