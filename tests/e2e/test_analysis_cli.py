"""`pdexporter export-table`, `report`, `decide` and `compare` end to end, and their one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pdexporter.analysis.synthetic import SyntheticTruth, seed_grid, synthetic_records
from pdexporter.measure.store import ResultsStore
from tests.helpers import run_cli

pytestmark = pytest.mark.e2e

GRID = list(seed_grid(chunks=(2048, 8192), decodes=(0, 1, 4, 12), prefills=(512, 4096, 16384, 32768)))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    store = ResultsStore(root)
    for record in synthetic_records(SyntheticTruth(), GRID, reps=3):
        store.save_record(record)
    return root


def _cli(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    return run_cli(capsys, *argv)



def test_export_table_writes_everything(results, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "pdexporter", "export-table", str(results), "--out", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"interference_table.csv", "interference_table.parquet", "fits.json", "decision.json",
            "criteria.json"} <= names
    assert {f"plots/{n}.{ext}" for n in ("heatmap_penalty_ratio", "chunk_sensitivity", "breakeven_8192")
            for ext in ("png", "svg")} <= names
    assert not [n for n in names if n.endswith(".tmp")]
    assert done.stdout.strip().endswith("interference_table.csv")
    assert "MODELLED DATA" in done.stderr and "context_aware" in done.stderr and "Success criteria" in done.stderr
    fits = json.loads((out / "fits.json").read_text())
    assert fits["chosen"] == "context_aware" and fits["modelled"] is True
    criteria = json.loads((out / "criteria.json").read_text())
    assert [c["number"] for c in criteria["criteria"]] == [1, 2, 3, 4]
    header = (out / "interference_table.csv").read_text().splitlines()[0]
    assert header.startswith("chunk_size,decode_batch_size,new_prefill_tokens,tpot_baseline_ms,")
    assert len((out / "interference_table.csv").read_text().splitlines()) == len(GRID) + 1


def test_report_and_decide(results, tmp_path, capsys):
    html = tmp_path / "r.html"
    code, out, err = _cli(capsys, "report", str(results), "--out", str(html))
    assert code == 0, err
    assert out.strip() == str(html) and html.read_text().startswith("<!DOCTYPE html>")

    code, out, err = _cli(capsys, "export-table", str(results), "--out", str(tmp_path), "--no-plots")
    assert code == 0, err
    decision = tmp_path / "decision.json"
    code, out, err = _cli(capsys, "decide", "-D", "4", "-P", "16384", "--chunk-size", "8192", "--transfer-ms", "50",
                          "--model", str(decision))
    assert code == 0, err
    assert out.startswith("OFFLOAD: interference ") and "> transfer 50.0 ms" in out
    assert "3 chunks of <= 8188 tokens" in out and "MODELLED" in err
    code, out, err = _cli(capsys, "decide", "-D", "1", "-P", "512", "-B", "8192", "--results", str(results), "--json")
    assert code == 0, err
    verdict = json.loads(out)
    assert verdict["offload"] is False and verdict["chunks"] == 1 and verdict["measured"]["reps"] == 3
    # A huge transfer budget flips the first answer.
    code, out, _ = _cli(capsys, "decide", "-D", "4", "-P", "16384", "--transfer-ms", "100000", "--model", str(decision))
    assert code == 0 and out.startswith("KEEP LOCAL")


def _one_line_error(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0
    assert len(lines) == 1, err
    assert lines[0].startswith("pdexporter: error: ")
    return lines[0]


def test_bad_input_is_one_line_and_loses_nothing(results, tmp_path, capsys):
    line = _one_line_error(*_cli(capsys, "export-table", str(tmp_path / "nope"))[::2])
    assert "nope: no such results directory" in line

    empty = tmp_path / "empty"
    empty.mkdir()
    line = _one_line_error(*_cli(capsys, "export-table", str(empty))[::2])
    assert "no records found" in line

    broken = tmp_path / "broken"
    store = ResultsStore(broken)
    for record in synthetic_records(SyntheticTruth(), GRID[:3], reps=2):
        store.save_record(record)
    (broken / "interference_table.csv").write_text("the previous table\n")
    bad = store.record_path(2048, 0, 512)
    bad.write_text('{"config": {"decode_batch_size": -1}}')
    line = _one_line_error(*_cli(capsys, "export-table", str(broken))[::2])
    assert str(bad) in line and "config.decode_batch_size" in line
    bad.write_text("{not json")
    line = _one_line_error(*_cli(capsys, "report", str(broken))[::2])
    assert "not valid JSON" in line
    assert (broken / "interference_table.csv").read_text() == "the previous table\n"
    assert not (broken / "report.html").exists()

    line = _one_line_error(*_cli(capsys, "export-table", "--prometheus", "http://127.0.0.1:9", "--from", "soon")[::2])
    assert "--from 'soon'" in line
    line = _one_line_error(*_cli(capsys, "export-table", str(results), "--prometheus", "http://127.0.0.1:9")[::2])
    assert "exactly one" in line
    line = _one_line_error(*_cli(capsys, "export-table")[::2])
    assert "exactly one" in line

    line = _one_line_error(*_cli(capsys, "decide", "-D", "4", "-P", "100", "--model", str(tmp_path / "x.json"))[::2])
    assert "no such file" in line
    (tmp_path / "x.json").write_text('{"schema": "something/else"}')
    line = _one_line_error(*_cli(capsys, "decide", "-D", "4", "-P", "100", "--model", str(tmp_path / "x.json"))[::2])
    assert "expected 'pdexporter.decision/v2'" in line
    vllm = Path(__file__).resolve().parents[2] / "results" / "h200x2-arms" / "decision.json"  # the budget rule: vLLM's
    line = _one_line_error(*_cli(capsys, "decide", "-D", "900", "-P", "100", "-B", "512", "--model", str(vllm))[::2])
    assert "no room" in line
    line = _one_line_error(*_cli(capsys, "decide", "-D", "9000", "-P", "100", "-B", "8192")[::2])
    assert "--decode-batch-size 9000: must be <= 1024" in line  # bounded as measure's
    line = _one_line_error(*_cli(capsys, "decide", "-D", "4", "-P", str(10**30), "-B", "8192")[::2])
    assert "--new-prefill-tokens" in line and "must be <= 10000000" in line


H200_EXPERIMENTS = Path(__file__).resolve().parents[2] / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b" / "experiments"


def test_compare_shows_what_cuda_graphs_did_on_the_h200(capsys, tmp_path):
    """Real records: the launch-bound points without and with CUDA graphs up to 2560 tokens."""
    out = tmp_path / "cmp"
    code, stdout, err = _cli(capsys, "compare", str(H200_EXPERIMENTS / "launch" / "launch"),
                             str(H200_EXPERIMENTS / "graphs"), "--out", str(out))
    assert code == 0, err
    assert stdout.strip().endswith("comparison.csv")
    table = pd.read_csv(out / "comparison.csv")
    assert len(table) == 6 and set(table["chunk_size"]) == {8192}  # the graphs' B=2048 points are not shared
    assert (table["tpot_penalty_ms_change_pct"] < -5).all() and table["tpot_penalty_ms_change_pct"].min() < -60
    summary = json.loads((out / "comparison.json").read_text())
    assert summary["configurations"] == 6 and summary["modelled"] == {"before": False, "after": False}
    assert summary["metrics"]["tpot_penalty_ms"]["min_at"] == [8192, 2, 512]
    assert {p.name for p in (out / "plots").iterdir()} == {
        f"compare_{m}.{ext}" for m in ("tpot_penalty_ms", "prefill_duration_ms") for ext in ("png", "svg")}


def test_compare_errors_are_one_line(capsys, tmp_path, results):
    code, _, err = _cli(capsys, "compare", str(tmp_path / "nowhere"), str(results), "--out", str(tmp_path / "o"))
    assert code != 0 and len(err.strip().splitlines()) == 1 and "nowhere: no such results directory" in err
    code, _, err = _cli(capsys, "compare", str(H200_EXPERIMENTS / "eager" / "d1"), str(H200_EXPERIMENTS / "graphs"),
                        "--out", str(tmp_path / "o"))
    assert code != 0 and len(err.strip().splitlines()) == 1 and "share no" in err
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_report_writes_nothing_into_the_directory_it_reads(capsys, results: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: `report RESULTS_DIR` rewrote RESULTS_DIR/report.html (a committed results
    directory's, on a first look). Without --out it writes results/reports/NAME.html here."""
    monkeypatch.chdir(tmp_path)
    before = sorted(p.relative_to(results) for p in results.rglob("*"))
    code, out, err = _cli(capsys, "report", str(results))
    assert code == 0, err
    written = tmp_path / "results" / "reports" / f"{results.name}.html"
    assert out.strip() == str(Path("results") / "reports" / f"{results.name}.html") and written.stat().st_size > 10_000
    assert sorted(p.relative_to(results) for p in results.rglob("*")) == before
