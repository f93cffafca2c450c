"""scripts/gpu/block_ab.py (two conditions block by block; quiet against busy host in GPU session 26): the
committed blocks re-read into the committed summary.md, and a block folder without a record, or an engine folder
without exactly two conditions, is one line naming it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, gpu_script

RUN = REPO / "results" / "h100-vllm0.22-host-burner"


def test_the_committed_blocks_give_the_committed_summary() -> None:
    burner = gpu_script("block_ab")
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
    result = subprocess.run([sys.executable, "scripts/gpu/block_ab.py", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 2
    assert result.stdout.strip().endswith("b1-quiet: no measure record (expected `pdexporter measure --out` there)")
    assert len(result.stdout.strip().splitlines()) == 1 and result.stderr == ""


def test_an_engine_folder_of_one_condition_is_one_line(tmp_path: Path) -> None:
    source = RUN / "qwen3-coder-30b-a3b-b8192"
    engine = tmp_path / "engine"
    for block in ("b1-quiet", "b3-quiet"):  # two blocks of the same condition, the other never ran
        shutil.copytree(source / block, engine / block)
    result = subprocess.run([sys.executable, "scripts/gpu/block_ab.py", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 2
    assert result.stdout.strip() == f"{engine}: 1 conditions (quiet), expected two"


def test_any_two_conditions_are_read_with_the_first_block_as_the_reference(tmp_path: Path) -> None:
    """engine-ab.sh's folders: `a` (block 1) and `b`, their names in the header and the legend."""
    source = RUN / "qwen3-coder-30b-a3b-b8192"
    for src, dst in (("b1-quiet", "b1-a"), ("b2-burn", "b2-b"), ("b3-quiet", "b3-a"), ("b4-burn", "b4-b")):
        shutil.copytree(source / src, tmp_path / "engine" / dst)
    text = gpu_script("block_ab").summary(tmp_path)
    header, _, row = text.splitlines()[:3]
    assert "| a: reps, median, CV | b: reps, median, CV | b / a | p (b slower) | p (a slower) |" in header
    assert row.startswith("| engine | B=8192 D=4 P=512 | 1a 40.6 2B 58.9 3a 40.1 4B 46.9 | 12, ")
    assert text.endswith("a: a block of `a`, B: a block of `b`. CV: the pooled repetitions' (two launch levels show as "
                         "a large one). p: one-sided Mann-Whitney U on the pooled repetitions.")
    first, second = (cell.strip() for cell in row.split("|")[4:6])
    assert first.startswith("12, ") and first.endswith("%") and second.startswith("12, ") and second.endswith("%")
