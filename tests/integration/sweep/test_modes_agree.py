"""Fast and faithful modes agree on the embedded engine (virtual clock): same records, penalties
within 5%, while fast mode reuses its probe streams across injections and models far less
engine time."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.controller import SweepController, SweepReport
from pdexporter.sweep.providers import make_provider
from pdexporter.sweep.spec import parse_sweep

pytestmark = pytest.mark.integration

GRID = {"chunk_sizes": [2048, 8192], "decode_batch_sizes": [0, 4, 12], "new_prefill_tokens": [1024, 8192, 32768]}


def sweep(root: Path, mode: str) -> SweepReport:
    spec = parse_sweep({"grid": GRID, "reps": 3, "mode": mode,
                        "launcher": {"kind": "sim", "profile": "h200-qwen3-coder-30b-a3b", "clock": "virtual"}})
    store = ResultsStore(root)
    return run_virtual(SweepController(spec, store, make_provider(spec, store)).run())


def test_fast_and_faithful_agree_within_5_percent(tmp_path: Path) -> None:
    faithful = sweep(tmp_path / "faithful", "faithful")
    fast = sweep(tmp_path / "fast", "fast")
    assert faithful.complete and fast.complete
    a = {r.key: r for r in ResultsStore(tmp_path / "faithful").iter_records()}
    b = {r.key: r for r in ResultsStore(tmp_path / "fast").iter_records()}
    assert a.keys() == b.keys() and len(a) == 18
    for key, ra in a.items():
        rb = b[key]
        assert ra.config.mode == "faithful" and rb.config.mode == "fast"
        assert ra.config.modelled and rb.config.modelled
        assert set(ra.model_dump()) == set(rb.model_dump())  # the same record shape
        assert rb.interference.num_chunks_actual == ra.interference.num_chunks_actual
        assert rb.interference.prefill_duration_ms == pytest.approx(ra.interference.prefill_duration_ms, rel=0.05)
        if key[1] > 0:
            assert rb.derived.tpot_penalty_ms == pytest.approx(ra.derived.tpot_penalty_ms, rel=0.05), key
            assert rb.derived.total_interference_ms == pytest.approx(ra.derived.total_interference_ms, rel=0.05), key
    # Fast mode really reused probes: 3 P x 3 reps = 9 injections per (chunk, D > 0).
    for report in fast.chunks.values():
        assert report.probe_sets <= 4  # one set per D > 0 here; up to 2 allowed for drift
    # ... and models much less engine time (no idle waits, no 256-token streams per rep).
    assert fast.engine_s < 0.5 * faithful.engine_s
