"""scripts/gpu/burner_ab.py (quiet against busy host, GPU session 26): the committed blocks re-read into the
committed summary.md, and a block folder without a record is one line naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, gpu_script

RUN = REPO / "results" / "h100-vllm0.22-host-burner"


def test_the_committed_blocks_give_the_committed_summary() -> None:
    burner = gpu_script("burner_ab")
    text = burner.summary(RUN)
    assert text + "\n" == (RUN / "summary.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| llama") or line.startswith("| qwen")]
    assert len(rows) == 3  # Llama D = 4 and 12 at B = 4096, the MoE's D = 4 at B = 8192
    blocks = burner.blocks(RUN / "qwen3-coder-30b-a3b-b8192")
    seq = blocks[(8192, 4, 512)]
    assert [(k, cond) for k, cond, _ in seq] == [(1, "quiet"), (2, "burn"), (3, "quiet"), (4, "burn"), (5, "quiet"),
                                                 (6, "burn")]
    assert all(len(pen) == 6 for _, _, pen in seq)


def test_a_block_without_a_record_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "engine" / "b1-quiet").mkdir(parents=True)
    result = subprocess.run([sys.executable, "scripts/gpu/burner_ab.py", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 2
    assert result.stdout.strip().endswith("b1-quiet: no measure record (expected `pdexporter measure --out` there)")
    assert len(result.stdout.strip().splitlines()) == 1 and result.stderr == ""
