"""Can a campaign's own reference points calibrate its other points? (issue 30, docs/analysis.md)

Reads the held-out points of `results/h200-held-out/held_out.csv` (leave one campaign out, the
colocated arm) and, per campaign, takes the reference cells (B = 8192, D 1/4/12, P 64-16384: what
every GPU campaign re-measures first) as an anchor:

- `scale`: every other point's prediction times exp(mean log error of the anchor cells of its regime),
  the arm's pooled mean where its regime has fewer than two anchor cells;
- `shift`: every other launch-bound point's prediction plus the anchor's median launch-bound error in ms;
- shrunk: per regime, the scale's log factor times a weight w in 0..1 (partial pooling toward the
  model), the mean over campaigns of the MAPE of that regime's non-anchor points for each w.

It prints the MAPE of the points that are not anchors, as predicted (`none`) and anchored.
Pure arithmetic on the committed file; no model is refitted.

    python scripts/anchor_check.py [results/h200-held-out/held_out.csv]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ANCHOR_B = 8192
ANCHOR_CELLS = {(d, p) for d in (1, 4, 12) for p in (64, 512, 1024, 4096, 16384)}
FIELDS = ("campaign", "arm", "chunk_size", "decode_batch_size", "new_prefill_tokens", "regime", "measured_ms",
          "predicted_ms")


def is_anchor(row: dict[str, str]) -> bool:
    return (int(row["chunk_size"]) == ANCHOR_B
            and (int(row["decode_batch_size"]), int(row["new_prefill_tokens"])) in ANCHOR_CELLS)


def log_error(row: dict[str, str]) -> float:
    return math.log(float(row["measured_ms"]) / float(row["predicted_ms"]))


def pct(predicted: float, measured: float) -> float:
    return abs(predicted / measured - 1.0) * 100.0


def anchored(rows: list[dict[str, str]]) -> dict[str, float] | None:
    """MAPE of one campaign's non-anchor points: as predicted, scaled by regime, launch shifted in ms."""
    anchors = [r for r in rows if is_anchor(r)]
    rest = [r for r in rows if not is_anchor(r)]
    if len(anchors) < 4 or not rest:
        return None
    by_regime: dict[str, list[float]] = defaultdict(list)
    for r in anchors:
        by_regime[r["regime"]].append(log_error(r))
    pooled = statistics.mean(log_error(r) for r in anchors)
    launch_ms = [float(r["measured_ms"]) - float(r["predicted_ms"]) for r in anchors if r["regime"] == "launch"]
    shift = statistics.median(launch_ms) if launch_ms else 0.0

    def scale(r: dict[str, str]) -> float:
        own = by_regime.get(r["regime"], [])
        return math.exp(statistics.mean(own) if len(own) >= 2 else pooled)

    def shifted(r: dict[str, str]) -> float:
        return float(r["predicted_ms"]) + (shift if r["regime"] == "launch" else 0.0)

    out = {"anchors": float(len(anchors)), "points": float(len(rest)),
           "none": statistics.mean(pct(float(r["predicted_ms"]), float(r["measured_ms"])) for r in rest),
           "scale": statistics.mean(pct(float(r["predicted_ms"]) * scale(r), float(r["measured_ms"])) for r in rest),
           "shift": statistics.mean(pct(shifted(r), float(r["measured_ms"])) for r in rest)}
    launch = [r for r in rest if r["regime"] == "launch"]
    if launch:
        out["launch none"] = statistics.mean(pct(float(r["predicted_ms"]), float(r["measured_ms"])) for r in launch)
        out["launch scale"] = statistics.mean(pct(float(r["predicted_ms"]) * scale(r), float(r["measured_ms"]))
                                              for r in launch)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("held_out", nargs="?", type=Path, default=Path("results/h200-held-out/held_out.csv"))
    args = ap.parse_args(argv)
    try:
        with args.held_out.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        print(f"anchor_check: cannot read {args.held_out}: {e.strerror}", file=sys.stderr)
        return 2
    missing = [k for k in FIELDS if rows and k not in rows[0]]
    if not rows or missing:
        print(f"anchor_check: {args.held_out}: no held-out points or no column {', '.join(missing)}", file=sys.stderr)
        return 2
    by_campaign: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        if r["arm"] == "colocated":
            by_campaign[r["campaign"]].append(r)
    print("| campaign | anchors | other points | MAPE as predicted | scaled by regime | launch shifted (ms) "
          "| launch-bound: as predicted → scaled |")
    print("|---|---|---|---|---|---|---|")
    worse = total = 0
    for cid in sorted(by_campaign):
        res = anchored(by_campaign[cid])
        if res is None:
            continue
        total += 1
        worse += res["scale"] > res["none"]
        launch = (f"{res['launch none']:.1f} → {res['launch scale']:.1f} %" if "launch none" in res else "–")
        print(f"| {cid} | {res['anchors']:.0f} | {res['points']:.0f} | {res['none']:.1f} % | {res['scale']:.1f} % "
              f"| {res['shift']:.1f} % | {launch} |")
    print(f"\nscaling by the campaign's own reference cells raised the MAPE of its other points in {worse} of {total} "
          "campaigns")
    print("\nshrunk (log factor x w), mean over campaigns of the regime's non-anchor MAPE:")
    for regime in ("launch", "compute"):
        cells = " · ".join(f"w {w:.2f}: {shrunk(by_campaign, regime, w):.1f} %" for w in WEIGHTS)
        print(f"  {regime}: {cells}")
    return 0


WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def shrunk(by_campaign: dict[str, list[dict[str, str]]], regime: str, w: float) -> float:
    """Mean over campaigns (>= 2 anchor cells and >= 5 other points of `regime`) of the other points' MAPE,
    each prediction times exp(w x the anchor cells' mean log error)."""
    per_campaign = []
    for rows in by_campaign.values():
        anchors = [log_error(r) for r in rows if is_anchor(r) and r["regime"] == regime]
        rest = [r for r in rows if not is_anchor(r) and r["regime"] == regime]
        if len(anchors) < 2 or len(rest) < 5:
            continue
        f = math.exp(w * statistics.mean(anchors))
        per_campaign.append(statistics.mean(pct(float(r["predicted_ms"]) * f, float(r["measured_ms"])) for r in rest))
    return statistics.mean(per_campaign) if per_campaign else math.nan


if __name__ == "__main__":
    raise SystemExit(main())
