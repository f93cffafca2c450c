"""The live exporter's bookkeeping over continuous probe streams. Pure: data in, data out.

`measure` runs Phase 1 and Phase 2 on fresh streams; the exporter's probes never stop, so it needs
three extra rules, all built on `measure.window` (nothing here re-derives a window number):

Baseline rule. The baseline of a window is the pool of probe intervals (each stream's first
`warmup_tokens` tokens discarded, exactly as in Phase 1) that *end* inside the quiet period
`(max(t_decide - baseline_span, recovery end of the previous window), t_decide]`, where t_decide
is the moment the runner decided to inject (just before the body leaves). Intervals of streams
that already finished count too. Its statistics are `window.baseline_from_lengths` of that pool.

Phase labels. Every probe interval after warm-up is exported to the TPOT histogram once, with
the label the window maths gives it: `prefill_window` is every interval of the window
(`window.stream_phases(...).window`: from the injection to the prefill's first token, so the
engine's admission and retirement stalls and decode-only steps count, not only the chunk steps
that the record's `tpot_during_prefill_*` and the `..._during_prefill` gauges keep), `after_prefill`
is `.after`; everything else is `baseline`.
Intervals of a stream that started after the injection are labelled with the same classifier
when the window is analysed; their later intervals are `baseline`.

Injection readiness. A prefill goes in only when every probe is in the seed's steady state
(>= inject_at tokens, last 8 intervals within 2x: `protocol.steady`), still has `reserve`
tokens to decode (so no probe ends inside the window and gets restarted there), and the quiet
period holds at least `min_baseline_intervals` intervals.

Probes in phase. Those conditions hold for all N probes at once only while their cycles line up.
Restarting a probe costs the engine a stall (vLLM's admission and retirement of a 4096-token
prompt: ~13 ms and ~5 ms on the H200, modelled by the embedded engine), so a probe restarted
a step apart from the others stalls them just before their own ends, they end later, and the
next cycle they stall it: the split grows every cycle (measured: 12 probes sent within 0.1 ms
ended 66 ms apart after one cycle, 150 ms after four), until the probes' 256-token cycles cover
every phase and no moment has all of them steady with room for a window: windows stop (issue
13's soak, faster under CPU contention, where restarts straddle a step more often). So a probe
that ends waits (a few steps at most) for the others that are about to end, and they restart
together; one that ends while the others are far from their end (it failed and was restarted,
say) restarts with the tokens that make it end with them (`aligned_max_tokens`). A split closes
at the next cycle instead of growing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pdexporter.client.stream import TokenStream
from pdexporter.measure.protocol import ProtocolSettings, steady
from pdexporter.measure.window import (
    BaselineStats,
    StreamPhases,
    WindowParams,
    baseline_from_lengths,
    intervals,
)

__all__ = [
    "Readiness", "aligned_max_tokens", "phase_labels", "quiet_baseline", "quiet_intervals_ns", "ready_to_inject",
    "recovered", "recovery_end_ns", "step_spreads_ns",
]

BASELINE, WINDOW, AFTER = "baseline", "prefill_window", "after_prefill"


def quiet_intervals_ns(
    streams: Iterable[np.ndarray], start_ns: float, end_ns: float, params: WindowParams
) -> np.ndarray:
    """Lengths (ns) of post-warm-up intervals ending in (start_ns, end_ns], pooled over streams."""
    pooled = []
    for times in streams:
        iv = intervals(times, params.warmup_tokens)
        keep = (iv.end_ns > start_ns) & (iv.end_ns <= end_ns)
        if keep.any():
            pooled.append(iv.length_ns[keep])
    return np.concatenate(pooled) if pooled else np.empty(0)


def quiet_baseline(
    streams: Iterable[np.ndarray],
    t_decide_ns: int,
    quiet_from_ns: float,
    span_ns: float,
    params: WindowParams,
) -> tuple[BaselineStats | None, float]:
    """The baseline rule (module docs). Returns the stats and the start of the period used."""
    start = max(t_decide_ns - span_ns, quiet_from_ns)
    return baseline_from_lengths(quiet_intervals_ns(streams, start, t_decide_ns, params)), start


def phase_labels(phases: StreamPhases) -> np.ndarray:
    """One label per post-warm-up interval of the stream (same order as `phases.intervals`)."""
    labels = np.full(phases.intervals.length_ns.shape, BASELINE, dtype=object)
    labels[phases.window] = WINDOW
    labels[phases.after] = AFTER
    return labels


def recovery_end_ns(phases: Sequence[StreamPhases], window_end: float) -> float:
    """When the last stream's last `after_prefill` interval ended (the next quiet period starts there)."""
    ends = [float(p.intervals.end_ns[p.after].max()) for p in phases if p.after.any()]
    return max([window_end, *ends])


def recovered(times: np.ndarray, window_end: float, after_intervals: int) -> bool:
    """True once this stream has `after_intervals` token times past the window."""
    return int(np.count_nonzero(times > window_end)) >= after_intervals


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str


def ready_to_inject(
    probes: Sequence[TokenStream],
    expected_probes: int,
    settings: ProtocolSettings,
    reserve_tokens: int,
    baseline_intervals: int | None = None,
    min_baseline_intervals: int = 0,
) -> Readiness:
    """The injection-readiness rule (module docs), with the reason when not ready.
    `baseline_intervals=None` checks the streams only."""
    open_probes = [p for p in probes if not p.done]
    if len(open_probes) < expected_probes:
        return Readiness(False, f"{len(open_probes)}/{expected_probes} probe streams open")
    if not steady(open_probes, settings):
        return Readiness(False, "probe streams not in steady state")
    short = [p for p in open_probes
             if (p.tokens_left if p.tokens_left is not None else settings.decode_output_tokens - p.n_tokens)
             < reserve_tokens]
    if short:
        return Readiness(False, f"{len(short)} probe stream(s) have fewer than {reserve_tokens} tokens left")
    if baseline_intervals is not None and baseline_intervals < min_baseline_intervals:
        return Readiness(False, f"{baseline_intervals}/{min_baseline_intervals} quiet baseline intervals")
    return Readiness(True, "ready")


def step_spreads_ns(streams: Sequence[np.ndarray], step_ns: float, min_streams: int | None = None) -> np.ndarray:
    """Timestamp jitter across streams: for each engine step, last minus first arrival.

    Every running decode gets its token from the same engine step, so arrivals cluster; a new
    cluster starts where consecutive arrivals (all streams merged) are more than half a step
    apart. Clusters with fewer than `min_streams` arrivals (stream starts and ends) are dropped.
    """
    if not streams:
        return np.empty(0)
    merged = np.sort(np.concatenate([np.asarray(s, dtype=np.float64) for s in streams]))
    if merged.size < 2:
        return np.empty(0)
    breaks = np.nonzero(np.diff(merged) > step_ns / 2)[0] + 1
    groups = np.split(merged, breaks)
    need = len(streams) if min_streams is None else min_streams
    return np.asarray([g[-1] - g[0] for g in groups if g.size >= need], dtype=np.float64)


def aligned_max_tokens(full: int, others_left: Iterable[int | None], min_tokens: int) -> int | None:
    """max_tokens of a probe (re)starting now, so that it ends with the others (module docs,
    "Probes in phase"), or None: wait, the others end within `min_tokens` tokens, and all restart
    together (the same admission step, so the same start and the same end). Others with more
    left than that: end with the one that has the most left (it is a restarted one, or the
    others are far behind); none open: a full cycle."""
    left = [n for n in others_left if n is not None and n > 0]
    if not left:
        return full
    if max(left) < min_tokens:
        return None
    return min(full, max(left))
