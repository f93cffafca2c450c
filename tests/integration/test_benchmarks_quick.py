"""Every benchmark script runs in CI, in its `--quick` mode (tests/benchmarks/quickmode.py), and
prints figures. Issue 31: 3 of the 14 scripts crashed on attributes renamed under them
(`Runner._sensor`, `ProbeLoop.inject`, `PointSpec.num_chunks_expected`) and nothing noticed. The
quick figures are too few to mean anything; what is held here is that every code path a script
drives still exists and runs to its printed end. About 45 s of CPU for the 13, ~5 s each at most
but bench_passive's (~9 s)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import cli_env

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "tests" / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))
SLOW = {"bench_passive.py", "bench_passive_model.py"}  # handed out first under pytest-xdist (tests/conftest.py)
FIGURE = re.compile(r"\d+\.\d+|\b\d+ ?(?:ms|s|us|%|MB|MiB|KiB)\b")

pytestmark = pytest.mark.integration


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 13 and "bench_sim_grid.py" in SCRIPTS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in SCRIPTS])
def test_a_benchmark_runs_quickly_and_prints_figures(script: str) -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--quick"], cwd=ROOT, env=cli_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    tail = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, tail
    assert "Traceback" not in done.stderr, tail
    assert len(FIGURE.findall(done.stdout)) >= 5, tail
