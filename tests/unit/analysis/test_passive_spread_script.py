"""scripts/gpu/passive_spread.py (the timeline of `validation.sh passive-spread`): segments and blocks read
from spread.tsv, related to the committed session 18 records (one passive record of 17 events, two
injected cells of one repetition in each of blocks 0 and 1), and the checks a dry run rests on."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, gpu_script

RUN = REPO / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-passive-s18"


def _t(hms: str) -> int:
    return int(dt.datetime.fromisoformat(f"2026-12-05T{hms}+00:00").timestamp())


def _work(tmp_path: Path, lines: list[str]) -> Path:
    for sub, names in (("passive", ["D12_P1024.json"]), ("injected", ["D4_P512.json", "D12_P512.json"])):
        (tmp_path / sub / "8192").mkdir(parents=True)
        for name in names:
            shutil.copy(RUN / sub / "8192" / name, tmp_path / sub / "8192" / name)
    (tmp_path / "spread.tsv").write_text("".join(line + "\n" for line in lines))
    return tmp_path


# the passive record's 17 events start 03:32:49 .. 03:37:20; the injected repetitions 03:37:5x .. 03:38:5x
TIMELINE = [
    f"segment\t1\t{_t('03:32:00')}\t{_t('03:35:00')}\t0",
    f"block\t1\t{_t('03:37:50')}\t{_t('03:38:10')}\t5",  # stopped at its deadline; the next call finished it
    f"block\t1\t{_t('03:38:20')}\t{_t('03:38:30')}\t0",
    f"segment\t2\t{_t('03:35:00')}\t{_t('03:37:30')}\t0",
    f"block\t2\t{_t('03:38:30')}\t{_t('03:39:00')}\t0",
]


def test_the_timeline_sums_a_resumed_blocks_invocations() -> None:
    spread = gpu_script("passive_spread")
    parts = spread.read_timeline_lines(TIMELINE)
    assert [(p.kind, p.k) for p in parts] == [("segment", 1), ("segment", 2), ("block", 1), ("block", 2)]
    block1 = parts[2]
    assert block1.invocations == [5, 0] and block1.wall_s == 30 and block1.end - block1.start == 40


def test_two_segments_with_events_and_one_repetition_per_block_pass(tmp_path: Path) -> None:
    spread = gpu_script("passive_spread")
    text, doc, failed = spread.summarise(_work(tmp_path, TIMELINE), segments=2)
    assert failed == [] and "Check (2 segments): passed." in text
    counts = {(p["kind"], p["k"]): p["count"] for p in doc["parts"]}
    assert counts[("segment", 1)] + counts[("segment", 2)] == 17 and counts[("segment", 1)] > 0
    assert doc["cells"] == 2 and doc["reps_per_cell"] == {"2": 2} and doc["events_outside"] == 0
    assert "2 invocations (rc 5 0)" in text


def test_a_missing_segment_and_too_few_repetitions_fail_the_check(tmp_path: Path) -> None:
    work = _work(tmp_path, TIMELINE)
    result = subprocess.run([sys.executable, "scripts/gpu/passive_spread.py", str(work), "--segments", "3"],
                            cwd=REPO, capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 1, result.stderr
    failed = json.loads((work / "spread.json").read_text())["failed"]
    assert failed[0] == "segment 3: not in spread.tsv"
    assert failed[1].startswith("2 of 2 injected cells without exactly one repetition per block 0..2")
    # without --segments: the table only, exit 0
    result = subprocess.run([sys.executable, "scripts/gpu/passive_spread.py", str(work)],
                            cwd=REPO, capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0 and "| segment 1 |" in result.stdout and "Check" not in result.stdout


def test_a_timeline_line_that_does_not_read_is_one_line_naming_it() -> None:
    """spread.tsv is read by one parser (`passive_compare.spread_timeline`) here and in passive_compare.py."""
    import pytest

    from pdexporter.errors import RecordError

    spread = gpu_script("passive_spread")
    with pytest.raises(RecordError, match=r"spread.tsv:2: a block line is `block k start end rc`"):
        spread.read_timeline_lines([TIMELINE[0], "block\t1\tnoon\t5\t0"])
    with pytest.raises(RecordError, match=r"spread.tsv:1: segment ends \(1\) before it starts \(5\)"):
        spread.read_timeline_lines(["segment\t1\t5\t1\t0"])


RUN_1RPS = REPO / "results" / "h100-vllm0.22-qwen3-coder-30b-a3b-passive-spread-1rps"


def test_burn_lines_mark_their_blocks_and_the_launch_levels_split_by_part() -> None:
    """Session 26's run: blocks 2 and 4 beside 12 busy loops (BURN_BLOCKS). Its levels by part, re-derived,
    are the committed spread.json's (scripts/results.sh writes it), and the busy blocks are the marked ones."""
    spread = gpu_script("passive_spread")
    text, doc, failed = spread.summarise(RUN_1RPS, segments=5)
    assert failed == []
    assert {(p["kind"], p["k"]): p["burners"] for p in doc["parts"] if p["burners"]} == {("block", 2): 12,
                                                                                       ("block", 4): 12}
    assert "beside 12 busy loops" in text and "| block 2 | 12 |" in text
    levels = doc["launch_levels"]
    committed = json.loads((RUN_1RPS / "spread.json").read_text())["launch_levels"]
    assert levels["totals"] == committed["totals"]
    totals = levels["totals"]
    assert sum(t["read"] for t in totals.values()) == sum(p["read"] for p in levels["parts"]) > 0
    assert totals["burn"]["read"] > 0 and totals["quiet"]["read"] > 0  # both conditions were read
    assert 0 < levels["fisher_quiet_faster_p"] <= 1 and 0 < levels["fisher_burn_faster_p"] <= 1


def test_burn_lines_and_fisher_exact_test() -> None:
    from scipy.stats import fisher_exact

    spread = gpu_script("passive_spread")
    lines = ["segment\t1\t0\t5\t0", "burn\t2\t5\t9\t12", "burn\tx\t5\t9\t12", "block\t2\t5\t9\t0"]
    assert spread.burners(lines) == {2: 12}
    for table in ([[42, 6], [72, 0]], [[72, 0], [42, 6]], [[3, 9], [1, 11]], [[0, 5], [0, 7]]):
        (a, b), (c, d) = table
        want = fisher_exact(table, alternative="greater")[1]
        assert abs(spread.fisher_greater(a, b, c, d) - want) < 1e-9, table
