"""Would the host's launch level, read live from the minutes before a prompt, predict its cost?
(issue 30, docs/analysis.md "What a live launch level buys")

A launch-bound prompt (one eager chunk, `decision_eval.cost_regime`) costs what the host's kernel
launches cost at that moment, and that level moves between campaigns and within one. A router could
read it from the traffic just before its decision. This replays that on the committed campaigns:
each launch-bound configuration's held-out prediction (`results/h200-held-out/held_out.csv`, leave
one campaign out) times exp(median log error of the launch-bound repetitions of *other*
configurations that started in the W seconds before its own first repetition) — only what a live
reader would have seen before, in the same campaign. Repetitions come from the records named in
`held_out.json` (their `started_at` and aggregate interference).

It prints the launch-bound MAPE (|predicted - measured| / measured, mean over configurations) as
predicted and with the live level, for several W, and per campaign for one W. Pure arithmetic on
committed files; no model is refitted.

    python scripts/level_tracking.py [results/h200-held-out] [--window 120]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdexporter._internal.durations import iso_epoch_s  # noqa: E402

Key = tuple[str, int, int, int]  # campaign, B, D, P
WINDOWS_S = (30, 60, 120, 300, 900)


def held_out(path: Path) -> dict[Key, tuple[float, float]]:
    """(predicted, measured) of every launch-bound colocated configuration."""
    out = {}
    with path.open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["arm"] == "colocated" and row["regime"] == "launch":
                key = (row["campaign"], int(row["chunk_size"]), int(row["decode_batch_size"]),
                       int(row["new_prefill_tokens"]))
                out[key] = (float(row["predicted_ms"]), float(row["measured_ms"]))
    return out


def repetitions(doc: dict, root: Path, points: dict[Key, tuple[float, float]]) -> list[tuple[Key, float, float]]:
    """(configuration, start time in s, log(measured / predicted)) of every launch-bound repetition."""
    out = []
    seen = set()
    for campaign in doc["campaigns"]:
        for directory in campaign["colocated"]:
            for path in sorted((root / directory).glob("[0-9]*/D*_P*.json")):
                record = json.loads(path.read_text(encoding="utf-8"))
                c = record["config"]
                key = (campaign["id"], c["chunk_size"], c["decode_batch_size"], c["new_prefill_tokens"])
                if key not in points:
                    continue
                for rep in record["reps"]:
                    value = (rep.get("derived") or {}).get("aggregate_interference_ms")
                    if not rep.get("started_at") or not value or value <= 0:
                        continue
                    t = iso_epoch_s(rep["started_at"])
                    if (key, t) not in seen:  # a configuration in two directories of one campaign
                        seen.add((key, t))
                        out.append((key, t, math.log(value / points[key][0])))
    return out


def tracked(points: dict[Key, tuple[float, float]], reps: list[tuple[Key, float, float]], window_s: float
            ) -> dict[Key, tuple[float, float]]:
    """Per configuration: (error as predicted, error with the live level), relative to the measurement."""
    by_campaign: dict[str, list[tuple[float, Key, float]]] = defaultdict(list)
    first: dict[Key, float] = {}
    for key, t, r in reps:
        by_campaign[key[0]].append((t, key, r))
        first[key] = min(t, first.get(key, math.inf))
    out = {}
    for key, t0 in first.items():
        before = [r for t, other, r in by_campaign[key[0]] if t0 - window_s <= t < t0 and other != key]
        level = statistics.median(before) if before else 0.0
        predicted, measured = points[key]
        out[key] = (abs(predicted - measured) / measured, abs(predicted * math.exp(level) - measured) / measured)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("held_out", nargs="?", type=Path, default=Path("results/h200-held-out"))
    ap.add_argument("--window", type=float, default=120.0, help="seconds before the configuration (per campaign)")
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    points = held_out(args.held_out / "held_out.csv")
    doc = json.loads((args.held_out / "held_out.json").read_text(encoding="utf-8"))
    reps = repetitions(doc, root, points)
    print(f"{len(points)} launch-bound configurations, {len(reps)} repetitions with a start time")
    print("| W (s) | configurations | MAPE as predicted | with the live level |")
    print("|---|---|---|---|")
    for w in WINDOWS_S:
        errs = tracked(points, reps, w)
        print(f"| {w} | {len(errs)} | {100 * statistics.fmean(e for e, _ in errs.values()):.1f} % | "
              f"{100 * statistics.fmean(e for _, e in errs.values()):.1f} % |")
    errs = tracked(points, reps, args.window)
    print(f"\nPer campaign, W = {args.window:g} s:\n\n| campaign | configurations | as predicted | live level |")
    print("|---|---|---|---|")
    for cid in sorted({k[0] for k in errs}):
        rows = [v for k, v in errs.items() if k[0] == cid]
        print(f"| {cid} | {len(rows)} | {100 * statistics.fmean(e for e, _ in rows):.1f} % | "
              f"{100 * statistics.fmean(e for _, e in rows):.1f} % |")


if __name__ == "__main__":
    main()
