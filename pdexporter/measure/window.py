"""Window maths: token timestamps in, TPOT statistics out. Pure: no I/O, no clock.

Definitions (the seed leaves them loose; these are the ones every number in a record uses):

Token times. A stream is a list of (arrival time, tokens in that event), in the order the events
were read; a time before the one before it is held at it (a 0 ms interval: the bytes of one stream
arrive in order, so the stamp was wrong, `client.stream` says how), and the window counts those
(`stamp_corrections`). An event carrying n > 1
tokens after a gap g contributes n tokens evenly spaced over g, i.e. n intervals of g / n: the
engine produced them in n steps we did not see separately. The first event's tokens (the time to
first token) start the stream and make no interval. Locating chunk steps works on events instead
(one emission, one step): after a stall an engine may hand over the tokens it made meanwhile in
one event together with the last chunk's token (vLLM's output collector merges what the client
has not read yet), and spreading that event's gap over its tokens would erase the chunk step.

Intervals. Interval k of a stream is t_k - t_(k-1), "ending" at t_k. The first `warmup_tokens`
tokens of every stream are discarded (CUDA-graph warm-up, batch ramp-up): only intervals whose
both ends lie at token index >= warmup_tokens count.

Baseline (Phase 1). Intervals of D decode-only streams pooled; p50/p90/p99/mean. `step_time_ms`
is the p50: with one token per stream per engine step, the decode cadence *is* the step time
(vLLM's own step timer is unreliable under async scheduling).

Window (Phase 2). t_inject is taken just before the prefill request leaves (its body already
encoded); t_first is the arrival of its first token. A probe interval is *in the window* when it
ends in (t_inject, t_first + TPOT_baseline_p50 / 2]: the last mixed step's decode tokens leave
with the prefill's first token, so the half-step margin keeps them in.

Slow steps. An interval is slow when it exceeds theta = p50 + max(rel * p50, k * 1.4826 * MAD)
of the baseline (rel = 0.2, k = 5 by default): far outside decode-only jitter. `slow_steps` is the
median over streams of their count of slow intervals in the window (the median shrugs off one
stream's hiccup): every decode step the prefill slowed, whatever slowed it.

Chunk steps. Where the prefill's chunks are known, each stream's chunk steps are located from the
end: the step that runs the prefill's last chunk emits its first token in the same output batch
as the decodes' tokens of that step, so the chunk steps are the K window intervals (events, see
above) that end at the one nearest t_first (the anchor). The first token does not always leave
with the last chunk's step: on the H200 it often came one step later (e.g. a single 2048-token
chunk's 69 ms step followed by a 4 ms one that ended at t_first), so of the placements ending at
the anchor or one step before it the one whose intervals best match the chunk sizes (the sum of
interval x chunk / largest chunk: big chunks take long steps) is taken. The chunks come from:

- the engine's own step log, when the launcher owns the engine (`num_chunks_source =
  "engine-log"`, exact: `num_chunks_actual` = its number of steps with context tokens);
- else the engine's scheduling rule (its adapter's `chunk_schedule`; for vLLM ceil(P / (B - D))
  chunks of B - D tokens and a tail), which the cadence must confirm: in most streams every
  located step of a chunk of at least a quarter of the largest must be slow (a chunk of at most
  `decode_like_tokens` tokens computes like a decode step and need not), and at most
  `max_stall_steps` slow steps may be left over, of them at most `max_chunk_like_stalls` as slow
  as half the fastest located chunk step (more are chunks the schedule lacks: a smaller chunk
  size) (`chunk_schedule_check`). Then
  `num_chunks_source = "cadence"` and `num_chunks_actual` = the located chunk steps the probes saw
  slow (`num_chunks_seen`): a tail of a few tokens that ran like a decode step is reported as not
  seen, never filled in from the schedule;
- else (chunk size unknown, or the cadence contradicted the schedule) the slow steps alone:
  each stream's run of window intervals from its first to its last slow one (`"slow-steps"`).

Why the schedule, and why it is right: the engine log showed exactly ceil(P / (B - D)) chunks in
all 1,650 repetitions of the H200 sweep (vLLM 0.22), so the rule knows what the log knows except
the timing, which the probes measure. The slow steps alone are not the chunk steps on a real vLLM:
admitting a 32K-token prompt stalls the engine loop for ~50-90 ms before its first chunk and
retiring it adds ~25 ms around the last, so the probes see one to three slow steps more than there
are chunks; those stalls are real cost and stay in the totals below, but they are not chunk steps.
Re-analysed without the log, every committed H200 repetition located the log's chunk steps
(tests/unit/measure/test_h200_without_log.py prints the distribution); with the slow steps alone,
601 of 1,505 did, and the penalty moved by more than 20 % on 60 of 168 configurations.
`chunk_step_times_ms` are the chunk steps of the median stream, in chunk order.

During the prefill. "During" is the chunk steps (the steps that executed prefill chunks, as the
seed defines TPOT_interference). Its mean/p50/p90 pool them across streams with each step
weighted by its chunk's tokens: the TPOT a decode sees while the prefill's work runs, taken per
prefill token. The headline (`tpot_interference_ms` in the table) is the token-weighted **mean**:
it moves with P in proportion to the work within a chunk count, where the weighted median jumps
from one chunk step to another as a growing last chunk's weight nears the first's (embedded
engine, B = 6144, D = 10: the median read 57.7 ms at P = 11800 and 88.3 ms at P = 12200, both
two chunks; the mean moves smoothly between them: `results/sim-fine-p/`). The p50/p90/p99 stay
as the seed's record keys and table columns of their own. Weighting keeps the seed's meaning and
fixes two flaws of a plain median over steps, both seen on the H200: with two or three chunks one
step decided it (B = 16384, D = 6,
P = 32768 ran 16378 + 16378 + 12 tokens in steps of ~280, ~726 and ~40 ms: the plain median was
the 280 ms step, the weighted one is their middle, ~500 ms), and a tail of 1-16 tokens, which runs
as a plain decode step the cadence cannot always see, halved a one-chunk prefill's penalty
(B = 2048, D = 1, P = 2048: 2047 + 1 tokens, 46.5 and 3.1 ms steps). With equal weights (no chunk
sizes known) it is numpy's median. Under async scheduling the first interval(s) of the window are
decode-only steps scheduled before the request arrived; they are not "during". With no slow step
and no chunks (nothing detectable), the whole window counts.

After the prefill. Each stream's next `after_intervals` (32) intervals after the window; p50.

Penalty. tpot_penalty = during_mean - baseline_p50 (the table's `tpot_penalty_ms`, the record's
`derived.tpot_penalty_ms`): how much slower each decode token is while the prefill runs, per
prefill token; tpot_penalty_p50 = during_p50 - baseline_p50 (the seed's record key, kept);
tpot_penalty_ratio = tpot_penalty / baseline_p50 (the seed's example: 46.9 / 42.3 = 1.11);
slowdown = during_mean / baseline_p50.

Totals. total_interference_ms = per stream, the sum over its window intervals of
(interval - reference), averaged over the streams that were past their warm-up when the window
opened (their first counted interval starts at or before t_inject): the extra time one decode
request lost to this prefill. A stream still in its warm-up then has its first window intervals
discarded with the warm-up and holds only the window's tail: in passive mode, a probe the exporter
restarted (every 256 tokens) just before a production prefill, averaged in, read 13 of 379 events of
the H200's 2 req/s run low by a median 23 % (up to 26 %; 4 probes); an injected window's probes are past
their warm-up by construction, and no committed injected repetition moved. With no such stream
there is no total. The reference is the probes' own decode cadence just before the injection (the p50 of
their pre-injection intervals, `tpot_pre_injection_p50_ms`, when each stream has at least
`loss_reference_min` of them on average; Phase 1's p50 otherwise): the step the decodes would have
kept running without the prefill. Read bursts are undone first (`read_cadence_ms`): after a long
window vLLM's API server and the client catch up by delivering several tokens at once (one SSE event
of n tokens spread by `token_times` over a short gap, or tokens read together, 0 ms apart), so with
few pre-injection intervals (the 8 recovery intervals of `sweeps/h200.yaml`) their plain p50 fell to
0.1-0.7 x the step after some 32K-token windows of GPU session 15's grid. An interval shorter than
`burst_interval_frac` of Phase 1's p50 joins the one before it (a run of the identical intervals of
one spread event too), the group's time shared by its tokens; the leading ones, whose gap began
before the range, are dropped. Phase 1 ran seconds to minutes earlier, and on the H200 its p50
differed from the cadence right before the injection by up to 0.9 ms at some D in every campaign
(2026-12-03, DecodeBench, D = 7: Phase 1 6.44 ms, the decodes ran 5.59 ms steps before and after
the admission): charged against Phase 1, the 3-4 window intervals of an admission that cost each
decode ~4.5 ms summed to 0.1-2 ms; a colocated total moved by up to 14 % (the p90 over that
campaign's repetitions; 2-8 % in the others). The penalty keeps the spec's Phase 1 baseline.
aggregate_interference_ms = D * total_interference_ms: what the prefill cost the batch, the
quantity the offload rule compares with a transfer time. decode_tokens_delayed = the number of
slow intervals summed over streams.

num_chunks_expected: the length of the engine's chunk schedule (vLLM: ceil(P / (B - D)), running
decodes take one token each of the step budget B first; its adapter in `pdexporter.engines`).

The offloaded arm (docs/disaggregation.md). On the decode instance of a P/D pair the request
arrives with its KV computed elsewhere and is admitted in one step of one token
(`engines.disagg.admission_schedule` = (1,)): the same maths locates that one step as the "chunk
step" (the window interval ending at the request's first token; it is not moved one step back,
which is for a prefill's last chunk), `num_chunks_source` says how it was found ("engine-log":
the log's "1 context tokens" step; "cadence": the schedule, which a 1-token step cannot
contradict by being fast), and the penalty is that step against the baseline. t_inject is then
the request reaching the decode instance (the decode-side half of the routed request), so the
window also holds the KV transfer (NixlConnector: the request waits while the bytes move and the
decodes go on), and `total_interference_ms` sums every decode step of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = [
    "BaselineStats", "ChunkPlan", "Derived", "Intervals", "StreamPhases", "WindowParams", "WindowStats",
    "analyse_window", "baseline_from_lengths", "baseline_stats", "chunk_weights", "derive", "held_back", "intervals",
    "loss_reference_ms",
    "read_cadence_ms",
    "schedule_confirmed", "slow_step_count", "stream_phases", "token_event_index", "token_times",
    "weighted_percentile", "window_end_ns",
]


@dataclass(frozen=True)
class WindowParams:
    warmup_tokens: int = 16
    after_intervals: int = 32
    slow_rel: float = 0.20
    slow_mad_k: float = 5.0
    zero_interval_frac: float = 0.05  # an interval below this fraction of baseline p50 is "~0 ms"
    full_chunk_frac: float = 0.25  # a chunk this large (vs the largest) must show as a slow step
    max_stall_steps: int = 4  # slow steps beside the chunk steps a schedule may leave (stalls)
    # ... of which at most this many as slow as half the fastest located chunk step: more are chunks
    # the schedule does not have (vLLM at 2048 under an assumed 8192, P = 8192 on the H200: 3; the
    # committed H200 injections never more than 2, their admission and retirement stalls)
    max_chunk_like_stalls: int | None = 2  # None: not checked (a production prefill: `beside_traffic`)
    chunk_like_frac: float = 0.5
    decode_like_tokens: int = 16  # a chunk this small computes like a decode step: it need not look slow
    # A probe stamp that went back further than this fraction of Phase 1's p50 fails the window
    # (`protocol.stamp_problem`). Held at the stamp before it, an event moves two intervals by as much
    # as its stamp went back: a tenth of a step is well inside the slow-step margin (`slow_rel`); more
    # could make a slow step or hide one.
    max_stamp_back_frac: float = 0.1
    loss_reference_min: int = 8  # pre-injection intervals per stream for the totals' local reference
    burst_interval_frac: float = 0.5  # a pre-injection interval below this fraction of Phase 1's p50 is a read burst's

    def beside_traffic(self) -> WindowParams:
        """The settings for a production prefill (passive mode): other requests' chunks run beside
        it, so chunk-like steps its schedule lacks say nothing against the chunk size."""
        return replace(self, max_chunk_like_stalls=None)


@dataclass(frozen=True)
class ChunkPlan:
    """The prefill's chunk sizes in token order: from the engine's own step log (`exact`), or
    from the engine's scheduling rule (its adapter's `chunk_schedule`), which the cadence must
    then confirm before it is used."""

    sizes: tuple[int, ...]
    exact: bool


@dataclass(frozen=True)
class Intervals:
    """Intervals of one stream: end times (ns) and lengths (ns), in token order."""

    end_ns: np.ndarray
    length_ns: np.ndarray
    token_index: np.ndarray  # index of the token that ends each interval


MAD_TO_SD = 1.4826  # a normal distribution's standard deviation per median absolute deviation


@dataclass(frozen=True)
class BaselineStats:
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    mad_ms: float
    n_intervals: int

    @property
    def step_time_ms(self) -> float:
        return self.p50_ms

    def slow_threshold_ms(self, params: WindowParams) -> float:
        return self.p50_ms + max(params.slow_rel * self.p50_ms, params.slow_mad_k * MAD_TO_SD * self.mad_ms)

    @classmethod
    def from_record(cls, p50_ms: float, p90_ms: float, p99_ms: float, mean_ms: float, n_intervals: int,
                    slow_threshold_ms: float | None, params: WindowParams) -> BaselineStats:
        """The statistics back from what a record keeps: its baseline block and the slow-step
        threshold its window used. The MAD sets nothing but that threshold, so the MAD that gives it
        back (0 where the relative floor set it) reproduces every number of the window."""
        over = (slow_threshold_ms - p50_ms) if slow_threshold_ms is not None else 0.0
        mad = over / (params.slow_mad_k * MAD_TO_SD) if over > params.slow_rel * p50_ms * (1 + 1e-6) else 0.0
        return cls(p50_ms, p90_ms, p99_ms, mean_ms, mad, n_intervals)


@dataclass(frozen=True)
class WindowStats:
    t_inject_ns: int
    t_first_ns: int
    prefill_duration_ms: float
    during_p50_ms: float | None
    during_p90_ms: float | None
    during_p99_ms: float | None
    during_mean_ms: float | None
    window_p50_ms: float | None
    window_mean_ms: float | None
    after_p50_ms: float | None
    pre_p50_ms: float | None
    slow_threshold_ms: float | None
    slow_steps_per_stream: tuple[int, ...]
    slow_steps: int | None
    num_chunks_actual: int | None
    num_chunks_source: str | None  # "engine-log" | "cadence" | "slow-steps"
    num_chunks_seen: int | None  # located chunk steps the probes saw slow (median stream)
    chunk_schedule_check: str | None  # "confirmed" | "contradicted": the schedule vs the cadence
    window_intervals: int
    total_interference_ms: float | None
    decode_tokens_delayed: int
    zero_intervals: int
    min_interval_ms: float | None
    chunk_step_times_ms: tuple[float, ...]  # the median stream's chunk steps, in chunk order
    # probe events whose stamp went back, held at the one before (module docs); None where none was: a record
    # of before the field (read as None) and one re-derived with nothing held are the same record
    stamp_corrections: int | None = None


@dataclass(frozen=True)
class Derived:
    tpot_penalty_ms: float | None  # the headline: token-weighted mean TPOT of the chunk steps - baseline p50
    tpot_penalty_p50_ms: float | None  # the same with the token-weighted median (the seed's record key)
    tpot_penalty_ratio: float | None
    slowdown: float | None
    total_interference_ms: float | None
    aggregate_interference_ms: float | None
    decode_tokens_delayed: int


def token_times(event_times_ns: Sequence[int], event_tokens: Sequence[int]) -> np.ndarray:
    """Per-token arrival times; an n-token event is spread evenly over the gap before it."""
    if len(event_times_ns) != len(event_tokens):
        raise ValueError("event_times_ns and event_tokens differ in length")
    n = np.asarray(event_tokens, dtype=np.int64)
    keep = n > 0
    t = np.asarray(event_times_ns, dtype=np.float64)[keep] if len(event_times_ns) else np.empty(0)
    n = n[keep]
    if t.size == 0:
        return np.empty(0, dtype=np.float64)
    t = np.maximum.accumulate(t)  # a stamp before the one before it is held there (module docs)
    previous = np.concatenate((t[:1], t[:-1]))
    gap = (t - previous) / n  # each event's n tokens spread over the gap before it
    event = np.repeat(np.arange(t.size), n)
    k = (np.arange(event.size) - np.repeat(np.cumsum(n) - n, n) + 1).astype(np.float64)
    out = previous[event] + gap[event] * k
    out[: n[0]] = t[0]  # the first event starts the stream
    return out


def token_event_index(event_tokens: Sequence[int]) -> np.ndarray:
    """For each token of `token_times`, the index of the event it arrived in."""
    counts = np.maximum(np.asarray(event_tokens, dtype=np.int64), 0)
    return np.repeat(np.arange(counts.size), counts)


def held_back(times_ns: Sequence[int] | np.ndarray) -> np.ndarray:
    """How far each time lies before the latest one ahead of it (0 where the times keep order), in the
    times' own type (integer nanoseconds stay exact)."""
    times = np.asarray(times_ns)
    return np.maximum.accumulate(times) - times if times.size else times.astype(np.float64)


def intervals(times_ns: np.ndarray, warmup_tokens: int = 0) -> Intervals:
    """Intervals whose both ends lie at token index >= warmup_tokens; never negative: a time before
    the one before it is held there (`token_times` already did so for its output)."""
    times = np.asarray(times_ns, dtype=np.float64)
    if times.size < 2:
        empty = np.empty(0)
        return Intervals(empty, empty, np.empty(0, dtype=np.int64))
    times = np.maximum.accumulate(times)
    idx = np.arange(1, times.size)
    keep = idx - 1 >= warmup_tokens
    return Intervals(times[1:][keep], np.diff(times)[keep], idx[keep])


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def baseline_stats(streams: Sequence[np.ndarray], params: WindowParams = WindowParams()) -> BaselineStats | None:
    """Phase 1: pooled decode-only intervals after warm-up. None when there are no streams."""
    pooled = [intervals(s, params.warmup_tokens).length_ns for s in streams]
    return baseline_from_lengths(np.concatenate(pooled) if pooled else np.empty(0))


def baseline_from_lengths(lengths_ns: np.ndarray) -> BaselineStats | None:
    ms = np.asarray(lengths_ns, dtype=np.float64) / 1e6
    if ms.size == 0:
        return None
    p50 = float(np.median(ms))
    return BaselineStats(
        p50_ms=p50,
        p90_ms=float(np.percentile(ms, 90)),
        p99_ms=float(np.percentile(ms, 99)),
        mean_ms=float(ms.mean()),
        mad_ms=float(np.median(np.abs(ms - p50))),
        n_intervals=int(ms.size),
    )


@dataclass(frozen=True)
class StreamPhases:
    """Where each interval of one stream (after warm-up) falls around one prefill.

    Boolean masks over `intervals`, the single definition that `analyse_window` pools and that
    the live exporter uses to label every probe interval it exports.
    """

    intervals: Intervals
    pre: np.ndarray  # ends at or before t_inject
    window: np.ndarray  # ends in (t_inject, window_end]
    during: np.ndarray  # the chunk steps: the K window intervals ending at the one nearest t_first
    slow: np.ndarray  # in the window and above the slow threshold
    after: np.ndarray  # the next `after_intervals` past the window
    during_ms: np.ndarray  # the values "during" pools: one per chunk step (a merged event's whole gap)
    other_steps_ms: np.ndarray = field(default_factory=lambda: np.empty(0))  # the window's other steps (events)


def window_end_ns(t_first_ns: int, baseline: BaselineStats | None) -> float:
    """t_first + TPOT_baseline_p50 / 2 (see the module docs)."""
    return t_first_ns + ((baseline.p50_ms * 1e6 / 2) if baseline else 0.0)


def stream_phases(
    times: np.ndarray,
    t_inject_ns: int,
    t_first_ns: int,
    window_end: float,
    slow_threshold_ms: float | None,
    params: WindowParams = WindowParams(),
    chunk_sizes: Sequence[int] | None = None,
    token_events: np.ndarray | None = None,
) -> StreamPhases:
    """`chunk_sizes`: the prefill's chunks from the engine log, when known; `token_events`: the
    event each token arrived in (`token_event_index`), so that a merged event counts as one step
    (see the module docs)."""
    iv = intervals(times, params.warmup_tokens)
    ms, in_window, slow = _window_masks(iv, t_inject_ns, window_end, slow_threshold_ms)
    during = np.zeros_like(in_window)
    positions = np.nonzero(in_window)[0]
    during_ms = ms[positions]
    other_ms = np.empty(0)
    if positions.size and chunk_sizes:
        # Steps are emissions: the sub-intervals of one merged event form one step.
        events = (token_events[iv.token_index[positions]] if token_events is not None
                  else iv.token_index[positions])
        starts = np.flatnonzero(np.concatenate(([True], events[1:] != events[:-1])))
        step_ms = np.add.reduceat(ms[positions], starts)
        step_end = iv.end_ns[positions][np.append(starts[1:] - 1, positions.size - 1)]
        k = len(chunk_sizes)
        anchor = int(np.argmin(np.abs(step_end - t_first_ns)))
        weights = np.asarray(chunk_sizes, dtype=np.float64) / max(chunk_sizes)

        def fit(last: int) -> float:  # how well K steps ending at `last` match the chunk sizes
            first = last - k + 1
            return float((step_ms[max(0, first) : last + 1] * weights[max(0, -first) :]).sum())

        prefill_like = max(chunk_sizes) > params.decode_like_tokens
        if prefill_like and anchor >= 1 and fit(anchor - 1) > fit(anchor):
            anchor -= 1  # the first token left one step after the last chunk's step
        first_step = max(0, anchor - k + 1)
        ends = np.append(starts[1:], positions.size)
        during[positions[starts[first_step] : ends[anchor]]] = True
        during_ms = step_ms[first_step : anchor + 1]
        other_ms = np.concatenate((step_ms[:first_step], step_ms[anchor + 1 :]))
    elif slow.any():
        first, last = np.nonzero(slow)[0][[0, -1]]
        during[first : last + 1] = True
        during_ms = ms[during]
    else:
        during[positions] = True
    after = np.zeros_like(in_window)
    after[np.nonzero(iv.end_ns > window_end)[0][: params.after_intervals]] = True
    return StreamPhases(iv, iv.end_ns <= t_inject_ns, in_window, during, slow, after, during_ms, other_ms)


def slow_step_count(
    streams: Sequence[np.ndarray], t_inject_ns: int, window_end: float, slow_threshold_ms: float | None,
    params: WindowParams = WindowParams(),
) -> list[int]:
    """Each stream's number of slow intervals in the window."""
    return [
        int(_window_masks(intervals(times, params.warmup_tokens), t_inject_ns, window_end, slow_threshold_ms)[2].sum())
        for times in streams
    ]


def _window_masks(
    iv: Intervals, t_inject_ns: int, window_end: float, slow_threshold_ms: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Interval lengths (ms), which end in the window, which of those are slow."""
    ms = iv.length_ns / 1e6
    in_window = (iv.end_ns > t_inject_ns) & (iv.end_ns <= window_end)
    slow = in_window & (ms > slow_threshold_ms) if slow_threshold_ms is not None else np.zeros_like(in_window)
    return ms, in_window, slow


def analyse_window(
    streams: Sequence[np.ndarray],
    t_inject_ns: int,
    t_first_ns: int,
    baseline: BaselineStats | None,
    params: WindowParams = WindowParams(),
    plan: ChunkPlan | None = None,
    token_events: Sequence[np.ndarray] | None = None,
) -> WindowStats:
    """Phase 2: classify each probe's intervals around one prefill (see the module docs).

    `plan` is the prefill's chunk sizes: from the engine's own step log (exact) or from its
    scheduling rule (checked against the cadence); `token_events` each stream's
    `token_event_index`, when known."""
    if t_first_ns < t_inject_ns:
        raise ValueError("the prefill's first token arrived before it was sent")
    window_end = window_end_ns(t_first_ns, baseline)
    theta_ms = baseline.slow_threshold_ms(params) if baseline else None
    slow_counts = slow_step_count(streams, t_inject_ns, window_end, theta_ms, params)
    slow_steps = int(round(float(np.median(slow_counts)))) if streams and theta_ms is not None else None

    def phases(sizes: tuple[int, ...] | None) -> list[StreamPhases]:
        return [
            stream_phases(times, t_inject_ns, t_first_ns, window_end, theta_ms, params, sizes,
                          token_events[s] if token_events is not None else None)
            for s, times in enumerate(streams)
        ]

    sizes = plan.sizes if plan and plan.sizes else None
    per_stream = phases(sizes)
    check: str | None = None
    if sizes is not None and plan is not None and not plan.exact and theta_ms is not None and streams:
        confirmed = schedule_confirmed(per_stream, sizes, theta_ms, baseline.p50_ms if baseline else 0.0, params)
        check = "confirmed" if confirmed else "contradicted"
        if check == "contradicted":
            sizes = None
            per_stream = phases(None)
    seen_counts = [int((ph.during_ms > theta_ms).sum()) for ph in per_stream] if sizes and theta_ms is not None else []
    seen = int(round(float(np.median(seen_counts)))) if seen_counts else None
    chunks: int | None
    if sizes is not None and plan is not None and plan.exact:
        chunks, source = len(sizes), "engine-log"
    elif sizes is not None:
        chunks, source = seen, "cadence"
    else:
        chunks, source = slow_steps, "slow-steps"

    window_all: list[np.ndarray] = []
    during_all: list[np.ndarray] = []
    weights_all: list[np.ndarray] = []
    after_all: list[np.ndarray] = []
    pre_all: list[np.ndarray] = []
    zero = 0
    for ph in per_stream:
        ms = ph.intervals.length_ns / 1e6
        w = ms[ph.window]
        window_all.append(w)
        pre_all.append(ms[ph.pre])
        after_all.append(ms[ph.after])
        during_all.append(ph.during_ms)
        weights_all.append(chunk_weights(sizes, ph.during_ms.size))
        if baseline is not None and w.size:
            zero += int((w < params.zero_interval_frac * baseline.p50_ms).sum())

    window = np.concatenate(window_all) if window_all else np.empty(0)
    during = np.concatenate(during_all) if during_all else np.empty(0)
    weights = np.concatenate(weights_all) if weights_all else np.empty(0)
    after = np.concatenate(after_all) if after_all else np.empty(0)
    step = baseline.p50_ms if baseline is not None else None
    pre = np.concatenate([read_cadence_ms(x, step, params) for x in pre_all]) if pre_all else np.empty(0)
    reference = loss_reference_ms(pre, len(streams), baseline, params)
    # Only a stream decoding past its warm-up when the window opened has all of its window intervals counted:
    # one still in its warm-up then (a probe the exporter restarted just before) lost the first of them.
    whole = [_whole_window(ph.intervals, t_inject_ns) for ph in per_stream]
    totals = ([float((w - reference).sum()) for w, ok in zip(window_all, whole) if w.size and ok]
              if reference is not None else [])
    median_stream = _median_index(slow_counts)
    return WindowStats(
        t_inject_ns=int(t_inject_ns),
        t_first_ns=int(t_first_ns),
        prefill_duration_ms=(t_first_ns - t_inject_ns) / 1e6,
        during_p50_ms=weighted_percentile(during, weights, 50),
        during_p90_ms=weighted_percentile(during, weights, 90),
        during_p99_ms=weighted_percentile(during, weights, 99),
        during_mean_ms=float(np.average(during, weights=weights)) if during.size else None,
        window_p50_ms=_pct(window, 50),
        window_mean_ms=float(window.mean()) if window.size else None,
        after_p50_ms=_pct(after, 50),
        pre_p50_ms=_pct(pre, 50),
        slow_threshold_ms=theta_ms,
        slow_steps_per_stream=tuple(slow_counts),
        slow_steps=slow_steps,
        num_chunks_actual=chunks if streams or (plan and plan.exact) else None,
        num_chunks_source=None if chunks is None else source,
        num_chunks_seen=seen,
        chunk_schedule_check=check,
        window_intervals=int(window.size),
        total_interference_ms=float(np.mean(totals)) if totals else None,
        decode_tokens_delayed=int(sum(slow_counts)),
        zero_intervals=zero,
        min_interval_ms=float(np.min(window)) if window.size else None,
        chunk_step_times_ms=(tuple(float(x) for x in during_all[median_stream])
                             if during_all and (chunks or sizes is not None) else ()),
        stamp_corrections=sum(int((held_back(times) > 0).sum()) for times in streams) or None,
    )


def read_cadence_ms(pre_ms: np.ndarray, step_ms: float | None, params: WindowParams = WindowParams()) -> np.ndarray:
    """One stream's pre-injection intervals (in order) with read bursts undone ("Totals" in the
    module docs): an interval shorter than `burst_interval_frac` x Phase 1's p50 `step_ms`, or equal
    to the one before (the even spread of one n-token event), joins the group before it and the
    group's summed time is shared by its tokens; intervals before the first group are dropped. The
    sum over the groups is kept, so a burst moves no token's share by more than its group's."""
    x = np.asarray(pre_ms, dtype=np.float64)
    if step_ms is None or x.size == 0:
        return x
    short = x < params.burst_interval_frac * step_ms
    spread = np.concatenate(([False], np.abs(x[1:] - x[:-1]) <= 1e-6 * np.abs(x[:-1])))  # np.isclose, rtol 1e-6
    starts = ~short & ~spread
    if not starts.any():
        return np.empty(0)
    first = int(np.argmax(starts))
    x, starts = x[first:], starts[first:]
    group = np.cumsum(starts) - 1
    sums = np.bincount(group, weights=x)
    counts = np.bincount(group)
    return (sums / counts)[group]


def loss_reference_ms(pre_ms: np.ndarray, streams: int, baseline: BaselineStats | None,
                      params: WindowParams = WindowParams()) -> float | None:
    """The decode step the window's intervals are charged against (see "Totals" in the module
    docs): the probes' own cadence just before the injection (p50 of the intervals that end at or
    before t_inject, read bursts undone by `read_cadence_ms`, pooled over streams) when each stream
    has `loss_reference_min` of them on average, else Phase 1's p50 (None without a baseline)."""
    if baseline is None:
        return None
    if streams and pre_ms.size >= params.loss_reference_min * streams:
        return float(np.median(pre_ms))
    return baseline.p50_ms


def chunk_weights(sizes: Sequence[int] | None, n: int) -> np.ndarray:
    """The weight of each of a stream's `n` located chunk steps: its chunk's tokens (the last `n`
    chunks when fewer steps were located), or 1 each when no chunk sizes are known."""
    if not sizes:
        return np.ones(n)
    return np.asarray(sizes[len(sizes) - n :], dtype=np.float64)


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float | None:
    """Percentile `q` of `values`, each counted with its weight. Each value sits at the middle of
    its share of the total weight (Hazen positions) and percentiles interpolate between them, so
    with equal weights the median is numpy's median (middle value, or the mean of the two)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return None
    w = np.asarray(weights, dtype=np.float64)
    if w.size != v.size or not np.all(w > 0):
        raise ValueError("weighted_percentile: one positive weight per value")
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    positions = (np.cumsum(w) - w / 2) / w.sum()
    return float(np.interp(q / 100.0, positions, v))


def schedule_confirmed(
    per_stream: Sequence[StreamPhases], sizes: Sequence[int], theta_ms: float, baseline_ms: float,
    params: WindowParams = WindowParams(),
) -> bool:
    """Does the cadence agree with the engine's chunk schedule? In most streams every located
    step of a substantial chunk (>= `full_chunk_frac` of the largest, and more than
    `decode_like_tokens`: a 1-token admission step runs like a decode step) must be slow, and at most
    `max_stall_steps` of the window's other steps may be clearly slow (over twice the baseline:
    the engine's admission and retirement stalls; decode-step jitter just above the slow
    threshold does not count, and a merged event counts once, as the one step it was), and at most
    `max_chunk_like_stalls` of them as slow as `chunk_like_frac` of the fastest located chunk step
    (a stall is shorter; more such steps are chunks the schedule lacks)."""
    chunks = np.asarray(sizes, dtype=np.float64)
    big = (chunks >= params.full_chunk_frac * max(sizes)) & (chunks > params.decode_like_tokens)
    clearly_slow = max(theta_ms, 2.0 * baseline_ms)
    votes = []
    for ph in per_stream:
        located = ph.during_ms
        seen = located > theta_ms
        full = big[len(big) - located.size :] if located.size <= big.size else big
        if located.size != len(sizes) or not np.all(seen[full]):
            votes.append(False)
            continue
        others = ph.other_steps_ms
        extra = int((others > clearly_slow).sum())
        # a chunk-like step: clearly slow, and at least `chunk_like_frac` of the fastest located chunk step
        like = max(clearly_slow, params.chunk_like_frac * float(located[full].min())) if full.any() else np.inf
        chunk_like = int((others >= like).sum())
        votes.append(extra <= params.max_stall_steps
                     and (params.max_chunk_like_stalls is None or chunk_like <= params.max_chunk_like_stalls))
    return sum(votes) * 2 > len(votes)


def _whole_window(iv: Intervals, t_inject_ns: int) -> bool:
    """Whether a stream's counted intervals reach back to t_inject: its first one after the warm-up
    starts at or before it, so no interval of the window is lost to the warm-up ("Totals")."""
    return bool(iv.end_ns.size) and float(iv.end_ns[0] - iv.length_ns[0]) <= t_inject_ns


def _median_index(counts: Sequence[int]) -> int:
    if not counts:
        return 0
    order = sorted(range(len(counts)), key=lambda i: counts[i])
    return order[len(order) // 2]


def derive(baseline: BaselineStats | None, window: WindowStats, decode_batch_size: int) -> Derived:
    if baseline is None or window.during_p50_ms is None or window.during_mean_ms is None:
        return Derived(None, None, None, None, None, None, window.decode_tokens_delayed)
    penalty = window.during_mean_ms - baseline.p50_ms
    total = window.total_interference_ms
    return Derived(
        tpot_penalty_ms=penalty,
        tpot_penalty_p50_ms=window.during_p50_ms - baseline.p50_ms,
        tpot_penalty_ratio=penalty / baseline.p50_ms if baseline.p50_ms > 0 else None,
        slowdown=window.during_mean_ms / baseline.p50_ms if baseline.p50_ms > 0 else None,
        total_interference_ms=total,
        aggregate_interference_ms=total * decode_batch_size if total is not None else None,
        decode_tokens_delayed=window.decode_tokens_delayed,
    )



