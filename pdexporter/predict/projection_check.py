"""A projection scored against a measured run, per quantity (issue 36): what `scripts/gpu/dense_report.py
compare` and `scripts/gpu/dense-analysis.sh` print. Takes the predictions document (`predictions.json`:
the MODELLED figures of every configuration of a sweep) and the run's records; a record cut short by a
deadline is named, not fatal."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from pdexporter.errors import RecordError
from pdexporter.measure.store import ResultsStore
from pdexporter.predict.calibrate import METRIC_FIELDS, RESOLVED, PointFigures, penalty_resolved

QUANTITIES = ("baseline_tpot", "penalty", "penalty_p50", "prefill_duration", "aggregate_interference")


def resolved(measured: PointFigures, decodes: int) -> bool:
    """A configuration whose penalty the run resolves (`calibrate.penalty_resolved`: criterion 4's near-zero rule)."""
    penalty, base = (getattr(measured, METRIC_FIELDS[q]) for q in ("penalty", "baseline_tpot"))
    return penalty_resolved(decodes, penalty, base)


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


def compare_projection(results: Path, short: set[tuple[int, int, int]], predictions: Path | None = None,
                       out: Path | None = None) -> str:
    """The projection's error per quantity on whatever part of the grid was measured (a run stopped at its
    deadline leaves part of it): comparison.csv (every configuration) and comparison.md (coverage per chunk
    size; MAPE, median signed error and range per quantity, over all configurations, per chunk size, and
    over those `sim calibrate --train-grid sweeps/calibrate-short.yaml` holds out; `short` empty: nothing
    was fitted on the run, the whole grid is held out and "all measured" says so)."""
    predictions = predictions or results / "predictions.json"
    out = out or results
    doc = json.loads(predictions.read_text())
    store = ResultsStore(results)
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
        into = ["all", f"B={key[0]}", "held" if key not in short else "short"]  # the groups this configuration scores
        into += ["resolved"] if resolved(measured, key[1]) else []
        for q in QUANTITIES:
            m, p = getattr(measured, METRIC_FIELDS[q]), point.get(q)
            row[f"{q} measured"], row[f"{q} projected"], row[f"{q} err"] = m, p, None
            if m and p is not None:
                err = (p - m) / m
                row[f"{q} err"] = round(err, 4)
                for group in into:
                    errors.setdefault((q, group), []).append(err)
        rows.append(row)
    if not rows:
        raise RecordError(f"{results}: no measured records to compare (unpack dense.tgz there first)")
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
    groups = ["all", *(f"B={b}" for b in planned if measured_n.get(b)), *(["held"] if short else []), "resolved"]
    labels = {"all": "all measured" if short else "all measured, all held out (nothing fitted on this run)",
              "held": "held out of the short grid (what `sim calibrate` predicts)",
              "resolved": f"{RESOLVED} (criterion 4's near-zero rule)"}
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
    return text


__all__ = ["QUANTITIES", "compare_projection"]
