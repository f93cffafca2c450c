"""scripts/gpu/launch-levels.sh's dry run (SIM=1): the script a GPU session will spend its minutes on runs end to
end on the embedded engine (dense-h200.sh's sweep in virtual time, the two sidecars as real processes, the launch
probe with --fake, the test double for a machine without CUDA) and host_levels.py reads what it left. Virtual time
leaves nothing to pair (the records' clock is the model's): what is held here is the plumbing."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from tests.helpers import gpu_dry_run

pytestmark = pytest.mark.integration


def test_the_sweep_and_both_sidecars_leave_their_files(tmp_path: Path) -> None:
    proc = gpu_dry_run(tmp_path, "launch-levels.sh", "h200-dense-llama-3.2-3b-levels.yaml", 150)
    assert "launch-levels: dense-h200.sh rc=0" in proc.stdout
    out = tmp_path / "out"
    with tarfile.open(out / "monitor.tgz") as packed:
        names = packed.getnames()
    assert any(n.startswith("monitor/host-") and n.endswith(".jsonl") for n in names)
    assert any(n.startswith("monitor/launch-") and n.endswith(".jsonl") for n in names)
    rows = (out / "levels.csv").read_text().splitlines()
    assert rows[0].startswith("chunk_size,D,P,rep,chunks,penalty_ms,ratio") and len(rows) == 1 + 6 * 2
    assert "one chunk:" in (out / "levels.txt").read_text()
