"""scripts/gpu/engine-ab.sh's dry run (ENGINE=sim): the script the next GPU session spends its minutes on runs end to
end on the embedded engine (a real `sim serve` per block, real `pdexporter measure` runs, real files), resumes
without measuring again, and `block_ab.py` reads what it wrote."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from pdexporter.measure.store import ResultsStore
from tests.helpers import REPO, free_port

pytestmark = pytest.mark.integration


def _run(tmp_path: Path, port: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "R": str(tmp_path / "r"), "ENGINE": "sim",
           "CELLS": "4:512", "REPS": "2", "BLOCKS": "2", "PORT": str(port), "GPU": "test-double"}
    return subprocess.run(["bash", "scripts/gpu/engine-ab.sh", "240"], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False, timeout=300)


def test_two_blocks_on_the_embedded_engine_then_a_resume_that_measures_nothing(tmp_path: Path) -> None:
    port = free_port()
    first = _run(tmp_path, port)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "engine-ab: done" in first.stdout
    engine = tmp_path / "r" / "ab" / "qwen3-coder-30b-a3b-b8192"
    for block in ("b1-a", "b2-b"):
        records = list(ResultsStore(engine / block).iter_records())
        assert len(records) == 1 and len(records[0].reps) == 2 and records[0].config.gpu == "test-double"
        assert (engine / block / "engine.trimmed.log.gz").is_file()  # the block's engine log, trimmed
    assert "| qwen3-coder-30b-a3b-b8192 | B=8192 D=4 P=512 | 1a " in first.stdout  # block_ab.py's table
    with tarfile.open(tmp_path / "out" / "ab.tgz") as packed:
        names = packed.getnames()
    assert "ab/qwen3-coder-30b-a3b-b8192/b2-b/8192/D4_P512.json" in names
    assert not any(name.endswith("engine.log") for name in names)
    second = _run(tmp_path, port)  # every cell complete: no engine started, nothing measured again
    assert second.returncode == 0 and "engine-ab: done" in second.stdout
    assert (tmp_path / "r" / "ab" / "ab.log").read_text().count("starting sim") == 2
    assert all(len(r.reps) == 2 for block in ("b1-a", "b2-b") for r in ResultsStore(engine / block).iter_records())
