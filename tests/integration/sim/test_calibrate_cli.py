"""`pdexporter sim calibrate` end to end: records from a known 'truth' engine, the fit finds it.

The truth differs from the base profile in a GPU parameter (stage 1, fitted on step times), in a
launch cost and in a per-request cost (stage 2, fitted by running the protocol on the engine):
the command must recover all three and predict the held-out configurations almost exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdexporter.sim.calibrate import with_values
from pdexporter.sim.predict import predict_records
from pdexporter.sim.profile import load_profile

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]
TRUTH = {"attention_efficiency": 0.5, "launch_eager_ms": 35.0, "retire_us_per_token": 1.5}


def test_calibrate_recovers_a_known_engine_and_predicts_held_out_points(tmp_path: Path):
    base = load_profile("h200-qwen3-coder-30b-a3b")
    truth = with_values(base, TRUTH).with_step_time(
        with_values(base, TRUTH).step_time, calibration="projected",
        note="the engine the records come from (a test's ground truth)")
    keys = [(b, d, p) for b in (2048, 8192) for d in (0, 4, 12) for p in (2048, 8192, 32768)]
    results = tmp_path / "results"
    predict_records(truth, keys, out=results, reps=2, mode="fast")
    out, report = tmp_path / "fitted.yaml", tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pdexporter", "sim", "calibrate", str(results), "--holdout", "0.3", "--out", str(out),
         "--rounds", "1", "--max-evaluations", "90", "--report", str(report),
         "--free", "attention_efficiency,launch_eager_ms,retire_us_per_token"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "MODELLED" in proc.stderr  # records from the embedded engine are flagged
    assert "MAPE on the 5 held-out configurations" in proc.stdout
    fitted = load_profile(out)
    assert fitted.calibration == "calibrated" and fitted.calibration_source == str(results)
    assert fitted.step_time.attention_efficiency == pytest.approx(0.5, rel=0.02)
    assert fitted.step_time.launch_eager_ms == pytest.approx(35.0, rel=0.05)
    assert fitted.engine_loop.retire_us_per_token == pytest.approx(1.5, rel=0.1)
    figures = json.loads(report.read_text())
    assert len(figures["held_out_configurations"]) == 5
    held = figures["held_out_fitted"]["mape"]
    for metric in ("prefill_duration", "during_tpot", "baseline_tpot"):
        assert held[metric]["all"] < 1.0, (metric, held[metric])  # every held-out MAPE < 1 %
    assert set(held["prefill_duration"]) == {"2048", "8192", "all"}  # per chunk size and overall
    assert figures["held_out_base"]["mape"]["prefill_duration"]["all"] > held["prefill_duration"]["all"]


def test_calibrate_refuses_an_empty_directory(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "pdexporter", "sim", "calibrate", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and "no records" in proc.stderr


def test_calibrate_refuses_an_unknown_parameter(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "pdexporter", "sim", "calibrate", str(tmp_path), "--free",
                           "attention_efficiency,warp_factor"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and "--free warp_factor" in proc.stderr
