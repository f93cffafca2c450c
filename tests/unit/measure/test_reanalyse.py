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
