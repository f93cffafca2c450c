"""Passive windows: the production prefills the probes saw, found without injecting anything. Pure.

An injected window starts at t_inject and ends at its prefill's first token; a passive window
has neither, so it is defined by what the probes saw: a run of slow engine steps. Everything
after that is the window maths of `measure.window` (`analyse_window` with the run's start as
t_inject and its end as t_first, and the engine's chunk schedule for the prefill once its P is
known): nothing here re-derives a window number.

Steps. Every engine step hands each running probe one token (several in one event when the
front end merged them), so the probes' token events cluster in time: a new cluster starts where
consecutive event arrivals, all streams merged, are more than half a baseline step apart (the
rule of `exporter.timeline.step_spreads_ns`). A cluster is one step; its time is the median
arrival, its duration the median over streams of the event interval ending in it (a merged
event is one interval: one emission, one step, as `measure.window` locates chunk steps). Each
stream's first `warmup_tokens` tokens are left out, as everywhere.

Slow runs. A step is slow when its duration exceeds the baseline's slow threshold (the window
maths' theta: p50 + max(20 % p50, 5 MAD)). A run is a maximal sequence of slow steps in which at
most `bridge_steps` (1) normal steps separate two slow ones: a prefill's tail chunk of a few
tokens runs like a decode step between its last big chunk and the retirement stall. The run
opens at the end of the last normal step before its first slow step (`start_ns`, the surrogate
of t_inject: every interval of the run ends after it) and closes at the end of its last slow
step (`end_ns`, the surrogate of t_first: the step that runs a prefill's last chunk emits its
first token together with the decodes' tokens). A run is complete (`closed`) once more than
`bridge_steps` normal steps followed it; a run at the very start of the data (no normal step
before it) is dropped: its start is not known.

Attribution: which production prefills ended in a run, and their prompt tokens P. Sources, best
first; each event says which one it used:

- `otlp`: vLLM's request traces (one `llm_request` span per finished request, `client.traces`):
  a request belongs to the run when its first token (arrival + TTFT, converted to the probes'
  clock) falls in (start_ns, end_ns + tolerance]. P is its prompt tokens (cached ones included:
  vLLM 0.22's span does not say how many were cached).
- `metrics`: two scrapes of the engine's /metrics bracketing the run's end, with no other run's
  end between them: P is the rise of `prompt_tokens_total`, the number of prefills the rise of
  `time_to_first_token_seconds_count` (both move when a request's first token comes out), minus
  what the exporter's own probe restarts added in between.
- `cadence`: the slow steps alone. P is the prompt whose chunk schedule (the engine adapter's
  `chunk_schedule(P, B, D)`), each chunk step's extra time given by a step-time model scaled by
  what the other sources taught it, adds up to the run's extra time over decode-only steps
  (`cadence_prompt_tokens`; the sum, not step by step: under async scheduling a chunk's launch
  holds back the step before it, so its cost shows in two steps); the run counts as one prefill,
  and then the window maths locates its chunk steps with that schedule like any other. A step
  bound by the engine's kernel launches costs the same for any chunk up to ~2K tokens on vLLM
  (and a CUDA-graph step the same for any chunk below the capture size), so there the cadence
  cannot tell P apart: it takes the middle of the prompts that explain the run equally well.

Joint events. At load, prefills run back to back and one run of slow steps holds several of them
(the traces name them all). Such a run is no f(D, P, B) point of one prefill, but where the
engine's scheduler runs waiting prefills through the same token budget as one chunked stream
(vLLM: its adapter's `joint_prefill_tokens`), the decodes saw the chunk steps of one prefill of
the summed prompt tokens (its chunk count, launches and tokens), but not its attention: each
prompt's tokens attend only within their own prompt. `joint_attribution` turns the run into one
event of P = the sum, marked `joint` with its prefill count and each prefill's prompt tokens in
stream order (`Attribution.prompt_sizes`; the record's `prompt_sizes`), which the event model
prices the attention of (`analysis.passive_model`, "Joint events"). What such an event cannot say
is how the stalls split (each of its k prefills has its own first-token step): the event model
counts them apart and widens the intervals of the cells they stand in. It takes traces: the
counters alone do not say when each prefill was admitted.

D is the engine's running decodes (`vllm:num_requests_running`, not only the probes): from a
scrape taken while the run was in progress (minus the prefills then running, which vLLM counts
as running too) or else the last one before it, never fewer than the open probe streams.

Binning. Production prompts come in every length, a table has a few: P (and D) are binned to the
nearest value of a grid on a log scale: the bin of grid value g_i spans from the geometric mean
of g_(i-1) and g_i to that of g_i and g_(i+1); the first and last bins extend as far on their
outer side as on their inner one (for a doubling grid, every bin is g/sqrt(2) .. g*sqrt(2)).
Values outside every bin are not tabulated. D = 0 only bins to a grid value 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pdexporter.client.metrics import MetricsSnapshot

# The exporter's label bins for passive windows (bounded label values; `export-table --grid`
# re-bins them to a sweep's grid). Both hold the seed's values.
P_BINS: tuple[int, ...] = tuple(2**k for k in range(7, 18))  # 128 .. 131072
D_BINS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)

SOURCES = ("otlp", "metrics", "cadence")
JOINT_DIR = "joint"  # joint events' records, beside the published ones (`run --passive --out DIR`: DIR/joint/)
MERGED_DIR = "merged"  # merged events' records (DIR/merged/): kept for a later rule, read by no model
REQUESTS_LOG = "requests.jsonl"  # every production prefill the traces told (DIR/requests.jsonl)

# ((scheduled, first token, prompt tokens) of each prefill, ns; a step, ns) -> the prompt tokens of
# the one chunked stream the engine ran them as, or None (an engine adapter's `joint_prefill_tokens`)
JointRule = Callable[[Sequence[tuple[float, float, int]], float], int | None]


@dataclass(frozen=True)
class ProbeStep:
    """One engine step as the probes saw it."""

    end_ns: float  # median arrival of its tokens across streams
    duration_ms: float  # median over streams of the event interval ending here
    streams: int
    last_ns: float = math.nan  # the last arrival in it


@dataclass(frozen=True)
class SlowRun:
    """A run of slow steps (module docs)."""

    start_ns: float  # end of the last normal step before the run
    end_ns: float  # end of the run's last slow step
    steps_ms: tuple[float, ...]  # every step from the first slow one to the last, in order
    slow_steps: int
    steps_after: int  # normal steps seen after it so far
    bridge_steps: int = 1

    @property
    def closed(self) -> bool:
        return self.steps_after > self.bridge_steps

    def excess_ms(self, baseline_ms: float) -> float:
        """The run's extra time over decode-only steps (what the prefill cost one decode)."""
        return float(sum(max(0.0, s - baseline_ms) for s in self.steps_ms))


def probe_steps(
    streams: Sequence[tuple[Sequence[int], Sequence[int]]],
    step_ms: float,
    *,
    warmup_tokens: int = 16,
    since_ns: float = -math.inf,
    tokens_before: Sequence[int] | None = None,
) -> list[ProbeStep]:
    """Engine steps from the probes' (event times, event tokens), ending after `since_ns` (module
    docs). A stream may be given from an event on: `tokens_before` says how many of its tokens
    came before the first event given (for the warm-up)."""
    ends: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    for k, (times, tokens) in enumerate(streams):
        n = min(len(times), len(tokens))
        if n < 2:
            continue
        t = np.asarray(times[:n], dtype=np.float64)
        # the tokens before each event
        before = np.cumsum(np.concatenate(([0], np.asarray(tokens[: n - 1], dtype=np.int64))))
        if tokens_before is not None:
            before += tokens_before[k]
        keep = (before[1:] >= warmup_tokens + 1) & (t[1:] > since_ns)  # both ends past the warm-up
        if keep.any():
            ends.append(t[1:][keep])
            lengths.append(np.diff(t)[keep])
            owners.append(np.full(int(keep.sum()), k))
    if not ends:
        return []
    end = np.concatenate(ends)
    length = np.concatenate(lengths)
    owner = np.concatenate(owners)
    order = np.argsort(end, kind="stable")
    end, length, owner = end[order], length[order], owner[order]
    group = np.concatenate(([0], np.cumsum(np.diff(end) > step_ms * 1e6 / 2)))
    # One stream's events within one step (two emissions read back to back) are one interval.
    by = np.lexsort((owner, group))
    g, o, lengths_sorted = group[by], owner[by], length[by]
    first_of = np.concatenate(([True], (g[1:] != g[:-1]) | (o[1:] != o[:-1])))
    starts = np.nonzero(first_of)[0]
    per_stream = np.add.reduceat(lengths_sorted, starts)
    per_group = g[starts]
    counts = np.bincount(per_group, minlength=int(group[-1]) + 1)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    low, high = first + (counts - 1) // 2, first + counts // 2  # the middle one or two of each step
    ordered = per_stream[np.lexsort((per_stream, per_group))]
    lengths_mid = (ordered[low] + ordered[high]) / 2
    arrivals = np.bincount(group)
    a_first = np.concatenate(([0], np.cumsum(arrivals)[:-1]))
    ends_mid = (end[a_first + (arrivals - 1) // 2] + end[a_first + arrivals // 2]) / 2
    last = end[a_first + arrivals - 1]
    return [ProbeStep(e, d / 1e6, c, z) for e, d, c, z in
            zip(ends_mid.tolist(), lengths_mid.tolist(), counts.tolist(), last.tolist())]


def slow_runs(steps: Sequence[ProbeStep], threshold_ms: float, *, bridge_steps: int = 1) -> list[SlowRun]:
    """The runs of slow steps (module docs), in time order; the last may still be open."""
    slow = [s.duration_ms > threshold_ms for s in steps]
    runs: list[SlowRun] = []
    i = 0
    n = len(steps)
    while i < n:
        if not slow[i]:
            i += 1
            continue
        first = last = i
        j = i + 1
        while j < n:
            if slow[j]:
                last = j
            elif j - last > bridge_steps:
                break
            j += 1
        if first > 0:
            runs.append(SlowRun(
                start_ns=steps[first - 1].end_ns,
                end_ns=steps[last].end_ns,
                steps_ms=tuple(s.duration_ms for s in steps[first : last + 1]),
                slow_steps=sum(slow[first : last + 1]),
                steps_after=n - 1 - last,
                bridge_steps=bridge_steps,
            ))
        i = last + 1
    return runs


# --- attribution ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestPrefill:
    """A production request's prefill as its trace tells it, on the probes' clock."""

    request_id: str
    prompt_tokens: int
    first_token_ns: float  # arrival + TTFT
    prefill_ms: float | None = None  # first token - scheduled


@dataclass(frozen=True)
class Attribution:
    """Which production prefills a run was, and from what source (module docs)."""

    source: str  # "otlp" | "metrics" | "cadence"
    prompt_tokens: int  # of a joint attribution: the one chunked stream's (the prefills' sum)
    prefills: int  # prefills that ended in the run: 1 is a single-prefill event
    request_ids: tuple[str, ...] = ()
    joint: bool = False  # several prefills the engine ran as one chunked stream (`joint_attribution`)
    # each prefill's prompt tokens, as `request_ids` (by first token: a joint one's stream order, the
    # engine's rule admitting them so);
    # () where the source does not tell them one by one (metrics, cadence)
    prompt_sizes: tuple[int, ...] = ()

    @property
    def single(self) -> bool:
        return self.prefills == 1


def attribute_traces(run: SlowRun, requests: Sequence[RequestPrefill], tolerance_ns: float) -> Attribution | None:
    """The requests whose first token fell in (start, end + tolerance]; None when there are none."""
    hits = [r for r in requests if run.start_ns < r.first_token_ns <= run.end_ns + tolerance_ns]
    if not hits:
        return None
    hits.sort(key=lambda r: r.first_token_ns)
    return Attribution("otlp", sum(r.prompt_tokens for r in hits), len(hits), tuple(r.request_id for r in hits),
                       prompt_sizes=tuple(r.prompt_tokens for r in hits))


def joint_attribution(attribution: Attribution, requests: Sequence[RequestPrefill], run: SlowRun,
                      tolerance_ns: float, stream_tokens: JointRule) -> Attribution | None:
    """Several traced prefills that ended in one run as one event (module docs, "Joint events"),
    or None where the run cannot be read as one stream of theirs: a prefill's admission unknown
    (no prefill time in its span) or before the run began (part of its cost fell before the
    run), another traced request still prefilling when the run ended (it shared the run's steps
    without ending there), or the engine's rule (`stream_tokens`: its adapter's
    `joint_prefill_tokens`) saying its scheduler did not run them as one chunked stream."""
    if attribution.prefills < 2 or len(attribution.request_ids) != attribution.prefills:
        return None
    ids = set(attribution.request_ids)
    hits = [r for r in requests if r.request_id in ids]
    if len(hits) != len(ids) or any(r.prefill_ms is None for r in hits):
        return None
    spans = [(r.first_token_ns - (r.prefill_ms or 0.0) * 1e6, r.first_token_ns, r.prompt_tokens) for r in hits]
    if min(s for s, _, _ in spans) < run.start_ns - tolerance_ns:
        return None
    for r in requests:
        if r.request_id not in ids and r.prefill_ms is not None and r.first_token_ns > run.end_ns + tolerance_ns \
                and r.first_token_ns - r.prefill_ms * 1e6 < run.end_ns:
            return None
    tokens = stream_tokens(spans, tolerance_ns)
    if tokens is None:
        return None
    size = {r.request_id: r.prompt_tokens for r in hits}  # in request_ids' order (first tokens'): the stream's
    return Attribution(attribution.source, tokens, attribution.prefills, attribution.request_ids, joint=True,
                       prompt_sizes=tuple(size[i] for i in attribution.request_ids))


def attribute_metrics(before: MetricsSnapshot, after: MetricsSnapshot, own_prefills: int,
                      own_prompt_tokens: int) -> Attribution | None:
    """The rise of the engine's prompt-token and first-token counters between two scrapes that
    bracket the run's end, less the exporter's own probe restarts. None when a counter is
    missing, went down (a restart) or shows no production prefill."""
    def rise(name: str) -> float | None:
        a, b = before.get(name), after.get(name)
        return None if a is None or b is None or b < a else b - a

    tokens, firsts = rise("prompt_tokens_total"), rise("time_to_first_token_seconds_count")
    if tokens is None or firsts is None:
        return None
    prefills = int(round(firsts)) - own_prefills
    prompt = int(round(tokens)) - own_prompt_tokens
    if prefills < 1 or prompt < 1:
        return None
    return Attribution("metrics", prompt, prefills)


def cadence_prompt_tokens(excess_ms: float, predict_excess_ms: Callable[[int], float], max_tokens: int,
                          candidates: int = 160, tie_ms: float = 1.0, tie_rel: float = 0.05) -> int | None:
    """The prompt length whose modelled extra step time (`predict_excess_ms(P)`: the sum over its
    chunk steps) matches the run's extra time `excess_ms` (module docs). Candidates are log-spaced
    from 1 to `max_tokens`; every P within `max(tie_ms, tie_rel * excess)` of the best match
    explains the run as well (a launch-bound step costs the same for any chunk up to ~2K tokens on
    vLLM), and their geometric middle is taken. None for a run with no extra time."""
    if excess_ms <= 0 or max_tokens < 1:
        return None
    grid = np.unique(np.round(np.geomspace(1, max_tokens, candidates)).astype(int))
    misses = np.abs(np.asarray([predict_excess_ms(int(p)) for p in grid], dtype=np.float64) - excess_ms)
    tie = max(tie_ms, tie_rel * excess_ms)
    if misses.min() > tie:
        return int(grid[int(np.argmin(misses))])  # nothing explains it well: the closest
    near = grid[misses <= misses.min() + tie]
    return int(round(float(np.exp(np.mean(np.log(near))))))


def running_decodes(running: float | None, prefills: int, open_probes: int) -> int:
    """D from the engine's running requests (module docs): minus the prefills it counts as
    running too, never fewer than the probes that were decoding."""
    if running is None:
        return open_probes
    return max(open_probes, int(round(running)) - prefills)


# --- binning -------------------------------------------------------------------------------------


def log_bin(value: float, grid: Sequence[float]) -> float | None:
    """The grid value whose log-scale bin holds `value` (module docs), or None outside them all."""
    values = sorted(set(float(g) for g in grid))
    if value == 0:
        return 0.0 if 0.0 in values else None
    positive = [g for g in values if g > 0]
    if value < 0 or not positive:
        return None
    if len(positive) == 1:
        return positive[0] if value == positive[0] else None
    logs = np.log(positive)
    edges = np.r_[2 * logs[0] - (logs[0] + logs[1]) / 2, (logs[1:] + logs[:-1]) / 2,
                  2 * logs[-1] - (logs[-1] + logs[-2]) / 2]
    x = math.log(value)
    if x < edges[0] or x >= edges[-1]:
        return None
    return positive[int(np.searchsorted(edges, x, side="right")) - 1]


def bin_int(value: float, grid: Sequence[int]) -> int | None:
    got = log_bin(value, grid)
    return None if got is None else int(got)


__all__ = [
    "Attribution", "D_BINS", "JOINT_DIR", "JointRule", "MERGED_DIR", "P_BINS", "ProbeStep", "REQUESTS_LOG",
    "RequestPrefill", "SOURCES", "SlowRun", "attribute_metrics", "attribute_traces", "bin_int",
    "cadence_prompt_tokens", "joint_attribution", "log_bin", "probe_steps", "running_decodes", "slow_runs",
]
