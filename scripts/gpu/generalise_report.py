"""Predict, then compare: configurations in no committed grid (sweeps/h200-generalise.yaml).

    python scripts/gpu/generalise_report.py predict   # before the GPU run: predictions.json
    python scripts/gpu/generalise_report.py compare   # after it: comparison.csv / .md, MAPE

Two predictors, both fitted only on the committed H200 sweep (results/h200-vllm0.22-qwen3-coder-30b-a3b):

- the cost model (`fits.json`'s chosen model, the context-aware one): the aggregate interference
  C(D, P, B) directly; the penalty as TPOT during the prefill minus the baseline, where TPOT during
  is the token-weighted median of its per-chunk penalties (the window maths' definition) over the
  engine's chunk schedule; the prefill duration as the sum of the chunk steps (baseline step at D,
  interpolated between the grid's D, plus each chunk's penalty) plus the stalls (sigma0 + sigma1 P);
- the embedded engine with the calibrated H200 profile, running the sweep protocol on a virtual
  clock (`predict.grid.predict_records`, fast mode as the GPU run).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pdexporter.analysis.job import analyse, load_results  # noqa: E402
from pdexporter.analysis.models import ContextAwareModel, chunk_schedule  # noqa: E402
from pdexporter.measure.store import ResultsStore  # noqa: E402
from pdexporter.measure.window import weighted_percentile  # noqa: E402
from pdexporter.predict.grid import predict_records  # noqa: E402
from pdexporter.sim.profile import load_profile  # noqa: E402
from pdexporter.sweep.spec import load_sweep  # noqa: E402

TRAIN = ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b"
SWEEP = ROOT / "sweeps" / "h200-generalise.yaml"
OUT = ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-generalise"
QUANTITIES = ("tpot_penalty_ms", "prefill_duration_ms", "aggregate_interference_ms")


def _baseline_at(table, b: int, d: int) -> float:  # type: ignore[no-untyped-def]
    """Decode-only step at D: the grid's baselines (all chunk sizes pooled), interpolated in D."""
    rows = table[table["decode_batch_size"] >= 1].groupby("decode_batch_size")["tpot_baseline_ms"].median()
    return float(np.interp(d, rows.index.to_numpy(float), rows.to_numpy(float)))


def cost_model_prediction(model: ContextAwareModel, table, b: int, d: int, p: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    chunks = np.asarray(chunk_schedule(p, b, d), float)
    prefix = np.concatenate([[0.0], np.cumsum(chunks)[:-1]])
    penalties = model.chunk_penalty_ms(d, chunks, prefix)
    base = _baseline_at(table, b, d)
    stalls = model.sigma0_ms + model.sigma1_ms_per_token * p
    return {
        "tpot_penalty_ms": float(weighted_percentile(penalties, chunks, 50)),
        "prefill_duration_ms": float(np.sum(penalties + base) + stalls),
        "aggregate_interference_ms": float(model.predict(d, p, b)),
    }


def predict() -> None:
    spec = load_sweep(SWEEP)
    keys = list(spec.points())
    analysis = analyse(load_results(TRAIN), source=str(TRAIN))
    assert analysis.fits is not None
    model = analysis.fits.fits["context_aware"].model
    assert isinstance(model, ContextAwareModel)
    profile = load_profile("h200-qwen3-coder-30b-a3b")
    sim = predict_records(profile, keys, spec.protocol, reps=3, mode="fast")
    out = []
    for b, d, p in keys:
        r = sim[(b, d, p)]
        out.append({
            "chunk_size": b, "decode_batch_size": d, "new_prefill_tokens": p,
            "cost_model": cost_model_prediction(model, analysis.table, b, d, p),
            "embedded_engine": {
                "tpot_penalty_ms": r.derived.tpot_penalty_p50_ms,
                "prefill_duration_ms": r.interference.prefill_duration_ms,
                "aggregate_interference_ms": r.derived.aggregate_interference_ms,
            },
        })
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {"trained_on": str(TRAIN.relative_to(ROOT)), "profile": profile.name, "profile_status": profile.status
           if hasattr(profile, "status") else None, "cost_model": model.to_dict(), "points": out}
    (OUT / "predictions.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {OUT / 'predictions.json'} ({len(out)} points)")


def compare() -> None:
    doc = json.loads((OUT / "predictions.json").read_text())
    store = ResultsStore(OUT)
    rows, errors = [], {(who, q): [] for who in ("cost_model", "embedded_engine") for q in QUANTITIES}
    for point in doc["points"]:
        key = (point["chunk_size"], point["decode_batch_size"], point["new_prefill_tokens"])
        record = store.load_record(*key)
        if record is None:
            continue
        measured = {"tpot_penalty_ms": record.derived.tpot_penalty_p50_ms,
                    "prefill_duration_ms": record.interference.prefill_duration_ms,
                    "aggregate_interference_ms": record.derived.aggregate_interference_ms}
        row = {"B": key[0], "D": key[1], "P": key[2], "reps": len(record.reps),
               "cv_penalty": record.summary.cv_tpot_penalty if record.summary else None}
        for q in QUANTITIES:
            row[f"{q} measured"] = measured[q]
            for who in ("cost_model", "embedded_engine"):
                pred = point[who][q]
                row[f"{q} {who}"] = pred
                if measured[q] and pred is not None:
                    err = (pred - measured[q]) / measured[q]
                    row[f"{q} {who} err"] = round(err, 4)
                    errors[(who, q)].append(abs(err))
        rows.append(row)
    if not rows:
        raise SystemExit(f"{OUT}: no measured records to compare")
    with (OUT / "comparison.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| predictor | " + " | ".join(f"{q} MAPE" for q in QUANTITIES) + " |", "|---|---|---|---|"]
    for who in ("cost_model", "embedded_engine"):
        cells = [f"{100 * statistics.fmean(errors[(who, q)]):.1f} %" if errors[(who, q)] else "-" for q in QUANTITIES]
        lines.append(f"| {who} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    (OUT / "comparison.md").write_text(table + "\n")
    print(table)
    for row in rows:
        print({k: (round(v, 1) if isinstance(v, float) and not math.isnan(v) else v) for k, v in row.items()})


if __name__ == "__main__":
    {"predict": predict, "compare": compare}[sys.argv[1] if len(sys.argv) > 1 else "predict"]()
