"""Rebuilding a record from its raw timestamps gives what the live run computed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


PASSIVE_S18 = Path(__file__).parents[3] / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-passive-s18" / "passive"


def _copy_record(src_store: Path, dest_store: Path, name: str) -> Path:
    import shutil

    record = src_store / "8192" / name
    (dest_store / "8192" / "raw").mkdir(parents=True)
    shutil.copy(record, dest_store / "8192" / name)
    for rep in json.loads(record.read_text())["reps"]:
        shutil.copy(src_store / "8192" / rep["raw"], dest_store / "8192" / rep["raw"])
    return dest_store / "8192" / name


def test_reanalyse_cli_rederives_passive_records_from_their_raw_timestamps(tmp_path: Path) -> None:
    """A `run --passive` record (session 18's, H200) has no Phase 1 file: each event's baseline is its
    quiet period, kept in the record with the slow-step threshold its window used. `reanalyse`
    rebuilds the events' windows from that and the raw timestamps, its joint events' too (`joint/`):
    a stale number is put right, what the exporter computed live comes back (to the baseline's
    recorded precision), and a second pass rewrites nothing."""
    from typer.testing import CliRunner

    from pdexporter.cli import app

    published = _copy_record(PASSIVE_S18, tmp_path, "D12_P1024.json")
    joint = _copy_record(PASSIVE_S18 / "joint", tmp_path / "joint", "D12_P2048.json")
    live = {path: json.loads(path.read_text()) for path in (published, joint)}
    stale = json.loads(published.read_text())
    stale["reps"][0]["derived"]["total_interference_ms"] = -1.0
    stale["derived"]["total_interference_ms"] = -1.0
    published.write_text(json.dumps(stale))
    other = json.loads(joint.read_text())  # an event whose window used other settings: no threshold of these
    rep = other["reps"][-1]
    rep["interference"]["slow_step_threshold_ms"] = round(rep["baseline"]["tpot_p50_ms"] * 1.05, 4)
    rep["derived"]["total_interference_ms"] = -2.0
    joint.write_text(json.dumps(other))
    live[joint]["reps"][-1] = rep
    result = CliRunner().invoke(app, ["reanalyse", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    events = sum(len(r["reps"]) for r in live.values())
    assert f"2 records (2 of them run --passive events), {events} repetitions" in out
    assert "1 passive event(s) kept as measured" in out
    assert json.loads(joint.read_text())["reps"][-1]["derived"]["total_interference_ms"] == -2.0
    for path, before in live.items():
        after = json.loads(path.read_text())
        for old, new in zip(before["reps"], after["reps"]):
            for key in ("total_interference_ms", "aggregate_interference_ms", "tpot_penalty_ms"):
                assert abs(new["derived"][key] - old["derived"][key]) < 2e-3, (path.name, key)
            assert new["interference"]["slow_step_threshold_ms"] == old["interference"]["slow_step_threshold_ms"]
            assert new["passive"] == old["passive"] and new["baseline"] == old["baseline"]
    again = CliRunner().invoke(app, ["reanalyse", str(tmp_path)])
    assert "0 changed; 0 record files rewritten" in " ".join(again.output.split())


def test_baseline_from_a_record_gives_back_its_slow_threshold() -> None:
    """The MAD a record does not keep is backed out of the threshold it set; where the relative
    floor set the threshold the MAD is 0 and the threshold is the same."""
    from pdexporter.measure.window import BaselineStats, WindowParams

    params = WindowParams()
    for mad in (0.0, 0.05, 0.2, 0.35, 1.7):
        stats = BaselineStats(5.2, 5.9, 7.1, 5.4, mad, 400)
        theta = stats.slow_threshold_ms(params)
        back = BaselineStats.from_record(5.2, 5.9, 7.1, 5.4, 400, theta, params)
        assert abs(back.slow_threshold_ms(params) - theta) < 1e-9
        assert (back.mad_ms == 0.0) == (params.slow_mad_k * 1.4826 * mad <= params.slow_rel * 5.2)


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


def test_recorded_log_side_is_the_records_and_a_record_the_maths_would_not_give_is_named() -> None:
    """`compare_sources(logged="recorded")` reads the with-log side off the records (what the H200
    comparison uses: they were derived with the log), and `records_are_the_log_analysis` names a
    record whose numbers the window maths would not give again (here one edited by hand)."""
    from pdexporter.measure.store import load_record_file
    from pdexporter.sweep.reanalyse import compare_sources, records_are_the_log_analysis

    results = Path(__file__).resolve().parents[3] / "results" / "h200-sglang0.5.15-qwen3-coder-30b-a3b"
    store = ResultsStore(results)
    records = [r for r in map(load_record_file, store.iter_record_paths()) if r.config.decode_batch_size > 0]
    assert records_are_the_log_analysis(store, records[:2], SETTINGS) == []
    derived = records[0].derived.model_copy(update={"tpot_penalty_ms": (records[0].derived.tpot_penalty_ms or 0) + 7})
    edited = records[0].model_copy(update={"derived": derived})
    assert records_are_the_log_analysis(store, [edited, records[1]], SETTINGS) == [f"{edited.key}: derived"]
    rows = compare_sources(store, [edited, records[1]], SETTINGS, logged="recorded")
    assert rows[0].penalty_log_ms == derived.tpot_penalty_ms  # as recorded, not derived again
    assert rows == compare_sources(store, [edited, records[1]], SETTINGS, logged="recorded")
    assert rows[1] == compare_sources(store, [records[1]], SETTINGS)[0]
    with pytest.raises(ValueError, match="logged='log'"):
        compare_sources(store, records[:1], SETTINGS, logged="log")


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


def test_reanalyse_directory_takes_the_window_settings_of_the_sweep_that_wrote_it(tmp_path: Path) -> None:
    """A sweep whose windows skip 4 warm-up tokens, not the seed's 16: re-derived with its own
    `sweep.json` protocol nothing moves; with the defaults (no sweep.json) both repetitions would."""
    from pdexporter.errors import ConfigError
    from pdexporter.sweep.reanalyse import reanalyse_directory

    settings = ProtocolSettings(warmup_tokens=4)

    async def main():
        async with SimDriver.create(chunk_size=2048) as driver:
            await warm_prefix(driver, settings)
            return await measure_point(driver, PointSpec(2048, 4, 8192), settings, ResultsStore(tmp_path), reps=2)

    run_virtual(main())
    assert reanalyse_directory(tmp_path, dry_run=True).run(lambda: None)[0].endswith("2 would change")
    state = tmp_path / "sweep.json"
    state.write_text(json.dumps({"spec": {"protocol": settings.model_dump()}, "invocations": []}))
    job = reanalyse_directory(tmp_path, dry_run=True)
    assert job.settings.warmup_tokens == 4
    assert job.run(lambda: None)[0].endswith("0 would change")
    state.write_text(json.dumps({"spec": {"protocol": {"warmup_tokens": -3}}}))
    with pytest.raises(ConfigError) as bad:
        reanalyse_directory(tmp_path)
    assert str(bad.value).startswith(f"{state}: spec.protocol.warmup_tokens: ") and "\n" not in str(bad.value)


def test_reanalyse_directory_takes_the_window_settings_a_measure_kept(tmp_path: Path) -> None:
    """A `measure` / `run` output has no sweep.json: its `window.json` is what it is re-derived with, so a
    later change of the defaults leaves it as measured (here windows of 4 warm-up tokens, not 16)."""
    from pdexporter.errors import ConfigError
    from pdexporter.sweep.reanalyse import reanalyse_directory

    settings = ProtocolSettings(warmup_tokens=4)
    store = ResultsStore(tmp_path)

    async def main():
        async with SimDriver.create(chunk_size=2048) as driver:
            await warm_prefix(driver, settings)
            return await measure_point(driver, PointSpec(2048, 4, 8192), settings, store, reps=2)

    run_virtual(main())
    assert reanalyse_directory(tmp_path, dry_run=True).run(lambda: None)[0].endswith("2 would change")
    path = store.save_window(settings.window_fields())
    job = reanalyse_directory(tmp_path, dry_run=True)
    assert job.settings.warmup_tokens == 4 and job.settings.window_fields() == settings.window_fields()
    assert job.run(lambda: None)[0].endswith("0 would change")
    path.write_text(json.dumps({"window": {"warmup_tokens": -3}}))
    with pytest.raises(ConfigError) as bad:
        reanalyse_directory(tmp_path)
    assert str(bad.value).startswith(f"{path}: window.warmup_tokens: ") and "\n" not in str(bad.value)
