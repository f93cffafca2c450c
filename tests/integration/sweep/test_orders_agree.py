"""Interleaving changes when a repetition runs, not what it measures: on the embedded engine's
virtual clock (no host drift to spread) an interleaved fast sweep gives the blocked sweep's
numbers, within 1 %, at the cost of a few more probe sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.controller import SweepController
from pdexporter.sweep.providers import make_providers
from pdexporter.sweep.spec import parse_sweep

pytestmark = pytest.mark.integration


def test_interleaved_and_blocked_agree(tmp_path: Path) -> None:
    records, sets = {}, {}
    for kind in ("blocked", "interleaved"):
        spec = parse_sweep({
            "grid": {"chunk_sizes": [2048, 8192], "decode_batch_sizes": [0, 1, 4, 12],
                     "new_prefill_tokens": [512, 4096, 32768]},
            "reps": 3, "mode": "fast", "order": {"kind": kind, "seed": 5},
            "launcher": {"kind": "sim", "clock": "virtual"},
        })
        store = ResultsStore(tmp_path / kind)
        report = run_virtual(SweepController(spec, store, make_providers(spec, store)).run())
        assert report.complete
        records[kind] = {r.key: r for r in store.iter_records()}
        sets[kind] = sum(c.probe_sets for c in report.chunks.values())
    a, b = records["blocked"], records["interleaved"]
    assert a.keys() == b.keys() and len(a) == 24
    for key in a:
        assert b[key].interference.prefill_duration_ms == pytest.approx(a[key].interference.prefill_duration_ms,
                                                                         rel=0.01), key
        if key[1]:
            assert b[key].derived.tpot_penalty_ms == pytest.approx(a[key].derived.tpot_penalty_ms, rel=0.01), key
    # one probe set per D and block: more sets than blocked, far fewer than repetitions
    assert sets["blocked"] < sets["interleaved"] <= 2 * 3 * 3
