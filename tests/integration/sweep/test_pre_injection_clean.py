"""In fast mode a pooled probe's counted pre-injection intervals (the totals' reference,
`tpot_pre_injection_p50_ms`) are the window before's recovery intervals. Two ways they once read
another prefill's chunk steps, on the embedded engine's virtual clock, where the chunk steps of a
32K-token prompt at B = 2048 are 16 slow intervals:

- the unrecorded mixed warm-up ran its windows with one recovery interval, so the first recorded
  window of each D read the last warm-up window's chunk steps (the H200 grids of GPU sessions 11-14:
  2.4-9.9 x the decode step in that repetition);
- a grid run with fewer recovery intervals than `inject_at_tokens` (GPU session 14 ran 16) reads the
  window before's; a fast sweep now refuses it, in one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.errors import ConfigError
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.controller import SweepController
from pdexporter.sweep.providers import VirtualSimProvider
from pdexporter.sweep.spec import parse_sweep

pytestmark = pytest.mark.integration

PROFILE = "h200-qwen3-coder-30b-a3b"
SPEC = {
    # 32768 before 512 in the warm-up's order is what the grid does (P ascending, the warm-up too):
    # the last warm-up window is the longest prompt, its 16 chunk steps just before the first record
    "grid": {"chunk_sizes": [2048], "decode_batch_sizes": [4, 8], "new_prefill_tokens": [512, 32768]},
    "reps": 2, "mode": "fast",
    "warmup": {"prefix": True, "shapes": False, "mixed": True},
    "launcher": {"kind": "sim", "profile": PROFILE, "clock": "virtual"},
}


def test_every_recorded_window_reads_decode_steps_before_its_injection(tmp_path: Path) -> None:
    report = run_virtual(SweepController(parse_sweep(SPEC), ResultsStore(tmp_path), VirtualSimProvider(PROFILE)).run())
    assert report.complete
    ratios = {}
    for record in ResultsStore(tmp_path).iter_records():
        for rep in record.reps:
            step = rep.baseline.tpot_p50_ms
            ratios[(*record.key, rep.rep)] = rep.interference.tpot_pre_injection_p50_ms / step
    assert len(ratios) == 2 * 2 * 2
    # the decode step itself (Phase 1's p50 and the probes' cadence agree within a few %), never a
    # chunk step of a 32K prompt (~15 x the step at B = 2048 on this profile)
    assert max(ratios.values()) < 1.1, ratios


def test_a_fast_sweep_refuses_fewer_recovery_intervals_than_the_pre_injection_ones() -> None:
    spec = {**SPEC, "protocol": {"after_intervals": 16}}
    with pytest.raises((ConfigError, ValueError)) as info:
        parse_sweep(spec)
    assert "protocol.after_intervals: 16 is below inject_at_tokens 32" in str(info.value)
    assert parse_sweep({**spec, "mode": "faithful"}).protocol.after_intervals == 16  # fresh probes each window
