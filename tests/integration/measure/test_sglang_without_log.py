"""SGLang's numbers do not depend on reading its step log: a sweep of the embedded engine imitating
SGLang, in both scheduling modes, analysed again as an SGLang someone else runs gives it (no log:
the chunk steps from the adapter's schedule, as the decodes see them, confirmed by the cadence),
gives the penalty the log gives, repetition by repetition. The same check runs on the committed H200
results (tests/unit/measure/test_h200_without_log.py), real SGLang ones included."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.controller import SweepController
from pdexporter.sweep.providers import make_provider
from pdexporter.sweep.reanalyse import compare_sources
from pdexporter.sweep.spec import parse_sweep

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("engine", ["sglang", "sglang-mixed"])
def test_penalties_without_the_sglang_log_equal_those_with_it(tmp_path: Path, engine: str) -> None:
    spec = parse_sweep(
        {
            "grid": {
                "chunk_sizes": [2048, 8192],
                "decode_batch_sizes": [0, 1, 8],
                "new_prefill_tokens": [512, 4096, 32768],
            },
            "reps": 2,
            "mode": "fast",
            "warmup": {"mixed": True},
            "launcher": {"kind": "sim", "clock": "virtual", "engine": engine},
        }
    )
    store = ResultsStore(tmp_path)
    report = run_virtual(SweepController(spec, store, make_provider(spec, store)).run())
    assert report.complete
    records = list(store.iter_records())
    assert {r.config.engine for r in records} == {f"pdexporter-sim-{engine}"} and all(
        r.config.modelled for r in records
    )
    rows = compare_sources(store, records, ProtocolSettings())
    assert len(rows) == 2 * 2 * 3  # D >= 1
    for row in rows:
        assert row.penalty_log_ms is not None and row.penalty_cadence_ms == pytest.approx(
            row.penalty_log_ms
        ), row
        assert row.reps_same_steps == row.reps, row
    paused = engine == "sglang"
    for record in records:
        if record.config.decode_batch_size == 0:
            continue
        i = record.reps[-1].interference
        chunks = i.chunk_tokens_engine_log or []
        assert sum(chunks) == record.config.new_prefill_tokens and i.num_chunks_source == "engine-log"
        # the default mode's decodes see one stall however many chunks; mixed ones one step per chunk
        assert i.num_chunks_actual == (1 if paused else len(chunks)) == i.num_chunks_expected, record.key
