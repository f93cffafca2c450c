"""Where commands write when not told (issue 24: `results/quick`, `results/sim`, ... landed in the
checkout and were not ignored, so a newcomer's first hour left a dirty tree). Every default output
is under ./results and ignored by git; the committed GPU results are not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pdexporter.cli.report import default_report_path
from pdexporter.sweep.spec import load_sweep, prediction_root

ROOT = Path(__file__).resolve().parents[3]


def _ignored(path: Path | str) -> bool:
    result = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT, check=False)
    return result.returncode == 0


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_every_default_output_is_ignored_and_committed_results_are_not() -> None:
    defaults = [
        "results/8192/D4_P8192.json",  # measure
        "results/interference_table.csv",
        "results/decision.json",
        "results/plots/heatmap.png",  # export-table
        "results/comparison/comparison.csv",  # compare
        default_report_path(ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b"),  # report
        prediction_root("h200-qwen3-coder-30b-a3b", "quick") / "8192" / "D4_P512.json",  # sim sweep
    ]
    for name in ("quick", "seed", "reduced", "quick-pd", "quick-decodebench", "sim-pd"):  # local sweep files
        defaults.append(Path(load_sweep(ROOT / "sweeps" / f"{name}.yaml").output) / "sweep.json")
    for path in defaults:
        assert _ignored(path), f"{path} is not ignored"
    for committed in ("results/h200-vllm0.22-qwen3-coder-30b-a3b/report.html", "results/h200x2-arms/RUN.md"):
        assert not _ignored(committed), committed
