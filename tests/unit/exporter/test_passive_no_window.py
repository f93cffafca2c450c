"""A passive event whose window no probe decoded a token in is not published (`no-window`): it measured nothing.

Seen beside a CPU burner in `tests/integration/exporter/test_passive_live.py` (session 29): an event was published
with every derived number None, and exported as a window. The tracker's own analysis step, fed directly: a test
double of the live run (no engine, no clock), the same `_analyse` the live tracker calls."""

from __future__ import annotations

from pdexporter.exporter.metrics import PASSIVE_OUTCOMES
from pdexporter.exporter.passive import PassiveEvent, PassiveSettings, PassiveTracker, _Pending
from pdexporter.measure.passive import Attribution, SlowRun
from pdexporter.measure.window import BaselineStats


def test_an_event_with_no_probe_token_in_its_window_is_no_window_not_published() -> None:
    tracker = PassiveTracker(PassiveSettings(chunk_size=8192, engine="vllm"))
    run = SlowRun(start_ns=1e9, end_ns=1.06e9, steps_ms=(60.0,), slow_steps=1, steps_after=2)
    quiet = BaselineStats(p50_ms=6.5, p90_ms=7.0, p99_ms=8.0, mean_ms=6.6, mad_ms=0.2, n_intervals=100)
    pending = _Pending(run, 1.1e9, 6.5, traces=[], open_probes=8, _baseline=quiet, _pooled=True)
    event = tracker._analyse(pending, PassiveEvent(run, "pending"), Attribution("otlp", 4899, 1, ("r1",)), 2e9)
    assert event.rep is not None and event.rep.derived.tpot_penalty_ms is None
    assert event.outcome == "no-window" and not event.published
    assert "no-window" in PASSIVE_OUTCOMES  # counted under its own label
