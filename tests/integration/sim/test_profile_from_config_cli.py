"""`pdexporter sim profile-from-config` writes a projected profile in one command, `sim profiles` lists
it with the shipped ones, and the embedded engine serves it; bad input is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdexporter.sim.profile import load_profile

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]


def _run(*args: str, profiles: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PDEXPORTER_PROFILES": str(profiles), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "pdexporter", "sim", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env, check=False)


@pytest.mark.slow
def test_a_new_model_in_one_command_listed_and_served(tmp_path: Path):
    profiles = tmp_path / "profiles"
    proc = _run("profile-from-config", "qwen3-8b", "--gpu", "H100", profiles=profiles)
    assert proc.returncode == 0, proc.stderr
    path = profiles / "h100-qwen3-8b.yaml"
    prof = load_profile(path)
    assert prof.calibration == "projected" and prof.model.architecture == "Qwen3ForCausalLM"
    assert "PROJECTED" in proc.stdout and "datasheet" in proc.stdout and "config.json" in proc.stdout
    assert "decode D=1" in proc.stdout and str(path) in proc.stdout
    # a config.json by path (a model folder), named by its folder
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text((REPO / "pdexporter/sim/configs/llama-3.1-8b-instruct.json").read_text())
    proc = _run("profile-from-config", str(folder), "--gpu", "L40S", "--name", "mine", profiles=profiles)
    assert proc.returncode == 0, proc.stderr
    assert load_profile(profiles / "mine.yaml").model.name == "my-model"
    listed = _run("profiles", profiles=profiles)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if line.count("│") >= 6}
    assert "projected" in rows["h100-qwen3-8b"] and "user" in rows["h100-qwen3-8b"]
    assert "calibrated" in rows["h200-qwen3-coder-30b-a3b"] and "built-in" in rows["h200-qwen3-coder-30b-a3b"]
    assert "calibrated" in rows["h200-llama-3.1-8b-instruct"]  # measured on an H200 (GPU session 8)
    assert "projected" in rows["h20-qwen3-coder-30b-a3b"]
    # the engine predicts with it by name (virtual clock)
    sweep = _run("sweep", str(REPO / "sweeps" / "quick.yaml"), "--profile", "mine", "--out", str(tmp_path / "out"),
                 "--reps", "1", profiles=profiles)
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    assert list((tmp_path / "out").rglob("D*_P*.json"))


def test_bad_input_is_one_line(tmp_path: Path):
    for args, expected in ((("qwen3-8b", "--gpu", "B200"), "unknown GPU"),
                           (("nope.json",), "no such config.json"),
                           (("mixtral-8x7b-instruct", "--gpu", "H100"), "does not fit one H100")):
        proc = _run("profile-from-config", *args, profiles=tmp_path)
        assert proc.returncode != 0
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], proc.stderr
