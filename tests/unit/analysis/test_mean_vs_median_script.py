"""scripts/mean_vs_median.py (GPU session 37): the committed repeats re-read into the committed table, and a folder
without records or an odd count of folders as one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

OUT = REPO / "results" / "h100-vllm0.22-llama-3.2-3b-instruct-levels-second" / "mean-vs-median.md"


def test_the_committed_repeats_give_the_committed_table(tmp_path: Path) -> None:
    r, s = REPO / "results", "h100-vllm0.22-llama-3.2-3b-instruct"
    pairs = [(f"{s}-levels", f"{s}-levels-second"), (f"{s}-s36", f"{s}-s36-end"),
             (f"{s}-graphs-s36", f"{s}-graphs-s36-end")]
    args = [str(r / name) for pair in pairs for name in pair]
    proc = subprocess.run([sys.executable, "scripts/mean_vs_median.py", *args], cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=120)
    committed = OUT.read_text().splitlines()
    for row in proc.stdout.splitlines()[-3:]:
        assert row in committed
    assert "| 4 | 150 | 17.2% | 8.5% |" in proc.stdout  # 150 repetitions: the mean moved half as much


def test_bad_folders_are_one_line(tmp_path: Path) -> None:
    odd = subprocess.run([sys.executable, "scripts/mean_vs_median.py", str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, check=False, timeout=60)
    assert odd.returncode == 2 and "1 directories: give them in pairs (START END)" in odd.stderr
    empty = subprocess.run([sys.executable, "scripts/mean_vs_median.py", str(tmp_path), str(tmp_path)], cwd=REPO,
                           capture_output=True, text=True, check=False, timeout=60)
    assert empty.returncode == 1
    assert empty.stderr.strip() == f"{tmp_path}: no repetitions of a D > 0 configuration under {{chunk}}/D*_P*.json"
