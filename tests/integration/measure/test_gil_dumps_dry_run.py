"""scripts/gpu/gil-dumps.sh's dry run (SIM=1): the script the next H100 session runs (results/h100-vllm0.22-llama-3.2-
3b-instruct-counters/PLAN.md) runs end to end on the embedded engine: the anatomy sweep in virtual time, the host
monitor, and thread_counters.py as a real process sampling the sweep's own main thread (the embedded engine runs in
it). py-spy is not on this machine: the run says so and takes no dumps. gil_dumps.py's reading of what comes back is
tests/unit/analysis/test_gil_dumps_script.py's."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.helpers import gpu_dry_run

pytestmark = pytest.mark.integration


def test_the_sweep_runs_with_the_counters_beside_it(tmp_path: Path) -> None:
    proc = gpu_dry_run(tmp_path, "gil-dumps.sh", "h200-dense-llama-3.2-3b-anatomy.yaml", 100,
                       PYSPY=str(tmp_path / "no-py-spy"))
    assert "no dumps" in proc.stdout
    assert "thread counters: task_ns yes" in proc.stdout  # --check's line
    out = tmp_path / "out"
    assert not (out / "dumps.txt.gz").exists()
    header, *rows = [json.loads(x) for x in gzip.decompress((out / "counters.jsonl.gz").read_bytes()).splitlines()]
    assert header["available"]["task_ns"] is True and rows  # the sweep's own main thread, sampled while it ran
    assert all(b["task_ns"] >= a["task_ns"] for a, b in zip(rows, rows[1:], strict=False))
    assert len(list(out.iterdir())) <= 8  # what comes back from the GPU machine
