"""scripts/gpu/passive_compare.py on the committed H200 passive run (issue 23): on the device its
reference directory was not there and the script died with a traceback; a missing or empty
injected table is one line each, and the comparison of the model and the attribution goes on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-passive"


def _compare(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "scripts/gpu/passive_compare.py",
            str(RUN / "passive"),
            "--out",
            str(tmp_path),
            "--bootstrap",
            "5",
            "--minutes",
            "1",
            *args,
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_reference_that_is_not_there_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    empty = tmp_path / "injected"
    empty.mkdir()
    result = _compare(tmp_path, "--injected", str(empty), "--reference", str(tmp_path / "not-copied"))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "no records" in lines[0] and "not-copied: no such directory" in lines[1]
    doc = json.loads((tmp_path / "comparison.json").read_text())
    assert doc["events"] == 139 and doc["attribution"]["events"] == 138  # the comparison went on
    assert "No injected table" in (tmp_path / "comparison.md").read_text()


def test_a_complete_injected_sweep_needs_no_reference(tmp_path: Path) -> None:
    result = _compare(
        tmp_path, "--injected", str(RUN / "injected"), "--reference", str(tmp_path / "not-copied")
    )
    assert result.returncode == 0, result.stderr
    assert "not read" in result.stderr and "no such directory" not in result.stderr
    doc = json.loads((tmp_path / "comparison.json").read_text())
    assert set(doc["injected_origin"].values()) == {"this run"} and len(doc["injected_origin"]) == 42


def test_no_passive_records_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "scripts/gpu/passive_compare.py",
            str(tmp_path / "none"),
            "--injected",
            str(tmp_path),
            "--out",
            str(tmp_path),
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "no passive events" in result.stderr


def test_level_matched_scoring_is_beside_the_mixed_headline_not_instead(tmp_path: Path) -> None:
    result = _compare(tmp_path, "--injected", str(RUN / "injected"), "--launch-level", "matched")
    assert result.returncode == 0, result.stderr
    doc = json.loads((tmp_path / "comparison.json").read_text())
    committed = json.loads((RUN / "comparison.json").read_text())
    assert doc["launch_level"] == "matched"
    # the headline is the mixed fit's, its point errors as committed (they do not depend on the bootstrap)
    assert doc["traces"]["summary"]["vs_injected"]["mape"] == committed["traces"]["summary"]["vs_injected"]["mape"]
    last = doc["traces"]["level_matched"][-1]
    assert last["scoring"].startswith("level-matched") and last["vs_injected"]["cells"] == 24
    assert {c["level"] for c in last["cells"]} <= {"slow", "fast", "slow+fast", "not launch-bound", "no two levels",
                                                    "unread"}
    text = (tmp_path / "comparison.md").read_text()
    assert "level-matched scoring beside the mixed headline" in text.splitlines()[0]
    assert text.count("#### Level-matched scoring (not the headline figure)") == 2  # traces and cadence


def test_campaign_variation_is_carried_into_the_intervals_and_a_bad_file_is_one_line(tmp_path: Path) -> None:
    """--campaign-variation (held_out.json): the full fits' intervals carry what moves between campaigns,
    so at least as many injected cells fall inside them; a file that is not there is one line, exit 2."""
    held_out = ROOT / "results" / "h200-held-out" / "held_out.json"
    plain, carried = tmp_path / "plain", tmp_path / "carried"
    runs = [_compare(out, "--injected", str(RUN / "injected"), *extra)
            for out, extra in ((plain, ()), (carried, ("--campaign-variation", str(held_out))))]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    docs = [json.loads((out / "comparison.json").read_text())["traces"]["summary"]["vs_injected"]
            for out in (plain, carried)]
    assert docs[0]["mape"] == docs[1]["mape"]  # the point estimates do not move
    assert docs[1]["inside_interval"] >= docs[0]["inside_interval"] and docs[1]["inside_interval"] > 0, docs
    assert "carry the campaign variation" in (carried / "comparison.md").read_text().splitlines()[0]
    bad = _compare(tmp_path / "bad", "--injected", str(RUN / "injected"), "--campaign-variation",
                   str(tmp_path / "nope.json"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nope.json" in bad.stderr, bad.stderr


def test_a_spread_runs_minutes_are_its_segments_traffic_and_a_bad_file_is_one_line(tmp_path: Path) -> None:
    """`--spread spread.tsv` (a spread run's passive segments): the minutes leave out the time between the
    segments; here the first run's ~2.9 minutes with its second minute declared an injected block."""
    from pdexporter._internal.durations import iso_epoch_s

    starts = [iso_epoch_s(rep["started_at"]) for path in (RUN / "passive" / "8192").glob("D*_P*.json")
              for rep in json.loads(path.read_text())["reps"]]
    t0, t1 = min(starts), max(starts)
    tsv = tmp_path / "spread.tsv"
    tsv.write_text(f"segment\t1\t{t0 - 1:.0f}\t{t0 + 60:.0f}\t0\nblock\t1\t{t0 + 61:.0f}\t{t0 + 119:.0f}\t0\n"
                   f"segment\t2\t{t0 + 120:.0f}\t{t1 + 1:.0f}\t0\n")
    result = _compare(tmp_path, "--injected", str(RUN / "injected"), "--spread", str(tsv))
    assert result.returncode == 0, result.stderr
    head = (tmp_path / "comparison.md").read_text().splitlines()[2]
    minutes = float(head.split(" min of traffic")[0].rsplit(" ", 1)[1])
    assert abs(minutes - (t1 - t0 - 60) / 60) < 0.06 and "its segments only" in head
    tsv.write_text("segment\t1\tnoon\t1\t0\n")
    bad = _compare(tmp_path, "--injected", str(RUN / "injected"), "--spread", str(tsv))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "spread.tsv:1: a segment line" in bad.stderr
