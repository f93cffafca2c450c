"""Rebuilding a record from its raw timestamps gives what the live run computed."""

from __future__ import annotations

import json
from pathlib import Path

from pdexporter._internal.vloop import run_virtual
from pdexporter.measure.point import PointSpec, measure_point
from pdexporter.measure.protocol import ProtocolSettings, warm_prefix
from pdexporter.measure.records import aggregate
from pdexporter.measure.sim_driver import SimDriver
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.reanalyse import reanalyse_record

SETTINGS = ProtocolSettings()


def test_reanalysis_reproduces_the_live_record(tmp_path: Path) -> None:
    async def main():
        async with SimDriver.create(chunk_size=2048) as driver:
            await warm_prefix(driver, SETTINGS)
            return await measure_point(driver, PointSpec(2048, 4, 8192), SETTINGS, ResultsStore(tmp_path), reps=2)

    live = run_virtual(main())
    store = ResultsStore(tmp_path)
    again = reanalyse_record(store, store.load_record(2048, 4, 8192), SETTINGS, lambda c, reps, _: aggregate(c, reps))
    assert again.reps == 2 and again.changed == 0
    for old, new in zip(live.reps, again.record.reps):
        assert new.interference == old.interference and new.derived == old.derived


def test_reanalyse_cli_rewrites_records_in_place(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pdexporter.cli import app

    async def main():
        async with SimDriver.create(chunk_size=8192) as driver:
            await warm_prefix(driver, SETTINGS)
            return await measure_point(driver, PointSpec(8192, 2, 4096), SETTINGS, ResultsStore(tmp_path), reps=1)

    run_virtual(main())
    path = tmp_path / "8192" / "D2_P4096.json"
    record = json.loads(path.read_text())
    record["derived"]["tpot_penalty_p50_ms"] = -1.0  # a stale number
    record["reps"][0]["derived"]["tpot_penalty_p50_ms"] = -1.0
    path.write_text(json.dumps(record))
    result = CliRunner().invoke(app, ["reanalyse", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "1 records, 1 repetitions: 1 changed" in result.output
    assert json.loads(path.read_text())["derived"]["tpot_penalty_p50_ms"] > 0
    # again: nothing moved, so the file is left byte for byte (its provenance included)
    before = path.read_bytes()
    again = CliRunner().invoke(app, ["reanalyse", str(tmp_path)])
    assert again.exit_code == 0, again.output
    assert "0 changed; 0 record files rewritten" in " ".join(again.output.split())
    assert path.read_bytes() == before


def test_reanalyse_cli_keeps_passive_records_as_measured(tmp_path: Path) -> None:
    """A `run --passive` record (the H200's) has no Phase 1 file: its events' baselines are their
    quiet periods. `reanalyse` (and so scripts/results.sh) failed on it; it keeps it, and says so."""
    import shutil

    from typer.testing import CliRunner

    from pdexporter.cli import app

    committed = Path(__file__).parents[3] / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-passive" / "passive"
    record = committed / "8192" / "D4_P4096.json"
    (tmp_path / "8192" / "raw").mkdir(parents=True)
    shutil.copy(record, tmp_path / "8192" / record.name)
    for rep in json.loads(record.read_text())["reps"]:
        shutil.copy(committed / "8192" / rep["raw"], tmp_path / "8192" / rep["raw"])
    result = CliRunner().invoke(app, ["reanalyse", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "1 passive record(s) (run --passive) kept as measured" in " ".join(result.output.split())
    assert (tmp_path / "8192" / record.name).read_bytes() == record.read_bytes()


def test_compare_sources_reads_each_raw_file_once_and_gives_what_two_plain_reads_gave() -> None:
    """Both analyses of a record (with and without the engine log) share its raw files: the rows are
    those of a store read twice, and no file is read twice."""
    from collections import Counter

    from pdexporter.measure.store import load_record_file
    from pdexporter.sweep.reanalyse import compare_sources

    class Counting(ResultsStore):
        def load_raw(self, path: Path):  # type: ignore[no-untyped-def]
            self.reads[path] += 1
            return super().load_raw(path)

    results = Path(__file__).resolve().parents[3] / "results" / "h200-sglang0.5.15-qwen3-coder-30b-a3b"
    store = Counting(results)
    store.reads = Counter()
    records = [load_record_file(p) for p in store.iter_record_paths()]
    rows = compare_sources(store, records, SETTINGS)
    assert len(rows) >= 10 and store.reads and max(store.reads.values()) == 1
    twice = [
        (reanalyse_record(store, r, SETTINGS).record, reanalyse_record(store, r, SETTINGS, use_engine_log=False).record)
        for r in records if r.config.decode_batch_size > 0
    ]
    assert [(row.penalty_log_ms, row.penalty_cadence_ms, row.cv_log, row.cv_cadence) for row in rows] == [
        (a.derived.tpot_penalty_ms, b.derived.tpot_penalty_ms, a.summary.cv_tpot_penalty if a.summary else None,
         b.summary.cv_tpot_penalty if b.summary else None) for a, b in twice]


def test_reanalyse_keeps_a_finished_sweeps_flag(tmp_path: Path) -> None:
    """The dense H200 run (`max_reruns: 0`) flagged B=8192 D=1 P=512 (CV 50.6 % after its one
    attempt); reanalysis knows the attempts, not the sweep's re-run budget, and once read the
    record as "a re-run to come" and cleared the flag."""
    import shutil

    from pdexporter.sweep.reanalyse import reanalyse_directory

    src = Path(__file__).resolve().parents[3] / "results" / "h200-vllm0.22-llama-3.1-8b-instruct" / "8192"
    dst = tmp_path / "8192"
    (dst / "raw").mkdir(parents=True)
    shutil.copy(src / "D1_P512.json", dst)
    for raw in (src / "raw").glob("D1_*"):
        shutil.copy(raw, dst / "raw")
    assert json.loads((dst / "D1_P512.json").read_text())["summary"]["flagged"] is True
    reanalyse_directory(tmp_path).run(lambda: None)
    summary = json.loads((dst / "D1_P512.json").read_text())["summary"]
    assert summary["flagged"] is True and summary["cv_by_attempt"][-1] > 0.15
