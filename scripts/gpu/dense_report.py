"""The dense model's projection, predicted before the GPU run and compared after it.

    python scripts/gpu/dense_report.py predict   # before: predictions.json from the projected profile
    python scripts/gpu/dense_report.py compare   # after: comparison.csv / .md, MAPE per quantity

The projected profile `h200-llama-3.1-8b-instruct` (`calibration: projected`, written by
`pdexporter sim profile-from-config llama-3.1-8b-instruct --gpu H200`) runs the sweep protocol on the
embedded engine in virtual time (`predict.grid.predict_records`, fast mode as the GPU run) for every
configuration of sweeps/h200-dense-llama-3.1-8b.yaml. `compare` reads the GPU run's records
(results/h200-vllm0.22-llama-3.1-8b-instruct, unpacked from dense.tgz) and writes the error of the
projection per quantity: the baseline TPOT, the TPOT penalty (token-weighted p50 and mean of the
chunk steps), the prefill duration and the aggregate interference. Calibrating on the short grid and
predicting the rest is then one command (docs/sim.md, "Calibrating a new model").
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pdexporter.measure.store import ResultsStore
from pdexporter.predict.calibrate import METRIC_FIELDS, PointFigures
from pdexporter.predict.grid import predict_records
from pdexporter.sim.profile import load_profile
from pdexporter.sweep.spec import load_sweep

PROFILE = "h200-llama-3.1-8b-instruct"
SWEEP = ROOT / "sweeps" / "h200-dense-llama-3.1-8b.yaml"
OUT = ROOT / "results" / "h200-vllm0.22-llama-3.1-8b-instruct"
QUANTITIES = ("baseline_tpot", "penalty", "penalty_p50", "prefill_duration", "aggregate_interference")


def predict() -> None:
    spec = load_sweep(SWEEP)
    profile = load_profile(PROFILE)
    keys = list(spec.points())
    records = predict_records(profile, keys, spec.protocol, mode="fast")
    points = []
    for key in keys:
        figures = PointFigures.of(records[key])
        points.append({"chunk_size": key[0], "decode_batch_size": key[1], "new_prefill_tokens": key[2],
                       **{q: getattr(figures, METRIC_FIELDS[q]) for q in QUANTITIES}})
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {"profile": profile.name, "calibration": profile.calibration, "note": profile.calibration_note,
           "sweep": str(SWEEP.relative_to(ROOT)), "mode": "fast", "points": points}
    (OUT / "predictions.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT / 'predictions.json'} ({len(points)} configurations, MODELLED by the projected profile)")


def compare() -> None:
    doc = json.loads((OUT / "predictions.json").read_text())
    store = ResultsStore(OUT)
    rows: list[dict[str, object]] = []
    errors: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    for point in doc["points"]:
        key = (point["chunk_size"], point["decode_batch_size"], point["new_prefill_tokens"])
        record = store.load_record(*key)
        if record is None:
            continue
        measured = PointFigures.of(record)
        row: dict[str, object] = {"B": key[0], "D": key[1], "P": key[2]}
        for q in QUANTITIES:
            m, p = getattr(measured, METRIC_FIELDS[q]), point[q]
            row[f"{q} measured"], row[f"{q} projected"] = m, p
            if m and p is not None:
                err = (p - m) / m
                row[f"{q} err"] = round(err, 4)
                errors[q].append(abs(err))
        rows.append(row)
    if not rows:
        raise SystemExit(f"{OUT}: no measured records to compare (unpack dense.tgz there first)")
    with (OUT / "comparison.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [f"Projection ({doc['profile']}, {doc['calibration']}) against {len(rows)} measured configurations",
             "", "| quantity | MAPE | n |", "|---|---|---|"]
    for q in QUANTITIES:
        lines.append(f"| {q} | {100 * statistics.fmean(errors[q]):.1f} % | {len(errors[q])} |" if errors[q]
                     else f"| {q} | - | 0 |")
    text = "\n".join(lines)
    (OUT / "comparison.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    {"predict": predict, "compare": compare}[sys.argv[1] if len(sys.argv) > 1 else "predict"]()
