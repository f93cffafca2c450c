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

from pdexporter.errors import RecordError
from pdexporter.measure.store import ResultsStore
from pdexporter.predict.calibrate import METRIC_FIELDS, PointFigures
from pdexporter.predict.grid import predict_records
from pdexporter.sim.modelconfig import load_config, profile_from_config
from pdexporter.sim.profile import load_profile
from pdexporter.sweep.spec import load_sweep

PROFILE = "h200-llama-3.1-8b-instruct"
SWEEP = ROOT / "sweeps" / "h200-dense-llama-3.1-8b.yaml"
OUT = ROOT / "results" / "h200-vllm0.22-llama-3.1-8b-instruct"
QUANTITIES = ("baseline_tpot", "penalty", "penalty_p50", "prefill_duration", "aggregate_interference")


def predict(rule: str | None = None, references: str = "h200-qwen3-coder-30b-a3b", target: Path | None = None) -> None:
    """predictions.json of the shipped profile, or (`rule`) of Llama-3.1-8B projected from its config.json and
    the `references` (comma-separated calibrated profiles: the MoE one alone for a projection the dense run
    never saw) with that rule (`pdexporter.sim.projection`)."""
    spec = load_sweep(SWEEP)
    if rule is None:
        profile = load_profile(PROFILE)
    else:
        cfg, source = load_config("llama-3.1-8b-instruct")
        profile = profile_from_config(cfg, "H200", name=PROFILE, model_name="llama-3.1-8b-instruct", source=source,
                                      carry_from=references.split(","), rule=rule, max_model_len=65536)
    keys = list(spec.points())
    records = predict_records(profile, keys, spec.protocol, mode="fast")
    points = []
    for key in keys:
        figures = PointFigures.of(records[key])
        points.append({"chunk_size": key[0], "decode_batch_size": key[1], "new_prefill_tokens": key[2],
                       **{q: getattr(figures, METRIC_FIELDS[q]) for q in QUANTITIES}})
    target = target or OUT / "predictions.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    doc = {"profile": profile.name + (f" ({rule} rule, from {references})" if rule else ""),
           "calibration": profile.calibration, "note": profile.calibration_note,
           "provenance": profile.provenance.get("step_time"), "sweep": str(SWEEP.relative_to(ROOT)), "mode": "fast",
           "points": points}
    target.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {target} ({len(points)} configurations, MODELLED by {doc['profile']}, {profile.calibration})")


def _short_grid() -> set[tuple[int, int, int]]:
    return set(load_sweep(ROOT / "sweeps" / "calibrate-short.yaml").points())


def _stats(errors: list[float]) -> str:
    """MAPE | median signed | range, in %."""
    if not errors:
        return "- | - | -"
    return (f"{100 * statistics.fmean(abs(e) for e in errors):.1f} % | {100 * statistics.median(errors):+.1f} % | "
            f"{100 * min(errors):+.1f} … {100 * max(errors):+.1f} %")


def _load(store: ResultsStore, key: tuple[int, int, int], problems: list[str]):
    try:
        record = store.load_record(*key)
    except RecordError as exc:  # a record cut short by the deadline: named, not fatal
        problems.append(f"{key}: {exc}")
        return None
    if record is not None and not record.reps:
        problems.append(f"{key}: no repetition recorded")
        return None
    return record


def compare(results: Path = OUT, predictions: Path | None = None, out: Path | None = None) -> str:
    """The projection's error per quantity on whatever part of the grid was measured (a run stopped at its
    deadline leaves part of it): comparison.csv (every configuration) and comparison.md (coverage per chunk
    size; MAPE, median signed error and range per quantity, over all configurations, per chunk size, and
    over those `sim calibrate --train-grid sweeps/calibrate-short.yaml` holds out)."""
    predictions = predictions or results / "predictions.json"
    out = out or results
    doc = json.loads(predictions.read_text())
    store = ResultsStore(results)
    short = _short_grid()
    rows: list[dict[str, object]] = []
    problems: list[str] = []
    errors: dict[tuple[str, str], list[float]] = {}
    planned: dict[int, int] = {}
    measured_n: dict[int, int] = {}
    reps: list[int] = []
    for point in doc["points"]:
        key = (point["chunk_size"], point["decode_batch_size"], point["new_prefill_tokens"])
        planned[key[0]] = planned.get(key[0], 0) + 1
        record = _load(store, key, problems)
        if record is None:
            continue
        measured_n[key[0]] = measured_n.get(key[0], 0) + 1
        reps.append(len(record.reps))
        measured = PointFigures.of(record)
        row: dict[str, object] = {"B": key[0], "D": key[1], "P": key[2], "reps": len(record.reps),
                                  "in_short_grid": key in short}
        for q in QUANTITIES:
            m, p = getattr(measured, METRIC_FIELDS[q]), point.get(q)
            row[f"{q} measured"], row[f"{q} projected"], row[f"{q} err"] = m, p, None
            if m and p is not None:
                err = (p - m) / m
                row[f"{q} err"] = round(err, 4)
                for group in ("all", f"B={key[0]}", "held" if key not in short else "short"):
                    errors.setdefault((q, group), []).append(err)
        rows.append(row)
    if not rows:
        raise SystemExit(f"{results}: no measured records to compare (unpack dense.tgz there first)")
    fields = ["B", "D", "P", "reps", "in_short_grid"] + [f"{q} {c}" for q in QUANTITIES
                                                         for c in ("measured", "projected", "err")]
    out.mkdir(parents=True, exist_ok=True)
    suffix = predictions.stem.split("-", 1)[-1] if predictions.name != "predictions.json" else ""
    stem = "comparison" + (f"-{suffix}" if suffix else "")
    with (out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    coverage = ", ".join(f"B = {b}: {measured_n.get(b, 0)} of {n}" for b, n in planned.items())
    lines = [f"Projection ({doc['profile']}, {doc['calibration']}) against {len(rows)} of the {sum(planned.values())} "
             f"configurations of {doc.get('sweep', 'the sweep')} measured ({coverage}; "
             f"{min(reps)}–{max(reps)} repetitions each). MODELLED vs measured: error = (projected − measured) / "
             "measured.", ""]
    groups = ["all", *(f"B={b}" for b in planned if measured_n.get(b)), "held"]
    labels = {"all": "all measured", "held": "held out of the short grid (what `sim calibrate` predicts)"}
    for group in groups:
        n = max((len(errors.get((q, group), [])) for q in QUANTITIES), default=0)
        if not n:
            continue
        lines += [f"**{labels.get(group, group)}** ({n} configurations)", "",
                  "| quantity | MAPE | median signed | range | n |", "|---|---|---|---|---|"]
        for q in QUANTITIES:
            e = errors.get((q, group), [])
            lines.append(f"| {q} | {_stats(e)} | {len(e)} |")
        lines.append("")
    if problems:
        lines += ["Not compared: " + "; ".join(problems), ""]
    text = "\n".join(lines)
    (out / f"{stem}.md").write_text(text + "\n")
    print(text)
    return text


def main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="?", choices=("predict", "compare"), default="predict")
    ap.add_argument("--results", type=Path, default=OUT, help="the GPU run's records (compare)")
    ap.add_argument("--predictions", type=Path, help="predictions.json (default: in --results)")
    ap.add_argument("--out", type=Path, help="where comparison.csv/.md go (default: --results)")
    ap.add_argument("--rule", choices=("learned", "carry"), help="predict: a fresh projection with this rule")
    ap.add_argument("--from", dest="references", default="h200-qwen3-coder-30b-a3b",
                    help="predict --rule: the reference profiles, comma-separated")
    args = ap.parse_args(argv)
    if args.what == "predict":
        predict(args.rule, args.references, args.predictions)
    else:
        compare(args.results, args.predictions, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
