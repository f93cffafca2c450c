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

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pdexporter.errors import RecordError
from pdexporter.predict.calibrate import METRIC_FIELDS, PointFigures
from pdexporter.predict.grid import predict_records
from pdexporter.predict.projection_check import QUANTITIES, compare_projection
from pdexporter.sim.modelconfig import load_config, profile_from_config
from pdexporter.sim.profile import load_profile
from pdexporter.sweep.spec import load_sweep

PROFILE = "h200-llama-3.1-8b-instruct"
SWEEP = ROOT / "sweeps" / "h200-dense-llama-3.1-8b.yaml"
OUT = ROOT / "results" / "h200-vllm0.22-llama-3.1-8b-instruct"


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


def compare(results: Path = OUT, predictions: Path | None = None, out: Path | None = None) -> str:
    """`compare_projection` on the dense run, its held-out part being what the short grid leaves out."""
    try:
        text = compare_projection(results, _short_grid(), predictions, out)
    except RecordError as exc:
        raise SystemExit(str(exc)) from None
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
