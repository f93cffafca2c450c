"""`pdexporter sim calibrate` end to end: records from a known 'truth' engine, the fit finds it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pdexporter.sim.predict import predict_records
from pdexporter.sim.profile import load_profile

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]


def test_calibrate_recovers_a_known_engine_and_predicts_held_out_points(tmp_path: Path):
    base = load_profile("h200-qwen3-coder-30b-a3b")
    truth = base.with_step_time(
        base.step_time.model_copy(update={"attention_efficiency": 0.5, "eager_overhead_ms": 30.0, "fixed_ms": 3.5}),
        calibration="projected", note="the engine the records come from (a test's ground truth)")
    keys = [(b, d, p) for b in (2048, 8192) for d in (1, 4, 12) for p in (2048, 8192, 32768)]
    results = tmp_path / "results"
    predict_records(truth, keys, out=results, reps=2)
    out = tmp_path / "fitted.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "pdexporter", "sim", "calibrate", str(results), "--holdout", "0.3", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "MODELLED" in proc.stderr  # records from the embedded engine are flagged
    assert "held-out configurations (5)" in proc.stdout
    fitted_row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("│ fitted") and "%" in line
                      and line.count("%") >= 5)
    assert all(float(x.split()[0]) < 1.0 for x in fitted_row.split("│")[2:7])  # every held-out MAPE < 1 %
    fitted = load_profile(out)
    assert fitted.calibration == "calibrated" and fitted.calibration_source == str(results)
    assert fitted.step_time.attention_efficiency == pytest.approx(0.5, rel=0.02)
    assert fitted.step_time.eager_overhead_ms == pytest.approx(30.0, rel=0.05)


def test_calibrate_refuses_an_empty_directory(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "pdexporter", "sim", "calibrate", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and "no records" in proc.stderr
