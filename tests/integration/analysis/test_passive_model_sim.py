"""Passive mode's event-fitted model on the embedded engine in virtual time, against the injected
table of the same engine (`predict.grid`, what `pdexporter sim sweep` measures), through the code
paths a user has: the exporter's tracker (`predict.passive`), its records (`passive_live.save_event`,
as `run --passive --out` writes them) and `pdexporter export-table --mode passive --injected`.

The issue's goal is 10 minutes of `pdexporter load --rate 1.5`; its figures over 1 to 30 minutes
are tests/benchmarks/bench_passive_model.py's (10 minutes: 4-6 % over the reached cells). Here a
seeded run of half that asserts the same bound, which the model met from the third minute on in
the benchmark's runs.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from pathlib import Path

import pandas as pd
import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.analysis import passive_model
from pdexporter.analysis.passive_model import Grid, answer
from pdexporter.exporter.passive_live import MODEL_BOOTSTRAP, fit_event, save_event
from pdexporter.load.mix import LoadSpec
from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.measure.store import ResultsStore
from pdexporter.predict.grid import predict_records
from pdexporter.predict.passive import PassiveSession, passive_session
from pdexporter.sim.profile import load_profile
from tests.helpers import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # the module's sessions: tens of seconds of CPU

ROOT = Path(__file__).resolve().parents[3]
PROFILE = "h200-qwen3-coder-30b-a3b"
B, PROBES = 8192, 4
LOAD = LoadSpec(rate=1.5, duration_s=300, seed=1)
GOAL = 0.15


@pytest.fixture(scope="module")
def session() -> PassiveSession:
    return run_virtual(passive_session(PROFILE, B, LOAD, probes=PROBES))


@pytest.fixture(scope="module")
def injected() -> dict:
    records = predict_records(load_profile(PROFILE), Grid((B,)).cells(), reps=2, mode="fast")
    return {k: r for k, r in records.items()}


def _t0(session: PassiveSession) -> float:
    return min(e.run.t_inject_ns for e in session.published)


def test_the_event_model_predicts_the_injected_table_on_the_cells_it_reaches(session, injected) -> None:
    t0 = _t0(session)
    events = [fit_event(e, (e.run.t_inject_ns - t0) / 1e9) for e in session.published]
    events = [e for e in events if e is not None]
    assert len(events) >= 150, session.outcomes
    reference = {k: r.derived.aggregate_interference_ms for k, r in injected.items()}
    # 40 refits per interval, as the live exporter's (MODEL_BOOTSTRAP): what is checked of the intervals is
    # that they hold their estimates and narrow as events come (relative half-width at 1 min -> all: 0.072 -> 0.049
    # at 100 refits, 0.072 -> 0.044 at 50, 0.076 -> 0.047 at 20); errors and reach are point figures, unmoved
    result = answer(events, Grid((B,)), injected=reference, minutes=(1.0, 2.0), bootstrap=MODEL_BOOTSTRAP)
    assert result is not None
    assert result.errors is not None and result.errors.cells >= 15
    assert result.errors.mape <= GOAL, result.errors.by_cell
    # the probes decode beside every prefill: D = 1, 2 are never seen, and say so
    for c in result.cells:
        if c.key[1] in (1, 2):
            assert not c.reached and "below the decodes the engine ran" in (c.why_not or "")
    # the interval narrows as events come (about 1 / sqrt(events))
    widths = [c.halfwidth for c in result.convergence]
    assert widths[0] is not None and widths[-1] is not None and widths[-1] < widths[0], widths
    assert [c.events for c in result.convergence] == sorted(c.events for c in result.convergence)
    # every reached cell's interval holds its own estimate
    for c in result.cells:
        if c.reached:
            assert c.low_ms is not None and c.high_ms is not None and c.low_ms <= c.high_ms


def test_export_table_mode_passive_derives_table_and_verdict_from_the_events(
    session, injected, tmp_path, capsys, monkeypatch
) -> None:
    assert session.info is not None
    store = ResultsStore(tmp_path / "passive")
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    t0 = _t0(session)
    for e in session.published:
        at = start + dt.timedelta(seconds=(e.run.t_inject_ns - t0) / 1e9)
        rep = e.rep.model_copy(update={"started_at": at.isoformat(timespec="seconds")})
        save_event(store, e, rep, session.info, ProtocolSettings())
    inj = ResultsStore(tmp_path / "injected")
    for record in injected.values():
        inj.save_record(record)
    out = tmp_path / "table"
    monkeypatch.chdir(ROOT)
    # The command's intervals on MODEL_BOOTSTRAP refits instead of its 200 (passive_model.BOOTSTRAP; export-table
    # looks `answer` up when it runs): nothing below reads an interval, and the point fit, the table's reach,
    # the errors and the verdict do not depend on the refits (~10 s of CPU of this test's ~20).
    monkeypatch.setattr(passive_model, "answer", functools.partial(passive_model.answer, bootstrap=MODEL_BOOTSTRAP))
    # the command as `python -m pdexporter` runs it (`cli.main`), in this process: pandas, SciPy and
    # matplotlib are not imported again
    code, stdout, stderr = run_cli(capsys, "export-table", str(tmp_path / "passive"), "--mode", "passive",
                                   "--injected", str(tmp_path / "injected"), "--out", str(out), "--no-parquet")
    assert code == 0, stdout + stderr
    said = " ".join((stdout + stderr).split())
    assert "passive event model:" in said and "vs injected" in said and "not reached" in said, said
    table = pd.read_csv(out / "passive_table.csv")
    assert len(table) == len(Grid((B,)).cells())  # every cell of the grid, predicted
    assert table["events"].sum() > 0 and table["reached"].any() and not table["reached"].all()
    assert (table.loc[~table["reached"], "why_not_reached"].str.len() > 0).all()
    decision = json.loads((out / "decision.json").read_text())
    assert decision["mode"] == "passive" and decision["model"]["name"] == "context_aware"
    assert decision["passive"]["events_used"] >= 150
    assert decision["valid_range"]["decode_batch_size"][0] >= 3  # the reached cells only
    model = json.loads((out / "passive_model.json").read_text())
    assert model["summary"]["vs_injected"]["mape"] <= GOAL
    assert [c["minutes"] for c in model["convergence"]][:2] == [1.0, 2.0]
    assert (out / "plots" / "passive_convergence.png").stat().st_size > 1000
