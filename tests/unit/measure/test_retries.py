"""A window whose probes never reach steady state is run again by default, as `measure` and a
sweep file do (`DEFAULT_RETRIES`): on a CPU-starved host the engine's cadence can stay uneven for a
whole probe stream, and CI's 2-core runner once stopped a point on it (`measure_point` alone
defaulted to no retry)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import pdexporter.measure.probesets as probesets
from pdexporter._internal.atomic import read_json_gz
from pdexporter._internal.vloop import run_virtual
from pdexporter.errors import MeasurementError
from pdexporter.measure.point import DEFAULT_RETRIES, PointSpec, measure_point
from pdexporter.measure.protocol import ProtocolSettings, wait_for, warm_prefix
from pdexporter.measure.sim_driver import SimDriver
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.spec import SweepSpec

SETTINGS = ProtocolSettings()


def _unsteady_first(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """`wait_steady` as when the engine is starved: the first `times` probe sets decode to their end
    unsteady and the window fails as the protocol fails it."""
    calls: list[int] = []
    steady = probesets.wait_steady

    async def starved(driver, streams, settings):  # type: ignore[no-untyped-def]
        calls.append(len(streams))
        if len(calls) > times:
            return await steady(driver, streams, settings)
        await wait_for(driver, streams, lambda: all(s.finished for s in streams), 60.0, "probes to end")
        raise MeasurementError("probe streams ended before steady state (test double: a starved engine)")

    monkeypatch.setattr(probesets, "wait_steady", starved)
    return calls


def _measure(tmp_path: Path, **kwargs):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        async with SimDriver.create(chunk_size=8192) as driver:
            await warm_prefix(driver, SETTINGS)
            return await measure_point(driver, PointSpec(8192, 2, 4096), SETTINGS, ResultsStore(tmp_path), reps=2,
                                       **kwargs)

    return run_virtual(main())


def test_an_unsteady_window_is_run_again_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _unsteady_first(monkeypatch, times=DEFAULT_RETRIES)
    record = _measure(tmp_path)
    assert len(calls) == DEFAULT_RETRIES + 2  # repetition 0: the failed windows and the good one; then 1
    assert len(record.reps) == 2 and record.reps[0].interference.num_chunks_actual >= 1
    reruns = [read_json_gz(tmp_path / "8192" / rep.raw).get("retries", 0) for rep in record.reps]  # type: ignore[operator]
    assert reruns == [DEFAULT_RETRIES, 0]  # the record says which repetition was run again


def test_the_last_failure_is_raised_after_the_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _unsteady_first(monkeypatch, times=1)
    with pytest.raises(MeasurementError, match="steady state"):
        _measure(tmp_path, retries=0)
    assert len(calls) == 1


def test_measure_and_a_sweep_file_retry_alike() -> None:
    from pdexporter.cli.measure import measure

    assert inspect.signature(measure_point).parameters["retries"].default == DEFAULT_RETRIES
    assert inspect.signature(measure).parameters["retries"].default == DEFAULT_RETRIES
    assert SweepSpec.model_fields["retries"].default == DEFAULT_RETRIES
