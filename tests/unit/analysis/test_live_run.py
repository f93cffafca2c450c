"""The live-thresholds run's summary (`analysis.live_run`), on the committed H200 run (issue 33)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdexporter.analysis.live_run import live_run_summary

RUN = Path(__file__).resolve().parents[3] / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-live-thresholds"
DECISION = RUN.parent / "h200x2-arms" / "decision.json"


def test_the_committed_run_summarises_one_row_per_load_with_the_batch_threshold_inside() -> None:
    text = live_run_summary(RUN, str(RUN / "batch" / "offload_thresholds.json"), DECISION, "vllm")
    rows = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert [r.split(" | ")[1] for r in rows] == ["6", "7"]  # the D each load ran
    assert all("64 [64..64]" in r and r.endswith("| yes |") for r in rows)
    assert "one H200" in text.splitlines()[0]


def test_without_the_injected_table_the_committed_file_is_the_reference(tmp_path: Path) -> None:
    text = live_run_summary(RUN, "", DECISION, "sim")
    assert "MODELLED" in text and text.count("not swept") == 2


def test_a_sample_missing_its_numbers_is_named(tmp_path: Path) -> None:
    (tmp_path / "thresholds").mkdir()
    (tmp_path / "thresholds.tsv").write_text("unix_s\tphase\tdecode_batch_size\tbound\ttokens\n1\t1\t4\tcentral\t64\n")
    (tmp_path / "thresholds" / "1.yaml").write_text("# sampled at 1, load 1 req/s\n")
    with pytest.raises(ValueError, match="current load"):
        live_run_summary(tmp_path, "", DECISION)
