"""`pdexporter measure` with no --target runs on the embedded engine, and its record says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]


def test_measure_defaults_to_the_embedded_engine_and_records_it_as_modelled(tmp_path: Path):
    proc = subprocess.run(
        # The seed's 256-token probes: room for steady state on a loaded machine (with 96, a few
        # late steps in a row left no time for it before the probes ended).
        [sys.executable, "-m", "pdexporter", "measure", "--out", str(tmp_path), "-B", "2048", "-D", "2", "-P", "4096",
         "--reps", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert "MODELLED" in proc.stderr
    record = json.loads((tmp_path / "2048" / "D2_P4096.json").read_text())
    config = record["config"]
    assert config["modelled"] is True and config["engine"] == "pdexporter-sim" and "MODELLED" in config["note"]
    assert config["gpu"] == "H200" and config["profile"] == "h200-qwen3-coder-30b-a3b"
    assert config["engine_version"].endswith("+pdexporter.sim")
    # the launcher kept the engine's log: its iteration lines give the exact chunks
    assert record["interference"]["chunk_tokens_engine_log"] == [2046, 2046, 4]
    assert record["interference"]["num_chunks_expected"] == 3
    log = next((tmp_path / "2048" / "engine").glob("sim-2048.log")).read_text()
    assert "Iteration(" in log and "MODELLED" in log


def test_sim_serve_rejects_a_bad_profile_file_in_one_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncalibration: guessed\n")
    proc = subprocess.run([sys.executable, "-m", "pdexporter", "sim", "serve", "--profile", str(bad), "--port", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "calibration" in lines[0]
