"""scripts/gpu/step-anatomy.sh's dry run (SIM=1): the script the next H100 session spends its minutes on runs end to
end on the embedded engine (dense-h200.sh's sweep in virtual time, the host monitor as a real process). The embedded
engine has no HTTP server and no profiler, so the profile windows find no engine and no trace is written: held here
is the plumbing and that the run says so, not the traces (tests/unit/sweep/test_step_anatomy.py reads those)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from tests.helpers import REPO, gpu_dry_run

pytestmark = pytest.mark.integration


def test_the_sweep_runs_and_the_missing_traces_are_said(tmp_path: Path) -> None:
    assert "--profiler-config '{prof}'" in (REPO / "sweeps" / "h200-dense-llama-3.2-3b-anatomy.yaml").read_text()
    proc = gpu_dry_run(tmp_path, "step-anatomy.sh", "h200-dense-llama-3.2-3b-anatomy.yaml", 100, HEALTH_TIMEOUT="1")
    assert "step-anatomy: dense-h200.sh rc=0" in proc.stdout
    out = tmp_path / "out"
    with tarfile.open(out / "monitor.tgz") as packed:
        assert any(n.startswith("monitor/host-") and n.endswith(".jsonl") for n in packed.getnames())
    with tarfile.open(out / "anatomy.tgz") as packed:
        said = packed.extractfile("traces.txt")
        assert said is not None and said.read().decode().startswith("no trace in ")
    assert len(list(out.iterdir())) <= 8  # what comes back from the GPU machine
    assert "/health did not answer in 1 s" in proc.stderr
