"""The sweep's speed-ups change no number: fast mode retiring used probe sets by cancelling them
(instead of letting them decode their leftover tokens), the record cache and the cut-down /metrics
parse give the same records as the drain path, on the embedded engine's virtual clock, where the
engine is deterministic: equal to a microsecond, or a millionth of a sum (the window starts at another absolute virtual
time, so float timestamps differ in their last bits; records keep 0.1 us)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.measure.driver import Cancelling
from pdexporter.measure.quantities import tabulated
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.controller import SweepController, SweepReport
from pdexporter.sweep.providers import LauncherProvider, VirtualSimProvider
from pdexporter.sweep.spec import parse_sweep
from tests.no_cancel import NoCancelDriver, NoCancelProvider

pytestmark = pytest.mark.integration

SPEC = {
    "grid": {"chunk_sizes": [2048, 8192], "decode_batch_sizes": [0, 2, 8],
             "new_prefill_tokens": [512, 4096, 16384, 32768]},
    "reps": 3, "mode": "fast", "fast": {"max_context_drift_tokens": 160},
    "launcher": {"kind": "sim", "profile": "h200-qwen3-coder-30b-a3b", "clock": "virtual"},
}


def sweep(root: Path, provider: VirtualSimProvider) -> SweepReport:
    spec = parse_sweep(SPEC)
    return run_virtual(SweepController(spec, ResultsStore(root), provider).run())


def values(root: Path) -> dict[tuple[int, int, int, int], dict[str, object]]:
    out = {}
    for record in ResultsStore(root).iter_records():
        for rep in record.reps:
            blocks = {"baseline": rep.baseline, "interference": rep.interference, "derived": rep.derived}
            out[(*record.key, rep.rep)] = {q.field: getattr(blocks[q.block], q.field) for q in tabulated()}
    return out


def test_cancelling_used_probe_sets_changes_no_number(tmp_path: Path) -> None:
    assert not isinstance(NoCancelDriver(None), Cancelling)  # type: ignore[arg-type]
    before = sweep(tmp_path / "drain", NoCancelProvider("h200-qwen3-coder-30b-a3b"))
    after = sweep(tmp_path / "cancel", VirtualSimProvider("h200-qwen3-coder-30b-a3b"))
    assert before.complete and after.complete
    cancelled = sum(c.probe_sets_cancelled for c in after.chunks.values())
    assert cancelled >= 6 and sum(c.probe_sets_cancelled for c in before.chunks.values()) == 0
    a, b = values(tmp_path / "drain"), values(tmp_path / "cancel")
    assert len(a) == 2 * 3 * 4 * 3 and a.keys() == b.keys()
    # The totals are charged against the probes' own step just before the injection (measure/window.py,
    # "Totals"), and the probes running before an injection are not the same sets when used ones are
    # cancelled: their steps there differ by a few parts per million (432.8517 against 432.8528 ms).
    own_step = {"total_interference_ms", "aggregate_interference_ms"}
    for key in a:
        for name, value in a[key].items():
            if isinstance(value, float):
                rel = 1e-5 if name in own_step else 1e-6
                assert b[key][name] == pytest.approx(value, rel=rel, abs=1e-3), (key, name)
            else:
                assert b[key][name] == value, (key, name)
    # and it was faster: the leftover tokens of every retired set are not waited for
    phase2 = [sum(c.engine_s["phase2"] for c in r.chunks.values()) for r in (before, after)]
    assert phase2[1] < phase2[0]
    print(f"Phase 2 modelled: {phase2[0]:.1f} s draining, {phase2[1]:.1f} s cancelling ({cancelled} sets)")


class NoCancelHttpProvider(LauncherProvider):
    """The local launcher's HTTP drivers behind `NoCancelDriver` (a test double of a driver that
    cannot cancel): fast mode lets used probe sets run out, as before."""

    async def open(self, chunk_size: int):  # type: ignore[no-untyped-def]
        return NoCancelDriver(await super().open(chunk_size))


@pytest.mark.realtime  # run alone (scripts/test.sh)
def test_in_real_time_over_http_the_numbers_agree_within_noise(tmp_path: Path) -> None:
    """The same grid through `pdexporter sim serve` (real time, HTTP), used probe sets drained vs
    cancelled: each configuration's median penalty and prefill duration agree within the noise
    two real-time runs on this shared machine have (10 %)."""
    import asyncio

    from pdexporter.sweep.providers import make_providers
    from tests.helpers import free_port

    medians = []
    for cancel in (False, True):
        port = free_port()
        spec = parse_sweep({
            "grid": {"chunk_sizes": [2048], "decode_batch_sizes": [4], "new_prefill_tokens": [1024, 8192]},
            "reps": 5, "mode": "fast", "fast": {"max_context_drift_tokens": 120}, "cv": {"max_reruns": 0},
            "protocol": {"decode_output_tokens": 96, "steady_last_intervals": 1},
            "launcher": {"kind": "local", "command": "{python} -m pdexporter sim serve --max-num-batched-tokens "
                         "{chunk} --port {port}", "vars": {"port": str(port)}, "url": f"http://127.0.0.1:{port}",
                         "health_timeout_s": 60, "stop_timeout_s": 10},
        })
        store = ResultsStore(tmp_path / ("cancel" if cancel else "drain"))
        (provider,) = make_providers(spec, store)
        if not cancel:
            provider = NoCancelHttpProvider(provider.launcher)  # type: ignore[attr-defined]
        report = asyncio.run(SweepController(spec, store, provider).run())
        assert report.complete, report.message
        assert (report.chunks[2048].probe_sets_cancelled > 0) == cancel
        medians.append({r.key: (r.derived.tpot_penalty_ms, r.interference.prefill_duration_ms)
                        for r in store.iter_records()})
    for key, (penalty, duration) in medians[0].items():
        assert medians[1][key][0] == pytest.approx(penalty, rel=0.10), key
        assert medians[1][key][1] == pytest.approx(duration, rel=0.10), key
