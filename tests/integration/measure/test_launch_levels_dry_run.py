"""scripts/gpu/launch-levels.sh's dry run (SIM=1): the script a GPU session will spend its minutes on runs end to
end on the embedded engine (dense-h200.sh's sweep in virtual time, the two sidecars as real processes, the launch
probe with --fake, the test double for a machine without CUDA) and host_levels.py reads what it left. Virtual time
leaves nothing to pair (the records' clock is the model's): what is held here is the plumbing."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration


def test_the_sweep_and_both_sidecars_leave_their_files(tmp_path: Path) -> None:
    sweep = tmp_path / "levels.yaml"  # the committed sweep, 2 repetitions instead of 150
    text = (REPO / "sweeps" / "h200-dense-llama-3.2-3b-levels.yaml").read_text()
    assert "\nreps: 150\n" in text
    sweep.write_text(text.replace("\nreps: 150\n", "\nreps: 2\n"))
    env = {**os.environ, "SIM": "1", "OUT": str(tmp_path / "out"), "R": str(tmp_path / "r"), "SWEEP": str(sweep)}
    proc = subprocess.run(["bash", "scripts/gpu/launch-levels.sh", "120"], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "complete: 6 of 6 configurations" in proc.stdout and "launch-levels: dense-h200.sh rc=0" in proc.stdout
    out = tmp_path / "out"
    with tarfile.open(out / "monitor.tgz") as packed:
        names = packed.getnames()
    assert any(n.startswith("monitor/host-") and n.endswith(".jsonl") for n in names)
    assert any(n.startswith("monitor/launch-") and n.endswith(".jsonl") for n in names)
    rows = (out / "levels.csv").read_text().splitlines()
    assert rows[0].startswith("chunk_size,D,P,rep,chunks,penalty_ms,ratio") and len(rows) == 1 + 6 * 2
    assert "one chunk:" in (out / "levels.txt").read_text()
