"""In fast mode a pooled probe's counted pre-injection intervals (the totals' reference,
`tpot_pre_injection_p50_ms`) follow the window before on the same streams. Two ways they once read
another prefill's chunk steps, on the embedded engine's virtual clock, where the chunk steps of a
32K-token prompt at B = 2048 are 16 slow intervals:

- the unrecorded mixed warm-up ran its windows with one recovery interval, so the first recorded
  window of each D read the last warm-up window's chunk steps (the H200 grids of GPU sessions 11-14:
  2.4-9.9 x the decode step in that repetition);
- with fewer recovery intervals than `inject_at_tokens` (GPU session 14's grid ran 16) the next
  window's 32 counted pre-injection intervals reached back into the window before (up to 47 % of
  them on the H200).

Now the warm-up's last window waits for its recovery, and each trace is cut at the window before's
end (`PooledProbes.traces`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.measure.protocol import StreamTrace
from pdexporter.measure.store import ResultsStore
from pdexporter.measure.window import WindowParams
from pdexporter.sweep.controller import SweepController
from pdexporter.sweep.providers import VirtualSimProvider
from pdexporter.sweep.spec import parse_sweep

pytestmark = pytest.mark.integration

PROFILE = "h200-qwen3-coder-30b-a3b"
SPEC = {
    # P ascending, as the grid runs (and warms) them: the last warm-up window is the longest prompt,
    # its 16 chunk steps just before the first recorded window
    "grid": {"chunk_sizes": [2048], "decode_batch_sizes": [4, 8], "new_prefill_tokens": [512, 32768]},
    "reps": 2, "mode": "fast",
    "warmup": {"prefix": True, "shapes": False, "mixed": True},
    "launcher": {"kind": "sim", "profile": PROFILE, "clock": "virtual"},
}


def sweep(root: Path, after: int) -> ResultsStore:
    spec = parse_sweep({**SPEC, "protocol": {"after_intervals": after}})
    assert run_virtual(SweepController(spec, ResultsStore(root), VirtualSimProvider(PROFILE)).run()).complete
    return ResultsStore(root)


@pytest.mark.parametrize("after", [32, 16, 8])
def test_every_recorded_window_reads_decode_steps_before_its_injection(tmp_path: Path, after: int) -> None:
    store = sweep(tmp_path, after)
    ratios, counted, longest = {}, [], {}
    for record in store.iter_records():
        for rep in record.reps:
            step = rep.baseline.tpot_p50_ms
            ratios[(*record.key, rep.rep)] = rep.interference.tpot_pre_injection_p50_ms / step
            raw = store.load_raw(store.chunk_dir(record.key[0]) / rep.raw)
            for probe in raw["probes"]:
                times = StreamTrace.from_raw(probe).token_times()
                pre = times[16:][times[16:] <= raw["t_inject_ns"]]  # past the 16 a probe discards
                counted.append(pre.size - 1)
                longest[(*record.key, rep.rep)] = max(longest.get((*record.key, rep.rep), 0.0),
                                                      float(np.diff(pre).max()) / 1e6 / step)
    assert len(ratios) == 2 * 2 * 2
    # the decode step (Phase 1's p50 and the probes' cadence agree within a few %), never a chunk step
    # of a 32K prompt (~15 x the step at B = 2048 on this profile)
    assert max(ratios.values()) < 1.1, ratios
    # not one of them: no counted pre-injection interval is a chunk step (the median above would
    # shrug off up to half of them)
    assert max(longest.values()) < 2.0, longest
    # and as many of them as a fresh probe has (the seed's: injected at token ~32, the first 16
    # discarded), or with fewer recovery intervals than that (sweeps/h200.yaml runs 8) those intervals
    # and the steady check's turn: never fewer than the totals' own reference needs
    # (WindowParams.loss_reference_min: 8), else it would fall back to Phase 1's step
    assert min(counted) >= min(15, after + 1) >= WindowParams().loss_reference_min, counted


@pytest.mark.parametrize("after", [16, 8])
def test_fewer_recovery_intervals_change_no_number_beyond_a_percent(tmp_path: Path, after: int) -> None:
    a, b = sweep(tmp_path / "32", 32), sweep(tmp_path / str(after), after)
    for record in a.iter_records():
        other = b.load_record(*record.key)
        assert other is not None
        for name in ("aggregate_interference_ms", "tpot_penalty_ms"):
            x, y = getattr(record.derived, name), getattr(other.derived, name)
            assert y == pytest.approx(x, rel=0.01), (record.key, name, x, y)
