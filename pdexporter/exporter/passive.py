"""Passive mode (`pdexporter run --passive`): windows from the production prefills the probes saw.

`PassiveTracker` is the stateful edge around `measure.passive` (the pure definitions) and
`measure.window` (the window maths, unchanged): it is fed the probe streams, the engine's
request traces (the exporter's OTLP receiver) and its /metrics scrapes, and hands back finished
events. The live runner drives it in real time; `predict.passive` drives the same object on the
embedded engine in virtual time, so the honest comparison measures this code.

An event's life:

1. detected: `measure.passive.probe_steps` and `slow_runs` over the last `baseline_span_s` of
   probe events find a run of slow steps; once it is closed (normal steps after it) it becomes
   pending. Runs are taken in time order, each once.
2. recovered: every probe open across the run has `after_intervals` tokens past the window (or
   ended), as an injected window waits for; then the probes' traces (trimmed to the window, its
   baseline and its recovery) and the baseline are taken: the quiet-period rule of
   `exporter.timeline` ending at the run's start, the quiet period starting where the previous
   run ended.
3. attributed: the engine's request traces are awaited (they arrive when a request *finishes*,
   after its decode, plus the engine's span batching delay) for up to `attribution_wait_s`; the
   /metrics counters that move at a first token bracket the run as soon as a scrape after it
   lands (the tracker asks for scrapes: one while a slow step is in progress, one after each
   run). A trace attribution is taken as soon as the metrics say how many production prefills
   ended in the run and the traces account for all of them (another request of the run may still
   be decoding: its span comes later); else at the deadline, the best source available then
   (traces; else metrics; the cadence with the step-time model only where neither reaches the
   exporter).
4. analysed: P from the attribution, D from the engine's running requests, the engine adapter's
   chunk schedule for (P, B, D), and `measure.window.analyse_window` with the run's start as
   t_inject and its end as t_first (via `measure.protocol.analyse_traces`): an
   `InterferenceRun` and the same `RepRecord` an injected window gives.

Outcomes (`pdexporter_passive_events_total{outcome}`): `published` (one production prefill,
binned into the labels), `joint` (several traced prefills the engine ran as one chunked stream,
`measure.passive.joint_attribution`: one event at P = their sum for the event model, kept out of
the per-cell window series and saved under the records' `joint/`), `merged` (several prefills
ended in one run and it cannot be read as one stream: counted only), `unattributed` (no
production prefill ended there: an engine stall, a request retiring), `ambiguous` (only
/metrics is there, and no pair of scrapes isolates the run), `own-probe` (the exporter's own
probe restart), `no-baseline`, `no-window` (no probe decoded a token inside the prefill's window: nothing
to measure; seen once beside a CPU burner), `out-of-bins`, `no-budget` (D >= B).
The cadence source is used only where neither traces nor /metrics reach the exporter: it cannot
tell an engine stall from a small prefill.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdexporter.client.metrics import MetricsSnapshot
from pdexporter.client.stream import TokenStream
from pdexporter.client.traces import RequestTrace
from pdexporter.engines import adapter
from pdexporter.exporter import timeline
from pdexporter.exporter.metrics import PASSIVE_OUTCOMES
from pdexporter.measure.passive import (
    D_BINS,
    P_BINS,
    SOURCES,
    Attribution,
    ProbeStep,
    RequestPrefill,
    SlowRun,
    attribute_metrics,
    attribute_traces,
    bin_int,
    cadence_prompt_tokens,
    joint_attribution,
    probe_steps,
    running_decodes,
    slow_runs,
)
from pdexporter.measure.point import PointSpec, rep_record
from pdexporter.measure.probesets import trim_trace
from pdexporter.measure.protocol import (
    InterferenceRun,
    StreamTrace,
    analyse_traces,
    expected_schedule,
    window_anchor_ns,
)
from pdexporter.measure.records import RepRecord
from pdexporter.measure.window import BaselineStats, WindowParams, baseline_from_lengths, token_times

OUTCOMES = PASSIVE_OUTCOMES
PASSIVE_BASELINE_RULE = "passive-quiet"
PRODUCTION_TAG = "production"
DETECT_SPAN_S = 5.0  # runs are found in the last 5 s of probe events (the longest run it can see)

# (P, B, D) -> the extra time of each chunk step of a P-token prefill (its engine's schedule) over
# a decode-only step of D decodes, in ms
CadenceModel = Callable[[int, int, int], Sequence[float]]


@dataclass(frozen=True)
class PassiveSettings:
    chunk_size: int
    engine: str  # the engine adapter's name (its chunking, its budget)
    window: WindowParams = WindowParams()
    probe_prompt_tokens: int = 4096  # the probes' shared prefix: how to tell our own requests
    probe_max_tokens: int = 256
    baseline_span_s: float = 10.0
    min_baseline_intervals: int = 32
    attribution_wait_s: float = 30.0
    metrics_wait_s: float = 5.0  # longest wait for a scrape after the run
    recovery_wait_s: float = 10.0  # longest wait for the probes' recovery intervals
    bridge_steps: int = 1
    scrape_min_gap_s: float = 0.5  # an engine renders /metrics in its HTTP loop: at most two asks a second
    sources: tuple[str, ...] = SOURCES
    d_bins: tuple[int, ...] = D_BINS
    p_bins: tuple[int, ...] = P_BINS

    def __post_init__(self) -> None:
        unknown = set(self.sources) - set(SOURCES)
        if unknown or not self.sources:
            raise ValueError(f"passive sources {self.sources!r}: choose from {', '.join(SOURCES)}")


@dataclass(frozen=True)
class Scrape:
    """A /metrics snapshot and the probe-clock interval in which the engine rendered it."""

    snapshot: MetricsSnapshot
    t0_ns: float
    t1_ns: float


@dataclass
class PassiveEvent:
    """One finished passive event (module docs)."""

    slow_run: SlowRun
    outcome: str
    attribution: Attribution | None = None
    decode_batch_size: int | None = None
    d_source: str | None = None
    d_bin: int | None = None
    p_bin: int | None = None
    run: InterferenceRun | None = None
    rep: RepRecord | None = None
    detected_ns: float = 0.0
    finalised_ns: float = 0.0
    cadence_prompt_tokens: int | None = None  # what the probes' cadence alone would have said P was

    @property
    def source(self) -> str | None:
        return self.attribution.source if self.attribution else None

    @property
    def published(self) -> bool:
        return self.outcome == "published"

    @property
    def joint(self) -> bool:
        """Several prefills read as one chunked stream: an event the model learns from, no window."""
        return self.outcome == "joint"

    @property
    def key(self) -> tuple[int, int, int] | None:
        """(B, D bin, P bin): the grid point the event is labelled with."""
        if self.run is None or self.d_bin is None or self.p_bin is None:
            return None
        return (self.run.extra["passive"]["chunk_size"], self.d_bin, self.p_bin)

    def info(self) -> dict[str, Any]:
        """What the raw file and the record keep about where the numbers came from."""
        a = self.attribution
        return {
            "source": a.source if a else None,
            "prompt_tokens": a.prompt_tokens if a else None,
            "prefills": a.prefills if a else None,
            "joint": a.joint if a else False,
            "request_ids": list(a.request_ids) if a else [],
            # each prefill's prompt tokens, as request_ids (optional: records before it hold only the ids;
            # the event model then reads them from requests.jsonl, `analysis.passive_model.joint_prompts`)
            "prompt_sizes": list(a.prompt_sizes) if a and a.prompt_sizes else None,
            "decode_batch_size": self.decode_batch_size,
            "d_source": self.d_source,
            "d_bin": self.d_bin,
            "p_bin": self.p_bin,
            "slow_steps": self.slow_run.slow_steps,
            "run_steps_ms": [round(s, 3) for s in self.slow_run.steps_ms],
            "attribution_delay_s": round((self.finalised_ns - self.detected_ns) / 1e9, 3),
            "cadence_prompt_tokens": self.cadence_prompt_tokens,
        }


@dataclass
class _Pending:
    run: SlowRun
    detected_ns: float
    step_ms: float
    traces: list[StreamTrace] | None = None
    open_probes: int = 0
    seen_inputs: int = -1  # the tracker's input count when it was last looked at
    # the probe events the baseline is pooled from, taken at recovery; pooled only if it is needed
    quiet: list[tuple[list[int], list[int], int]] | None = None
    windows: list[tuple[float, float]] = field(default_factory=list)  # other runs' windows, left out
    _baseline: BaselineStats | None = None
    _pooled: bool = False

    def baseline(self, params: WindowParams) -> BaselineStats | None:
        if not self._pooled:
            self._baseline, self._pooled = _pool_baseline(self, params), True
        return self._baseline


class PassiveTracker:
    """The passive-mode state machine (module docs)."""

    def __init__(self, settings: PassiveSettings, *, trace_offset_ns: float = 0.0,
                 cadence: CadenceModel | None = None) -> None:
        self.settings = settings
        self.trace_offset_ns = trace_offset_ns  # probe clock = engine Unix clock - offset
        self.cadence = cadence
        self.traces_seen = 0
        self.own_traces_seen = 0
        self._prefills: list[RequestPrefill] = []  # production requests by first token (probe clock)
        self._scrapes: collections.deque[Scrape] = collections.deque()
        self._pending: collections.deque[_Pending] = collections.deque()
        self._runs: collections.deque[SlowRun] = collections.deque()  # closed runs, in order
        self._last_end = -math.inf  # end of the last run taken
        self._open_from: float | None = None  # a run (or a slow step) in progress since
        self._step_ms: float | None = None
        self._theta_ms: float | None = None
        self._last_scrape_wanted = -math.inf
        self._cadence_scale: collections.deque[float] = collections.deque(maxlen=64)
        self._seq = 0
        self._counters_seen = False
        self._steps_since_stats = 0
        self._inputs = 0  # traces and scrapes received: a pending run is looked at again when it moves
        self._scrape_t0: list[float] = []  # t0 of each kept scrape, for bisection
        self._run_ends: list[float] = []  # end of each kept run, in order
        self._steps: collections.deque[ProbeStep] = collections.deque()
        self._settled_ns = -math.inf  # the last arrival of the last settled step
        self._own_firsts: list[float] = []  # first tokens of the exporter's own probe streams
        self._own_ids: collections.OrderedDict[str, None] = collections.OrderedDict()

    # --- inputs --------------------------------------------------------------------------

    def add_traces(self, traces: Iterable[RequestTrace]) -> list[RequestPrefill]:
        """Requests the engine finished (its OTLP spans); the exporter's own probes are set aside.
        Returns the production prefills added (`run --passive --out` logs them: requests.jsonl)."""
        added: list[RequestPrefill] = []
        s = self.settings
        self._inputs += 1
        for t in traces:
            self.traces_seen += 1
            first = t.first_token_ns
            if first is None or t.prompt_tokens is None:
                continue
            if t.prompt_tokens == s.probe_prompt_tokens and (t.max_tokens or 0) <= s.probe_max_tokens:
                self.own_traces_seen += 1
                continue
            prefill = RequestPrefill(t.request_id, t.prompt_tokens, first - self.trace_offset_ns,
                                     None if t.prefill_s is None else t.prefill_s * 1e3)
            bisect.insort(self._prefills, prefill, key=lambda r: r.first_token_ns)
            added.append(prefill)
        return added

    def add_scrape(self, snapshot: MetricsSnapshot, t0_ns: float, t1_ns: float) -> None:
        self._inputs += 1
        self._scrapes.append(Scrape(snapshot, t0_ns, t1_ns))
        self._scrape_t0.append(t0_ns)
        if snapshot.get("time_to_first_token_seconds_count") is not None:
            self._counters_seen = True

    def wants_scrape(self, now_ns: float) -> bool:
        """A scrape now would bracket a run: one is in progress, or a pending one has no scrape after it."""
        if now_ns - self._last_scrape_wanted < self.settings.scrape_min_gap_s * 1e9:
            return False
        last = self._scrapes[-1].t0_ns if self._scrapes else -math.inf
        want = self._open_from is not None and last < self._open_from
        want = want or any(last <= p.run.end_ns for p in self._pending)
        if want:
            self._last_scrape_wanted = now_ns
        return want

    # --- labels for the TPOT histogram ---------------------------------------------------------

    def label_frontier(self, now_ns: float) -> float:
        """Probe intervals ending up to here can be labelled: no run still open can hold them."""
        lag = max(0.5e9, 4 * (self._step_ms or 10.0) * 1e6)
        frontier = now_ns - lag
        if self._open_from is not None:
            frontier = min(frontier, self._open_from)
        return frontier

    def phase_of(self, t_ns: float) -> str:
        """`prefill_window` inside a run's window, `after_prefill` in its recovery, else `baseline`."""
        step = (self._step_ms or 10.0) * 1e6
        after = self.settings.window.after_intervals * step
        for run in reversed(self._runs):
            if run.end_ns + step / 2 + after < t_ns:
                break
            if run.start_ns < t_ns <= run.end_ns + step / 2:
                return timeline.WINDOW
            if run.end_ns + step / 2 < t_ns <= run.end_ns + step / 2 + after:
                return timeline.AFTER
        return timeline.BASELINE

    # --- the work ----------------------------------------------------------------------------

    def poll(self, streams: Sequence[TokenStream], now_ns: float) -> list[PassiveEvent]:
        """Detect new runs, advance the pending ones; returns the events finished now."""
        self._note_own(streams)
        self._detect(streams, now_ns)
        done: list[PassiveEvent] = []
        s = self.settings
        for pending in list(self._pending):
            if pending.traces is None and not self._recover(pending, streams, now_ns):
                continue
            age = now_ns - pending.run.end_ns
            if (pending.seen_inputs == self._inputs and age < s.attribution_wait_s * 1e9
                    and not s.metrics_wait_s * 1e9 <= age < s.metrics_wait_s * 1e9 + 1e9):
                continue  # nothing new since it was last looked at, and no deadline passed
            pending.seen_inputs = self._inputs
            event = self._attribute(pending, now_ns)
            if event is not None:
                self._pending.remove(pending)
                done.append(event)
        self._prune(now_ns)
        return done

    def _note_own(self, streams: Sequence[TokenStream]) -> None:
        """The first token of every probe stream: a restart the engine counts as a prefill."""
        for st in streams:
            if st.event_times_ns and st.request_id not in self._own_ids:
                self._own_ids[st.request_id] = None
                bisect.insort(self._own_firsts, float(st.event_times_ns[0]))

    def _detect(self, streams: Sequence[TokenStream], now_ns: float) -> None:
        """Add the steps settled since the last poll (every cluster but the newest), then find
        the runs among the last `DETECT_SPAN_S` of steps."""
        s = self.settings
        since = max(self._settled_ns, now_ns - DETECT_SPAN_S * 1e9)
        events, before = [], []
        warmup = s.window.warmup_tokens
        for st in streams:  # (no copy of a whole stream: a poll reads only its last events)
            times, tokens = st.event_times_ns, st.event_tokens
            n = min(len(times), len(tokens))
            if n < 2 or times[n - 1] <= since:
                continue
            i0 = max(0, bisect.bisect_right(times, since, 0, n) - 1)  # the event the first new interval starts at
            events.append((times[i0:n], tokens[i0:n]))
            before.append(i0 if i0 > warmup else sum(tokens[:i0]))  # i0 events: >= i0 tokens
        if not events:
            self._open_from = None
            return
        rough_ms = self._step_ms or float(np.median(np.concatenate(
            [np.diff(np.asarray(t[-64:], dtype=np.float64)) for t, _ in events]))) / 1e6
        fresh = probe_steps(events, rough_ms, warmup_tokens=warmup, since_ns=since, tokens_before=before)
        if len(fresh) > 1:
            self._steps.extend(fresh[:-1])
            self._settled_ns = fresh[-2].last_ns
        horizon = now_ns - DETECT_SPAN_S * 1e9
        while self._steps and self._steps[0].end_ns < horizon:
            self._steps.popleft()
        steps = list(self._steps)
        if len(steps) < 8:
            return
        if self._theta_ms is None or len(fresh) > 1 and self._steps_since_stats >= 32:
            # the slow threshold of the recent steps (refreshed every 32 settled steps)
            stats = baseline_from_lengths(np.asarray([st.duration_ms for st in steps]) * 1e6)
            assert stats is not None
            self._step_ms, self._theta_ms = stats.p50_ms, stats.slow_threshold_ms(s.window)
            self._steps_since_stats = 0
        self._steps_since_stats += max(0, len(fresh) - 1)
        step_ms, theta = self._step_ms, self._theta_ms
        assert step_ms is not None
        half = step_ms * 1e6 / 2
        self._open_from = None
        for run in slow_runs(steps, theta, bridge_steps=s.bridge_steps):
            if run.end_ns <= self._last_end + half:
                continue
            if not run.closed:
                self._open_from = run.start_ns
                break
            self._last_end = run.end_ns
            self._runs.append(run)
            self._run_ends.append(run.end_ns)
            self._pending.append(_Pending(run, now_ns, step_ms))
        latest = fresh[-1].last_ns if fresh else steps[-1].last_ns
        if self._open_from is None and now_ns - latest > theta * 1e6:
            self._open_from = latest  # a slow step is in progress right now

    def _recover(self, pending: _Pending, streams: Sequence[TokenStream], now_ns: float) -> bool:
        """Wait for the probes' recovery intervals; then keep the traces and the baseline."""
        s = self.settings
        run = pending.run
        w_end = run.end_ns + pending.step_ms * 1e6 / 2
        across = [st for st in streams if st.event_times_ns and st.t_sent_ns is not None
                  and st.event_times_ns[0] <= run.start_ns and not (st.finished and (st.t_finished_ns or 0) <= w_end)]

        def recovered(st: TokenStream) -> bool:
            return st.finished or sum(1 for t in st.event_times_ns[-(s.window.after_intervals + 1):] if t > w_end) \
                > s.window.after_intervals

        if not all(recovered(st) for st in across) and now_ns - run.end_ns < s.recovery_wait_s * 1e9:
            return False
        keep = s.window.warmup_tokens + 64
        pending.traces = [trim_trace(StreamTrace.of(st), int(run.start_ns), keep) for st in across]
        pending.open_probes = len(across)
        self._keep_quiet(pending, streams)
        return True

    def _keep_quiet(self, pending: _Pending, streams: Sequence[TokenStream]) -> None:
        """The quiet-period rule ending at the run's start, with every other run's window left out
        (production prefills come often; a baseline that had to wait for a run-free stretch
        would rarely have one): the events it needs are kept now (a stream may be gone later),
        the statistics are computed only for a run that is analysed."""
        run = pending.run
        start = run.start_ns - self.settings.baseline_span_s * 1e9
        i = bisect.bisect_left(self._run_ends, start)
        pending.windows = [
            (r.start_ns, r.end_ns + pending.step_ms * 1e6 / 2)
            for r in itertools.islice(self._runs, i, None)
            if r.start_ns < run.start_ns
        ]
        pending.quiet = []
        for st in streams:  # (as `_detect`: no copy of a whole stream, only the slice kept)
            times, tokens = st.event_times_ns, st.event_tokens
            n = min(len(times), len(tokens))
            if n < 2 or times[n - 1] <= start or times[0] > run.start_ns:
                continue
            i0 = max(0, bisect.bisect_right(times, start, 0, n) - 1)
            i1 = bisect.bisect_right(times, run.start_ns, 0, n)
            pending.quiet.append((times[i0:i1], tokens[i0:i1], sum(tokens[:i0])))

    # --- attribution -------------------------------------------------------------------------

    def _neighbours(self, run: SlowRun) -> tuple[float, float]:
        """The ends of the runs just before and after this one (every run counts, attributed or not)."""
        i = bisect.bisect_left(self._run_ends, run.end_ns)
        previous = self._run_ends[i - 1] if i > 0 else -math.inf
        following = self._run_ends[i + 1] if i + 1 < len(self._run_ends) else math.inf
        return previous, following

    def _bracket(self, pending: _Pending) -> tuple[Scrape | None, Scrape | None]:
        """The scrapes just before and just after the run's end with no other run's end between."""
        run = pending.run
        margin = pending.step_ms * 1e6 / 2
        previous, following = self._neighbours(run)
        i = bisect.bisect_left(self._scrape_t0, run.end_ns - margin)
        before = after = None
        for sc in reversed(list(itertools.islice(self._scrapes, max(0, i - 4), i))):
            if sc.t1_ns < run.end_ns - margin:
                before = sc if previous + margin < sc.t0_ns else None
                break
        for sc in itertools.islice(self._scrapes, i, None):
            if sc.t0_ns > run.end_ns + margin:
                after = sc if sc.t1_ns < following - margin else None
                break
        return before, after

    def _own_restarts(self, t0: float, t1: float) -> int:
        return bisect.bisect_right(self._own_firsts, t1) - bisect.bisect_right(self._own_firsts, t0)

    def _attribute(self, pending: _Pending, now_ns: float) -> PassiveEvent | None:
        s = self.settings
        run = pending.run
        step_ns = pending.step_ms * 1e6
        age = now_ns - run.end_ns
        otlp = metrics = None
        if "otlp" in s.sources:
            lo = bisect.bisect_left(self._prefills, run.start_ns - step_ns / 2, key=lambda r: r.first_token_ns)
            hi = bisect.bisect_right(self._prefills, run.end_ns + 1.5 * step_ns, key=lambda r: r.first_token_ns)
            otlp = attribute_traces(run, self._prefills[lo:hi], 1.5 * step_ns) if hi > lo else None
        before, after = self._bracket(pending)
        metrics_known = False
        if "metrics" in s.sources and before is not None and after is not None:
            own = self._own_restarts(before.t1_ns, after.t0_ns)
            metrics = attribute_metrics(before.snapshot, after.snapshot, own, own * s.probe_prompt_tokens)
            metrics_known = all(sc.snapshot.get(name) is not None for sc in (before, after)
                                for name in ("time_to_first_token_seconds_count", "prompt_tokens_total"))
        if "metrics" in s.sources and after is None and self._scrapes and age < s.metrics_wait_s * 1e9:
            return None  # a scrape after the run is on its way (the tracker asked for one)
        # production prefills that ended in the run, by the engine's counters (None: unknown)
        expected = metrics.prefills if metrics is not None else (0 if metrics_known else None)
        deadline = age >= s.attribution_wait_s * 1e9
        traces_on = "otlp" in s.sources and self.traces_seen > 0
        metrics_on = "metrics" in s.sources and self._counters_seen
        choice: Attribution | None = None
        event = PassiveEvent(run, "unattributed", detected_ns=pending.detected_ns, finalised_ns=now_ns)
        if otlp is not None:
            if (expected is None or expected > otlp.prefills) and not deadline:
                return None  # spans of requests still decoding may be on their way
            # The engine's counters outrank spans, which anyone who reaches the receiver can post:
            # spans claiming more prefills than the counters saw (a forged or replayed one) cannot
            # turn a single prefill into "merged", nor an engine stall into a prefill.
            choice = metrics if expected is not None and expected != otlp.prefills else otlp
            if choice is otlp and otlp.prefills > 1:
                choice = self._joint(run, otlp, step_ns) or otlp
        elif traces_on and not deadline and expected != 0:
            return None  # a span may still come (its request is still decoding)
        elif metrics is not None:
            choice = metrics
        elif not traces_on and not metrics_known and metrics_on:
            event.outcome = "ambiguous"  # no pair of scrapes isolates this run, and no trace
        near_own = self._own_restarts(run.start_ns - step_ns / 2, run.end_ns + 1.5 * step_ns) > 0
        if choice is None and not traces_on and not metrics_known and not metrics_on and not near_own:
            choice = self._cadence(pending)  # the only source there is
        if choice is None:
            if near_own:
                event.outcome = "own-probe"
            return event
        return self._analyse(pending, event, choice, now_ns)

    def _joint(self, run: SlowRun, otlp: Attribution, step_ns: float) -> Attribution | None:
        """The run's traced prefills as one chunked stream, if the engine ran them as one (module
        docs); the requests looked at reach 10 s past the run (one still prefilling at its end)."""
        lo = bisect.bisect_left(self._prefills, run.start_ns - step_ns / 2, key=lambda r: r.first_token_ns)
        hi = bisect.bisect_right(self._prefills, run.end_ns + 10e9, key=lambda r: r.first_token_ns)
        rule = adapter(self.settings.engine).joint_prefill_tokens
        return joint_attribution(otlp, self._prefills[lo:hi], run, 1.5 * step_ns, rule)

    def _running(self, pending: _Pending, prefills: int) -> tuple[int, str]:
        """D and where it came from: a scrape during the run (its running requests include the
        run's prefills), else the last one before it, else the probes alone."""
        run = pending.run
        during = [sc for sc in self._scrapes if sc.t0_ns > run.start_ns and sc.t1_ns < run.end_ns
                  and sc.snapshot.get("num_requests_running") is not None]
        before = [sc for sc in self._scrapes if sc.t1_ns <= run.start_ns
                  and sc.snapshot.get("num_requests_running") is not None]
        if during:
            running, source = during[-1].snapshot.get("num_requests_running"), "metrics-during"
        elif before:
            running, source, prefills = before[-1].snapshot.get("num_requests_running"), "metrics-before", 0
        else:
            return pending.open_probes, "probes"
        return running_decodes(running, prefills, pending.open_probes), source

    def _cadence(self, pending: _Pending) -> Attribution | None:
        """P from the run's extra step time and the step-time model (module docs of measure.passive)."""
        base = pending.baseline(self.settings.window)
        if "cadence" not in self.settings.sources or self.cadence is None or base is None:
            return None
        b = self.settings.chunk_size
        d, _ = self._running(pending, 1)
        rule = adapter(self.settings.engine).chunk_rule  # the prompt tokens a step takes beside D decodes
        if rule.problem(b, d):
            return None
        scale = statistics.median(self._cadence_scale) if self._cadence_scale else 1.0
        model = self.cadence
        p = cadence_prompt_tokens(pending.run.excess_ms(base.p50_ms),
                                  lambda tokens: scale * float(sum(model(tokens, b, d))),
                                  len(pending.run.steps_ms) * rule.budget(b, d))
        return None if p is None else Attribution("cadence", p, 1)

    def _learn(self, pending: _Pending, attribution: Attribution, d: int) -> None:
        """Scale the step-time model by what a better source showed (single prefills only)."""
        base = pending.baseline(self.settings.window)
        if self.cadence is None or attribution.source == "cadence" or not attribution.single or base is None:
            return
        if adapter(self.settings.engine).budget_problem(self.settings.chunk_size, d):
            return
        predicted = float(sum(self.cadence(attribution.prompt_tokens, self.settings.chunk_size, d)))
        observed = pending.run.excess_ms(base.p50_ms)
        if predicted > 0 and observed > 0:
            self._cadence_scale.append(observed / predicted)

    def _analyse(self, pending: _Pending, event: PassiveEvent, attribution: Attribution,
                 now_ns: float) -> PassiveEvent:
        s = self.settings
        run = pending.run
        event.attribution = attribution
        d, d_source = self._running(pending, attribution.prefills)
        event.decode_batch_size, event.d_source = d, d_source
        pooled = pending.baseline(s.window)
        if pooled is None or pooled.n_intervals < s.min_baseline_intervals:
            event.outcome = "no-baseline"
            return event
        if adapter(s.engine).budget_problem(s.chunk_size, d):
            event.outcome = "no-budget"
            return event
        if attribution.source != "cadence":  # the cadence's answer beside the better source's (the comparison)
            shadow = self._cadence(pending)
            event.cadence_prompt_tokens = shadow.prompt_tokens if shadow is not None else None
        self._learn(pending, attribution, d)
        p = attribution.prompt_tokens
        event.d_bin, event.p_bin = bin_int(d, s.d_bins), bin_int(p, s.p_bins)
        t_inject, t_first = int(run.start_ns), int(run.end_ns)
        schedule = expected_schedule(s.engine, p, s.chunk_size, d)
        assert pending.traces is not None
        baseline = pending.baseline(s.window)
        window = analyse_traces(pending.traces, t_inject, t_first, baseline, s.window.beside_traffic(), None, schedule,
                                engine=s.engine)
        self._seq += 1
        rid = attribution.request_ids[0] if attribution.request_ids else f"passive-{self._seq}"
        prefill = StreamTrace(rid, PRODUCTION_TAG, t_inject, [t_first], [1], p, None)
        interference = InterferenceRun(
            decode_batch_size=d, new_prefill_tokens=p, probes=pending.traces, prefill=prefill,
            t_inject_ns=t_inject, t_first_ns=t_first, window=window, baseline=baseline,
            baseline_rule=PASSIVE_BASELINE_RULE, schedule=schedule, salt="", engine=s.engine,
            anchor_ns=window_anchor_ns(s.engine, t_first, baseline, pending.traces),
        )
        event.run = interference
        event.finalised_ns = now_ns
        interference.extra["passive"] = {**event.info(), "chunk_size": s.chunk_size}
        event.rep = rep_record(0, interference, PointSpec(s.chunk_size, d, p), raw=None)
        if event.rep.derived.tpot_penalty_ms is None:  # no probe decoded a token in the window: nothing measured
            event.outcome = "no-window"
        elif not attribution.single and not attribution.joint:
            event.outcome = "merged"
        elif event.d_bin is None or event.p_bin is None:
            event.outcome = "out-of-bins"
        else:
            event.outcome = "joint" if attribution.joint else "published"
        return event

    def _prune(self, now_ns: float) -> None:
        horizon = now_ns - (self.settings.attribution_wait_s + self.settings.baseline_span_s + 30.0) * 1e9
        oldest = self._pending[0].run.start_ns if self._pending else now_ns
        keep_from = min(horizon, oldest - 30e9)
        cut = bisect.bisect_left(self._prefills, keep_from, key=lambda r: r.first_token_ns)
        if cut:
            del self._prefills[:cut]
        while self._scrapes and self._scrapes[0].t1_ns < keep_from:
            self._scrapes.popleft()
            self._scrape_t0.pop(0)
        while self._runs and self._runs[0].end_ns < keep_from:
            self._runs.popleft()
            self._run_ends.pop(0)
        cut = bisect.bisect_left(self._own_firsts, keep_from)
        if cut:
            del self._own_firsts[:cut]
        while len(self._own_ids) > 4096:
            self._own_ids.popitem(last=False)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def step_ms(self) -> float | None:
        return self._step_ms


def _pool_baseline(pending: _Pending, params: WindowParams) -> BaselineStats | None:
    """The baseline of a pending run from the events kept at its recovery (`_keep_quiet`): token
    intervals (`window.intervals`: past each stream's warm-up, merged events spread) ending in the
    quiet period and in no other run's window."""
    run = pending.run
    pooled = []
    # the other runs' windows (a, b], by start: an interval ending at t is in one when some window
    # starting before t reaches t (the furthest reach of those starting earlier, so overlaps count)
    windows = np.asarray(sorted(pending.windows or ()), dtype=np.float64).reshape(-1, 2)
    starts, reach = windows[:, 0], np.maximum.accumulate(windows[:, 1])
    for times, tokens, offset in pending.quiet or []:
        t = token_times(times, tokens)
        if t.size < 2:
            continue
        index = offset + np.arange(1, t.size)
        end = t[1:]
        keep = (index - 1 >= params.warmup_tokens) & (end <= run.start_ns)
        keep &= np.arange(1, t.size) >= tokens[0]  # the slice's first event only anchors the next one
        if len(windows):
            before = np.searchsorted(starts, end, side="left")  # windows with a < t
            keep &= ~((before > 0) & (reach[np.maximum(before - 1, 0)] >= end))
        pooled.append(np.diff(t)[keep])
    return baseline_from_lengths(np.concatenate(pooled)) if pooled else None


def step_model_cadence(profile: str, decode_context_tokens: int, engine: str) -> CadenceModel:
    """The embedded engine's step-time model (`sim.steptime`, profile `profile`) as the cadence
    source's prediction: the extra time, over a decode-only step of D decodes, of each step that
    runs a chunk of a P-token prefill (the engine's schedule) beside D decodes at
    `decode_context_tokens` (where the engine's decodes pause for a chunk, the whole chunk step)."""
    from pdexporter.sim.profile import load_profile
    from pdexporter.sim.steptime import StepComposition, StepTimeModel

    model = StepTimeModel(load_profile(profile))
    rules = adapter(engine)
    beside = rules.chunk_rule.decodes_in_chunk_step

    def predict(p: int, b: int, d: int) -> list[float]:
        decode = model(StepComposition.decode_batch(d, decode_context_tokens)) if d and beside else 0.0
        out, context = [], 0
        for c in rules.chunk_schedule(p, b, d):
            comp = StepComposition.of([(c, context)] + ([(1, decode_context_tokens)] * d if beside else []))
            out.append((model(comp) - decode) * 1e3)
            context += c
        return out

    return predict


__all__ = ["OUTCOMES", "PassiveEvent", "PassiveSettings", "PassiveTracker", "Scrape", "step_model_cadence"]
