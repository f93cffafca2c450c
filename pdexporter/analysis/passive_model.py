"""Passive mode's answer: the cost model fitted on production prefills, event by event. Pure.

A passive cell's median needs many events in that one cell (hours of traffic); the cost model
does not. Every published passive event (`exporter.passive`) holds what the injected model's fit
uses from a repetition: the engine's running decodes D and the prefill's exact prompt P (not
their bins), the chunk size B, the chunk steps the window maths located with their times and the
baseline they are compared to, and the interference per decode stream. So each event is one
"grid point" of `analysis.models.FitData` at its own exact (B, D, P), and
`analysis.models.fit_context_model` (the injected table's fitter, unchanged: Huber fit of
pi_k = alpha0 + alpha1 D + gamma c_k + beta q_k on every mixed step, standard errors clustered
on the event, then the stalls sigma0 + sigma1 P on what the steps leave of each event's total)
fits it. The table, the verdict (decision.json) and the dashboards are derived from that model.

Which events: single-prefill events (`published`) with D >= 1 and P inside the span of the
prediction grid's P bins (`measure.passive.log_bin`: for the seed's 512 .. 32768, 362 .. 46341
tokens). The linear step cost describes one regime: a prefill far below the grid's smallest P
runs its chunk as a CUDA-graph step (vLLM captures steps up to 512 tokens: ~5 ms where a chunk
above costs ~50 ms on the H200), and fitting those would bend the model for the cells it is
asked about. They are counted (`left_out`), not used.

Joint events: k prefills the engine ran as one chunked stream (`measure.passive.joint_attribution`)
are one event of the summed P, its chunk schedule that stream's: the chunk count, each step's launch
floor and tokens are the stream's. Attention is not: each prompt's tokens attend only within their
own prompt, so the event's attention pairs are its prompts' own (sum_i P_i (P_i + 1) / 2, each chunk
split at the prompts' boundaries: `analysis.models.stream_pairs`), 34-100 % of the summed P's on the
H200 runs; priced as one prompt of the summed P they pulled the token-pair slope down and the
compute-bound cells read ~10 % low (results/...-passive-s18/RUN.md). The prompt sizes come from the
record (`prompt_sizes`), or for records written before it, from the run's requests.jsonl by the
event's request ids (`joint_prompts`); an event whose sizes neither gives is priced as one prompt of
the sum, as before (passive_compare.md says how many). A table cell is one prompt of P: its
prediction is unchanged. The stalls (sigma0 + sigma1 P) stay the stream's, one per event, and the
intervals of the cells joint events stand in are widened for the k - 1 further first-token stalls
(`joint_widening`).

Intervals: a percentile bootstrap over events (`BOOTSTRAP`, seeded): the events are resampled
with replacement, the same fitter refits each sample, and every prediction's 95 % interval is
taken over the refits. The events of one run are independent draws of production traffic, so
the interval narrows roughly as 1 / sqrt(events) as traffic comes. What moves between runs (the
host's launch speed, the engine's start state) no event of one run can see: given the campaign
variation `pdexporter validate` measured (held_out.json; `export-table --campaign-variation`),
each refit's prediction is multiplied by exp(s z_r) as decision.json's replicates are
(`campaigns.carry_variation`, s by the cell's `cost_regime`), so the table's intervals hold a
campaign the events never saw; the convergence series keeps the events' own half-widths.

Reach: a cell the traffic reaches is one the events surround. With the grid's log-scale bins,
the D bins (and the P bins) holding at least `min_events` events span a range; a cell whose D and
P both lie in those ranges is reached (the model interpolates there). Cells outside say why: D
below the decodes the engine ran (the exporter's probes alone decode N streams), D beyond the
concurrency the traffic reached, P beyond the published events' prompts (or below them: a long
prompt the load sent may still be missing, its slow steps shared with another prefill and not
published). Their predictions are extrapolations and are marked so.

Launch levels: a one-chunk eager prefill (P ~ 512-3000 on vLLM 0.22) is bound by the host's kernel
launches, and the host runs them at two levels (docs/analysis.md, "the launch-bound level": ~35-45
ms per decode at the fast one, ~60-85 at the slow one), switching between them over seconds to
minutes. An injected cell's few repetitions, measured within a minute, read one level; the events
of minutes of traffic read both, so `mixed` (the default) fits a launch term between the two and
predicts neither. The launch-bound one-chunk events' own chunk step says which level each ran at:
`launch_levels` fits two normal modes to their step's extra over the baseline and calls them two
levels only where they are clearly apart (Ashman's D > 2: means more than twice their pooled spread
apart, which one mode cut in two does not reach); each event belongs to its likelier mode.
`launch_level="slow"` (or "fast") fits on every event except the launch-bound one-chunk events of the
other mode: the cost of a prefill while the host runs its launches at that level. With no clear
split (one mode, or fewer than `MIN_LEVEL_EVENTS` such events) every event is used and the model says
so (`PassiveModel.levels`). Which level an injected reference will read is not something the events
can know; the level-resolved fits bound it. The level is the engine's own state, held for seconds, whose
share of a minute moves (GPU session 37); `recent_levels` counts the last minutes' events at each level,
what a live run publishes as the slow share (`pdexporter_passive_model_launch_slow_share`).

Level-matched scoring (`level_matched`; `passive_compare.py --launch-level matched`): the like-for-like
comparison with an injected table, never its headline figure. An injected repetition's chunk step says
which level it ran at as a passive event's does, so each injected cell the (mixed) model puts in the
launch-bound one-chunk regime has its repetitions read by the same classifier that split the events
(`LaunchLevels.level_of`: the same located-step rule, the same two fitted modes) and is compared with the
slow fit's estimate, the fast fit's, or both mixed in its repetitions' proportion (interval bounds
mixed alike); every other cell (not launch-bound, no clear two levels in the events, no repetition's
step read) keeps the mixed estimate. It answers whether the event model is right at the level the
reference happened to read; which level a future reference, or the next minute of production, will
run at the events cannot know, so the mixed fit stays the answer and its error the headline.

Convergence: `convergence` refits on the events of the first m minutes of traffic, for several
m, and says how many events each fit had, how wide its intervals were and, given the injected
table of the same engine, how far its predictions were from it on the reached cells (mean and
median absolute relative error of the aggregate interference).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from pdexporter._internal.durations import iso_epoch_s
from pdexporter.analysis.campaigns import carry_variation
from pdexporter.analysis.decision_eval import campaign_log_sd, chunk_context, cost_regime
from pdexporter.analysis.models import (
    CONTEXT_MODEL,
    ContextAwareModel,
    CostModel,
    FitData,
    FitReport,
    HeldOut,
    ModelFit,
    fit_context_model,
    predict_points,
    r_squared,
)
from pdexporter.measure.passive import log_bin

__all__ = [
    "BOOTSTRAP",
    "CONVERGENCE_BOOTSTRAP",
    "CONVERGENCE_MINUTES",
    "DEFAULT_D",
    "DEFAULT_P",
    "LAUNCH_LEVELS",
    "LEVEL",
    "MIN_EVENTS",
    "MIN_LEVEL_EVENTS",
    "PASSIVE_MODEL_JSON",
    "PASSIVE_TABLE_CSV",
    "TABLE_COLUMNS",
    "Cell",
    "Convergence",
    "Errors",
    "FitEvent",
    "Grid",
    "LaunchLevels",
    "LevelMatched",
    "MATCHED",
    "MatchedCell",
    "PassiveAnswer",
    "PassiveModel",
    "answer",
    "cell_table",
    "cells",
    "convergence",
    "decision_inputs",
    "event_fit_data",
    "events_from_records",
    "fit_passive_model",
    "halfwidth",
    "injected_errors",
    "injected_reps",
    "joint_prompts",
    "launch_levels",
    "level_matched",
    "passive_decision",
    "reach",
    "recent_levels",
    "traffic_seconds",
]

BOOTSTRAP = 200  # refits per interval
CONVERGENCE_BOOTSTRAP = 50  # per refit on the first minutes (only its median half-width is kept)
LEVEL = 0.95
MIN_EVENTS = 5  # a D or P bin with fewer events does not extend the reach
CONVERGENCE_MINUTES = (1.0, 2.0, 5.0, 10.0, 30.0)
LAUNCH_LEVELS = ("mixed", "slow", "fast")  # which launch level a fit's launch-bound one-chunk events ran at
MIN_LEVEL_EVENTS = 8  # launch-bound one-chunk events below which no level split is tried
LEVEL_WINDOW_S = 300.0  # the traffic `recent_levels` counts: the state's share moves minute to minute
# The seed's grid without D = 0 (which costs nothing): the default prediction grid.
DEFAULT_D = (1, 2, 4, 6, 8, 12)
DEFAULT_P = (512, 1024, 2048, 4096, 8192, 16384, 32768)
PASSIVE_MODEL_JSON = "passive_model.json"
PASSIVE_TABLE_CSV = "passive_table.csv"
TABLE_COLUMNS = (
    "chunk_size",
    "decode_batch_size",
    "new_prefill_tokens",
    "aggregate_interference_ms",
    "aggregate_interference_ms_ci95_low",
    "aggregate_interference_ms_ci95_high",
    "total_interference_ms",
    "relative_halfwidth",
    "events",
    "reached",
    "why_not_reached",
    "joint_events",
)

Key = tuple[int, int, int]


@dataclass(frozen=True)
class FitEvent:
    """What the fit needs of one published passive event."""

    chunk_size: int
    decode: int  # the engine's running decodes (exact)
    prompt: int  # the prefill's prompt tokens (exact)
    total_ms: float  # interference per decode stream
    baseline_ms: float | None
    chunk_steps_ms: tuple[float, ...]  # the located chunk steps' times, in order
    at_s: float = 0.0  # traffic time: seconds since the run's first event
    source: str | None = None
    cadence_prompt: int | None = None  # the P the probes' cadence alone gave (trace-based vs cadence-based)
    prefills: int = 1  # > 1: a joint event, several prefills one chunked stream of `prompt` tokens
    # the prompt tokens of the prefills it is made of, in the order the engine ran them (module docs,
    # "Joint events"); a single event's is (prompt,), and so is a joint event's whose prompts are unknown
    prompts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.prompts:
            object.__setattr__(self, "prompts", (self.prompt,))

    @property
    def own_prompts(self) -> bool:
        """A joint event priced by its own prompts (their sizes known), not as one prompt of the sum."""
        return len(self.prompts) > 1


@dataclass(frozen=True)
class Grid:
    """The cells to predict: chunk sizes x D x P."""

    chunk_sizes: tuple[int, ...]
    decode_batch_sizes: tuple[int, ...] = DEFAULT_D
    prefill_tokens: tuple[int, ...] = DEFAULT_P

    def cells(self) -> list[Key]:
        return [
            (b, d, p)
            for b in self.chunk_sizes
            for d in self.decode_batch_sizes
            if d >= 1
            for p in self.prefill_tokens
        ]

    def fits_prompt(self, p: float) -> bool:
        """From the grid's smallest P to the top of its largest P's bin (module docs)."""
        return p >= min(self.prefill_tokens) and log_bin(p, self.prefill_tokens) is not None


# --- events ------------------------------------------------------------------------------------


def joint_prompts(info: Mapping[str, Any], requests: Mapping[str, int] | None = None) -> tuple[int, ...]:
    """A joint event's prompt sizes in stream order (module docs, "Joint events"): its record's
    `prompt_sizes` (the exporter writes them, `exporter.passive.EventRecord.info`), else, for records
    written before, its `request_ids` looked up in `requests` (request id -> prompt tokens: the run's
    requests.jsonl, `analysis.job.request_prompts`); () where neither gives sizes adding up to its
    `prompt_tokens` (the event is then priced as one prompt of the sum)."""
    p = info.get("prompt_tokens")
    sizes = info.get("prompt_sizes")
    if not sizes and requests is not None:
        ids = info.get("request_ids") or []
        sizes = [requests.get(i) for i in ids]
    if not sizes or len(sizes) < 2 or any(not isinstance(x, int) or x < 1 for x in sizes) or sum(sizes) != p:
        return ()
    return tuple(int(x) for x in sizes)


def traffic_seconds(t: float, spans: Sequence[tuple[float, float]]) -> float:
    """Seconds of traffic up to wall time `t` (epoch s): the overlap of [-inf, t] with the spans
    (start, end) in which traffic ran (a spread run's passive segments; the injected blocks between
    them are not traffic)."""
    return sum(max(0.0, min(t, end) - start) for start, end in spans)


def events_from_records(records: Iterable[Any], requests: Mapping[str, int] | None = None,
                        spans: Sequence[tuple[float, float]] | None = None,
                        origin: float | None = None) -> list[FitEvent]:
    """The published events of passive records (`run --passive --out`: one repetition per event,
    its `passive` block holding the exact D and P); traffic time from the repetitions' `started_at`,
    seconds since the first event, counted inside `spans` only where they are given (`traffic_seconds`);
    since `origin` where given (0 and no spans: each event's start, epoch s). A joint event's prompts
    from its record, else from `requests` (`joint_prompts`)."""
    rows: list[tuple[float | None, FitEvent]] = []
    for record in records:
        if getattr(record.config, "mode", None) != "passive":
            continue
        for rep in record.reps:
            info = (rep.model_extra or {}).get("passive") or {}
            d, p, total = (
                info.get("decode_batch_size"),
                info.get("prompt_tokens"),
                rep.derived.total_interference_ms,
            )
            prefills = int(info.get("prefills") or 1)
            if d is None or p is None or total is None or (prefills != 1 and not info.get("joint")):
                continue
            rows.append(
                (
                    iso_epoch_s(rep.started_at),
                    FitEvent(
                        int(record.config.chunk_size),
                        int(d),
                        int(p),
                        float(total),
                        rep.baseline.tpot_p50_ms,
                        tuple(rep.interference.chunk_step_times_ms or ()),
                        0.0,
                        info.get("source"),
                        info.get("cadence_prompt_tokens"),
                        prefills,
                        joint_prompts(info, requests) if prefills > 1 else (),
                    ),
                )
            )
    def clock(t: float) -> float:
        return traffic_seconds(t, spans) if spans else t

    times = [clock(t) for t, _ in rows if t is not None]
    t0 = origin if origin is not None else min(times) if times else 0.0
    out = [FitEvent(**{**e.__dict__, "at_s": (clock(t) - t0) if t is not None else 0.0}) for t, e in rows]
    return sorted(out, key=lambda e: e.at_s)


def event_fit_data(events: Sequence[FitEvent]) -> FitData:
    """The events as `FitData` points, each at its own exact (B, D, P); its chunk steps are the
    fit's step rows when they line up with the engine's schedule (`analysis.models`)."""
    return FitData(
        chunk_size=np.array([e.chunk_size for e in events], np.float64),
        decode=np.array([e.decode for e in events], np.float64),
        prefill=np.array([e.prompt for e in events], np.float64),
        cost_ms=np.array([e.decode * e.total_ms for e in events], np.float64),
        total_ms=np.array([e.total_ms for e in events], np.float64),
        steps=tuple(
            ((e.baseline_ms, e.chunk_steps_ms),) if e.baseline_ms is not None and e.chunk_steps_ms else ()
            for e in events
        ),
        baseline_ms=np.array([np.nan if e.baseline_ms is None else e.baseline_ms for e in events], np.float64),
        prompts=tuple(e.prompts for e in events) if any(e.own_prompts for e in events) else None,
    )


def _resample(data: FitData, rows: list[np.ndarray], index: np.ndarray) -> FitData:
    """The points `index` (repeats allowed: a bootstrap sample) with their design rows."""
    assert data.design is not None
    return data.subset(index)


# --- launch levels -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchLevels:
    """The two launch levels the launch-bound one-chunk events ran at (module docs)."""

    events: int  # launch-bound one-chunk events
    split: bool  # two modes clearly apart (Ashman's D > 2)
    fast_ms: float | None = None  # median step extra over the baseline of each mode
    slow_ms: float | None = None
    separation: float | None = None  # Ashman's D
    fast: frozenset[int] = frozenset()  # indices (into the events given) of each mode's events
    slow: frozenset[int] = frozenset()
    # the two fitted modes (weights, means, variances, the upper one's index) and the model whose regimes
    # chose the launch-bound events: what `level_of` classifies any other chunk step by
    modes: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], int] | None = None
    model: ContextAwareModel | None = field(default=None, repr=False, compare=False)

    @property
    def slow_events(self) -> int:
        return len(self.slow)

    def launch_bound(self, decode: int, prompt: int, chunk_size: int) -> bool:
        """Whether a prefill of `prompt` tokens beside `decode` decodes is one eager chunk bound by the
        host's launches, by the model that chose the events (False without one)."""
        return self.model is not None and _launch_bound(self.model.document(), decode, prompt, chunk_size)

    def level_of(self, event: FitEvent) -> str | None:
        """"slow" or "fast": the level a launch-bound one-chunk event (a passive event, or an injected
        repetition as `injected_reps` gives it) ran at, by the same rule that split the events (its chunk
        step's extra over the baseline, the likelier of the two fitted modes); None where the levels are
        not clearly two, or it is not such an event, or its located step is not the chunk's."""
        if not self.split or self.modes is None or self.model is None:
            return None
        x = _level_extra(event, self.model.document())
        if x is None:
            return None
        weight, mean, var, hi = self.modes
        resp = _responsibility(np.array([x], np.float64), np.array(weight), np.array(mean), np.array(var))
        return "slow" if bool(resp[0, hi] >= 0.5) else "fast"

    def to_dict(self) -> dict[str, Any]:
        return {
            "launch_bound_one_chunk_events": self.events,
            "two_levels": self.split,
            "fast_level_step_extra_ms": _r(self.fast_ms, 3),
            "slow_level_step_extra_ms": _r(self.slow_ms, 3),
            "slow_level_events": self.slow_events,
            "ashman_d": _r(self.separation, 3),
        }


def _responsibility(x: np.ndarray, weight: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """Each value's probability of belonging to each of two normal modes."""
    like = weight / np.sqrt(2 * np.pi * var) * np.exp(-((x[:, None] - mean) ** 2) / (2 * var))
    return cast("np.ndarray", like / np.maximum(like.sum(axis=1, keepdims=True), 1e-300))


Modes = tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], int]


def _two_modes(x: np.ndarray, iterations: int = 200) -> tuple[np.ndarray, float, Modes | None]:
    """Two normal modes fitted to the values `x` (expectation-maximisation, started from the split of
    the sorted values that leaves the least spread within its two parts): which values belong to
    the upper mode (the likelier one), Ashman's D of the two modes (how many pooled spreads
    their means are apart; a single normal mode split in two gives D < 2), and the modes that
    assignment was made with (`_responsibility`; None where one mode emptied)."""
    v = np.sort(x)
    spread = [v[:i].var() * i + v[i:].var() * (v.size - i) for i in range(1, v.size)]
    cut = v[int(np.argmin(spread)) + 1]
    upper = x >= cut
    floor = 1e-6 * max(float(x.std()), 1e-9) ** 2
    mean = np.array([x[~upper].mean(), x[upper].mean()])
    var = np.array([max(x[~upper].var(), floor), max(x[upper].var(), floor)])
    weight = np.array([(~upper).mean(), upper.mean()])
    assigned = (weight, mean, var)
    for _ in range(iterations):
        resp = _responsibility(x, weight, mean, var)
        assigned = (weight, mean, var)
        n = resp.sum(axis=0)
        if np.any(n < 1e-9):
            return np.ones(x.size, bool), 0.0, None
        mean = (resp * x[:, None]).sum(axis=0) / n
        var = np.maximum((resp * (x[:, None] - mean) ** 2).sum(axis=0) / n, floor)
        weight = n / x.size
    hi = int(np.argmax(mean))
    upper = resp[:, hi] >= 0.5
    modes = (*(tuple(float(a) for a in arr) for arr in assigned), hi)
    return upper, float(math.sqrt(2) * abs(mean[1] - mean[0]) / math.sqrt(var.sum())), cast("Modes", modes)


def _launch_bound(doc: Mapping[str, Any], decode: int, prompt: int, chunk_size: int) -> bool:
    """One eager chunk whose launch term is at least its GPU work (`decision_eval.cost_regime`)."""
    ctx = chunk_context(doc, decode, prompt, chunk_size)
    return bool(ctx["n"] == 1 and ctx["eager_chunks"] == 1 and cost_regime(doc, ctx) == "launch")


def _level_extra(e: FitEvent, doc: Mapping[str, Any]) -> float | None:
    """A launch-bound one-chunk event's chunk step extra over its baseline: what says its level; None
    where it is not such an event, or its one located step holds less than half of its loss (not the
    chunk's step: a decode-like step the window maths took for it)."""
    if e.baseline_ms is None or len(e.chunk_steps_ms) != 1 or e.decode < 1 or e.chunk_size <= e.decode:
        return None
    x = e.chunk_steps_ms[0] - e.baseline_ms
    return x if _launch_bound(doc, e.decode, e.prompt, e.chunk_size) and x >= e.total_ms / 2 else None


def launch_levels(events: Sequence[FitEvent], grid: Grid, model: ContextAwareModel | None = None) -> LaunchLevels:
    """Which launch level each launch-bound one-chunk event ran at (module docs). Launch-bound by
    `model` (the fit on every event, when not given): one eager chunk whose launch term is at least
    its GPU work (`decision_eval.cost_regime`); its level from its one located chunk step, where that
    step holds at least half of the event's loss (`_level_extra`). The result classifies any other
    such chunk step by the same modes (`LaunchLevels.level_of`: an injected repetition's)."""
    if model is None:
        fitted = fit_passive_model(events, grid, bootstrap=0)
        if fitted is None:
            return LaunchLevels(0, False)
        model = fitted.model
    doc = model.document()
    index, extra = [], []
    for i, e in enumerate(events):
        x = _level_extra(e, doc)
        if x is not None:
            index.append(i)
            extra.append(x)
    if len(extra) < MIN_LEVEL_EVENTS:
        return LaunchLevels(len(extra), False, model=model)
    values = np.asarray(extra, np.float64)
    upper, separation, modes = _two_modes(values)
    if upper.all() or not upper.any():
        return LaunchLevels(len(extra), False, separation=separation, model=model)
    return LaunchLevels(
        len(extra), separation > 2.0, float(np.median(values[~upper])), float(np.median(values[upper])), separation,
        frozenset(i for i, u in zip(index, upper) if not u), frozenset(i for i, u in zip(index, upper) if u),
        modes, model,
    )


def recent_levels(events: Sequence[FitEvent], levels: LaunchLevels, window_s: float = LEVEL_WINDOW_S
                  ) -> tuple[int, int] | None:
    """(fast, slow): the launch-bound one-chunk events of the last `window_s` seconds of traffic (before the
    latest event's `at_s`) at each level, by `levels`, the split of these same events (`launch_levels`);
    None where that split found no two clear levels."""
    if not levels.split or not events:
        return None
    cut = max(e.at_s for e in events) - window_s
    recent = {i for i, e in enumerate(events) if e.at_s >= cut}
    return len(levels.fast & recent), len(levels.slow & recent)


def at_launch_level(events: Sequence[FitEvent], grid: Grid, level: str, levels: LaunchLevels | None = None
                    ) -> tuple[list[FitEvent], LaunchLevels | None]:
    """The events a fit at `level` uses: every event but the launch-bound one-chunk events of the
    other level (all of them where the levels are not clearly two, or for "mixed"). `levels`: the
    split of these same events where the caller has it (`launch_levels`), else made here."""
    if level not in LAUNCH_LEVELS:
        raise ValueError(f"launch level {level!r}: one of {', '.join(LAUNCH_LEVELS)}")
    if level == "mixed":
        return list(events), None
    if levels is None:
        levels = launch_levels(events, grid)
    if not levels.split:
        return list(events), levels
    drop = levels.fast if level == "slow" else levels.slow
    return [e for i, e in enumerate(events) if i not in drop], levels


# --- the model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassiveModel:
    """The context-aware model fitted on events, with its bootstrap refits."""

    model: ContextAwareModel
    events: int  # events the fit used
    left_out: int  # events outside the grid's P span
    draws: tuple[ContextAwareModel, ...] = field(repr=False, default=())
    d_range: tuple[int, int] = (0, 0)  # of the events used
    p_range: tuple[int, int] = (0, 0)
    minutes: float = 0.0  # traffic the events came from
    in_sample_r2: float | None = None
    launch_level: str = "mixed"  # the launch level its launch-bound one-chunk events ran at (module docs)
    levels: LaunchLevels | None = None  # the split that chose them (None: "mixed")

    def predict(self, d: Any, p: Any, b: Any) -> np.ndarray:
        return self.model.predict(d, p, b)

    def interval(self, d: Any, p: Any, b: Any, level: float = LEVEL,
                 variation: Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Percentile bootstrap interval of the prediction (NaN without refits); with `variation`
        (the campaign variation `pdexporter validate` measured, `campaigns.load_variation`) each
        refit's prediction carries it as decision.json's replicates do (`campaigns.carry_variation`,
        s by the cell's `cost_regime`): the events of one run cannot see what moves between runs."""
        shape = np.broadcast(np.asarray(d), np.asarray(p), np.asarray(b)).shape
        if len(self.draws) < 2:
            return np.full(shape, np.nan), np.full(shape, np.nan)
        values = np.stack([m.predict(d, p, b) for m in self.draws])
        if variation:
            values = carry_variation(values, self.log_sd(d, p, b, variation))
        tail = (1 - level) / 2 * 100
        return np.percentile(values, tail, axis=0), np.percentile(values, 100 - tail, axis=0)

    def log_sd(self, d: Any, p: Any, b: Any, variation: Mapping[str, Any]) -> np.ndarray:
        """The colocated arm's campaign variation s at each (D, P, B), by the step that sets its cost."""
        doc = self.model.document()
        dd, pp, bb = np.broadcast_arrays(np.asarray(d), np.asarray(p), np.asarray(b))
        out = [campaign_log_sd(variation, "colocated", cost_regime(doc, chunk_context(doc, int(x), int(y), int(z))))
               for x, y, z in zip(dd.ravel(), pp.ravel(), bb.ravel())]
        return np.asarray(out, dtype=np.float64).reshape(dd.shape)

    def coefficients(self) -> list[dict[str, Any]]:
        out = []
        for k, c in enumerate(self.model.coefficients()):
            values = [m.coefficients()[k].value for m in self.draws]
            values = [v for v in values if not math.isnan(v)]  # an unmeasured coefficient (kappa) has none
            low, high = np.percentile(values, [2.5, 97.5]).tolist() if len(values) >= 2 else (None, None)
            out.append({**c.to_dict(), "ci95_low": low, "ci95_high": high})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.to_dict(),
            "coefficients": self.coefficients(),
            "events_used": self.events,
            "events_left_out": self.left_out,
            "bootstrap_refits": len(self.draws),
            "decode_batch_size_range": list(self.d_range),
            "new_prefill_tokens_range": list(self.p_range),
            "traffic_minutes": round(self.minutes, 3),
            "in_sample_r2": self.in_sample_r2,
            "launch_level": self.launch_level,
            "launch_levels": self.levels.to_dict() if self.levels is not None else None,
            "fit": "analysis.models.fit_context_model on one point per event (exact D, P); "
            "intervals: percentile bootstrap over events",
        }


def fit_passive_model(
    events: Sequence[FitEvent], grid: Grid, *, bootstrap: int = BOOTSTRAP, seed: int = 0,
    launch_level: str = "mixed", levels: LaunchLevels | None = None,
) -> PassiveModel | None:
    """Fit on the events inside the grid's P span (module docs); None when none is usable. With
    `launch_level` "slow" or "fast", on those of them `at_launch_level` keeps (module docs, "Launch
    levels"; `levels`: these events' split where the caller has it): the events of the other level
    are counted as left out."""
    if launch_level != "mixed":
        kept, levels = at_launch_level(events, grid, launch_level, levels)
        fitted = fit_passive_model(kept, grid, bootstrap=bootstrap, seed=seed)
        if fitted is None:
            return None
        return dataclasses.replace(fitted, left_out=fitted.left_out + len(events) - len(kept),
                                   launch_level=launch_level, levels=levels)
    chunk = set(grid.chunk_sizes)
    usable = [
        e
        for e in events
        if e.decode >= 1
        and e.chunk_size in chunk
        and math.isfinite(e.total_ms)
        and grid.fits_prompt(e.prompt)
    ]
    left_out = len(events) - len(usable)
    if len(usable) < 4:
        return None
    data = event_fit_data(usable).with_design()
    try:
        model = fit_context_model(data)
    except (ValueError, np.linalg.LinAlgError):
        return None
    assert data.design is not None
    order = np.argsort(data.design.point, kind="stable")
    bounds = np.searchsorted(data.design.point[order], np.arange(len(data) + 1))
    rows = [order[bounds[i] : bounds[i + 1]] for i in range(len(data))]
    rng = np.random.default_rng([seed, len(usable)])
    draws = []
    for _ in range(bootstrap):
        index = rng.integers(0, len(usable), size=len(usable))
        try:
            draws.append(fit_context_model(_resample(data, rows, index)))
        except (ValueError, np.linalg.LinAlgError):
            continue
    r2 = r_squared(data.cost_ms, predict_points(model, data))
    return PassiveModel(
        model,
        len(usable),
        left_out,
        tuple(draws),
        (int(data.decode.min()), int(data.decode.max())),
        (int(data.prefill.min()), int(data.prefill.max())),
        max(e.at_s for e in usable) / 60.0,
        r2,
    )


# --- reach and the table -----------------------------------------------------------------------


def _span(values: Iterable[float], grid: Sequence[int], min_events: int) -> tuple[int, int] | None:
    counts: dict[int, int] = {}
    for v in values:
        g = log_bin(v, grid)
        if g is not None:
            counts[int(g)] = counts.get(int(g), 0) + 1
    full = [g for g, n in counts.items() if n >= min_events]
    return (min(full), max(full)) if full else None


def reach(events: Sequence[FitEvent], grid: Grid, min_events: int = MIN_EVENTS) -> dict[Key, str | None]:
    """Per cell: None when the traffic reaches it, else why not (module docs)."""
    ds = [e.decode for e in events if e.decode >= 1]
    ps = [e.prompt for e in events]
    d_span = _span(ds, grid.decode_batch_sizes, min_events)
    p_span = _span(ps, grid.prefill_tokens, min_events)
    seen = {e.chunk_size for e in events}
    out: dict[Key, str | None] = {}
    d_text = f"{min(ds)}-{max(ds)}" if ds else "none"
    for b, d, p in grid.cells():
        why: list[str] = []
        if b not in seen:
            why.append(
                f"no event at B = {b} (the engine runs B = {', '.join(map(str, sorted(seen))) or 'none'})"
            )
        if d_span is None or d < d_span[0]:
            why.append(
                f"D = {d} below the decodes the engine ran (D {d_text} in the events: the exporter's probes "
                "decode beside every prefill)"
            )
        elif d > d_span[1]:
            why.append(
                f"D = {d} beyond the concurrency the traffic reached (D {d_text} in the events, bins with "
                f">= {min_events} events up to {d_span[1]})"
            )
        if p_span is None or p > p_span[1]:
            longest = max(ps) if ps else 0
            why.append(
                f"P = {p} beyond the published events' prompts (fewer than {min_events} events in its bin "
                f"and above, longest {longest} tokens)"
            )
        elif p < p_span[0]:
            why.append(
                f"P = {p} below the published events' prompts (fewer than {min_events} events in its bin "
                "and below)"
            )
        out[(b, d, p)] = "; ".join(why) if why else None
    return out


@dataclass(frozen=True)
class Cell:
    key: Key
    aggregate_ms: float
    low_ms: float | None
    high_ms: float | None
    events: int
    why_not: str | None
    joint_events: int = 0  # of `events`, joint ones

    @property
    def reached(self) -> bool:
        return self.why_not is None

    @property
    def relative_halfwidth(self) -> float | None:
        if self.low_ms is None or self.high_ms is None or not self.aggregate_ms:
            return None
        return (self.high_ms - self.low_ms) / 2 / abs(self.aggregate_ms)


def _events_per_cell(events: Sequence[FitEvent], grid: Grid) -> dict[Key, int]:
    counts: dict[Key, int] = {}
    for e in events:
        d, p = log_bin(e.decode, grid.decode_batch_sizes), log_bin(e.prompt, grid.prefill_tokens)
        if d is not None and p is not None:
            key = (e.chunk_size, int(d), int(p))
            counts[key] = counts.get(key, 0) + 1
    return counts


def joint_widening(model: PassiveModel, events: Sequence[FitEvent], grid: Grid) -> dict[Key, float]:
    """How much wider each cell's interval is made for the joint events it rests on, as a fraction
    of its bounds (0 without joint events). A joint event of k prefills is read as one stream of
    their summed prompt (`measure.passive.joint_attribution`), so its k - 1 further first-token
    stalls, sigma0 per decode each, are charged to one prefill's cost: its total may be too high
    by f = (k - 1) sigma0 / total. A cell is widened by the share of joint events among the events
    of its bin (among all events where its bin has none: the model interpolates it from them all)
    times the median f of the joint events: the bias they may carry, where they carry weight."""
    joint = [e for e in events if e.prefills > 1 and e.total_ms > 0]
    if not joint:
        return {}
    sigma0 = max(0.0, float(model.model.sigma0_ms))
    f = float(np.median([(e.prefills - 1) * sigma0 / e.total_ms for e in joint]))
    everything, joints = _events_per_cell(events, grid), _events_per_cell(joint, grid)
    overall = len(joint) / len(events)
    return {
        k: f * (joints.get(k, 0) / everything[k] if everything.get(k) else overall) for k in grid.cells()
    }


def cells(
    model: PassiveModel, events: Sequence[FitEvent], grid: Grid, min_events: int = MIN_EVENTS,
    variation: Mapping[str, Any] | None = None,
) -> list[Cell]:
    """Every cell of the grid, predicted, with its interval (the campaign variation carried when
    given), its events (binned) and its reach."""
    keys = grid.cells()
    if not keys:
        return []
    b, d, p = (np.array(col, np.float64) for col in zip(*keys))
    point = model.predict(d, p, b)
    low, high = model.interval(d, p, b, variation=variation)
    counts = _events_per_cell(events, grid)
    joints = _events_per_cell([e for e in events if e.prefills > 1], grid)
    wider = joint_widening(model, events, grid)
    reasons = reach(events, grid, min_events)
    return [
        Cell(
            k,
            float(point[i]),
            None if math.isnan(low[i]) else float(low[i]) * (1 - wider.get(k, 0.0)),
            None if math.isnan(high[i]) else float(high[i]) * (1 + wider.get(k, 0.0)),
            counts.get(k, 0),
            reasons[k],
            joints.get(k, 0),
        )
        for i, k in enumerate(keys)
    ]


def cell_table(rows: Sequence[Cell]) -> pd.DataFrame:
    """The passive table: one row per grid cell (`TABLE_COLUMNS`)."""
    records = []
    for c in rows:
        b, d, p = c.key
        records.append(
            {
                "chunk_size": b,
                "decode_batch_size": d,
                "new_prefill_tokens": p,
                "aggregate_interference_ms": round(c.aggregate_ms, 4),
                "aggregate_interference_ms_ci95_low": None if c.low_ms is None else round(c.low_ms, 4),
                "aggregate_interference_ms_ci95_high": None if c.high_ms is None else round(c.high_ms, 4),
                "total_interference_ms": round(c.aggregate_ms / d, 4),
                "relative_halfwidth": None
                if c.relative_halfwidth is None
                else round(c.relative_halfwidth, 4),
                "events": c.events,
                "reached": c.reached,
                "why_not_reached": c.why_not or "",
                "joint_events": c.joint_events,
            }
        )
    return pd.DataFrame(records, columns=list(TABLE_COLUMNS))


def halfwidth(rows: Sequence[Cell]) -> float | None:
    """How sure the answer is: the median relative half-width of the 95 % intervals over the
    reached cells (None when no cell is reached)."""
    values = [c.relative_halfwidth for c in rows if c.reached and c.relative_halfwidth is not None]
    return float(np.median(values)) if values else None


# --- against the injected table ----------------------------------------------------------------


@dataclass(frozen=True)
class Errors:
    cells: int
    mape: float | None
    median: float | None
    worst: float | None
    by_cell: dict[Key, float] = field(default_factory=dict)
    inside: int = 0  # of the cells with an interval, those whose injected value lies in it (coverage)
    with_interval: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "cells": self.cells,
            "mape": _r(self.mape),
            "median_abs_error": _r(self.median),
            "max_abs_error": _r(self.worst),
            "inside_interval": self.inside,
            "cells_with_interval": self.with_interval,
        }

    @property
    def coverage(self) -> str:
        """"k/n" of the compared cells whose injected value lies inside the prediction's interval."""
        return f"{self.inside}/{self.with_interval}" if self.with_interval else "-"


def injected_errors(rows: Sequence[Cell], injected: Mapping[Key, float]) -> Errors:
    """Relative error of the predicted aggregate interference against the injected table, over the
    reached cells it holds, and how many of those with an interval hold the injected value in it."""
    errs = {
        c.key: (c.aggregate_ms - injected[c.key]) / abs(injected[c.key])
        for c in rows
        if c.reached and c.key in injected and injected[c.key]
    }
    a = np.abs(list(errs.values()))
    if not a.size:
        return Errors(0, None, None, None, {})
    bounds = [(c.low_ms, c.high_ms, injected[c.key]) for c in rows
              if c.key in errs and c.low_ms is not None and c.high_ms is not None]
    inside = sum(1 for low, high, value in bounds if low <= value <= high)
    return Errors(int(a.size), float(a.mean()), float(np.median(a)), float(a.max()), errs, inside, len(bounds))


# --- level-matched scoring ---------------------------------------------------------------------


MATCHED = "matched"  # the scoring mode beside LAUNCH_LEVELS' fits (module docs, "Level-matched scoring")


def injected_reps(records: Iterable[Any]) -> dict[Key, list[FitEvent]]:
    """The injected (not passive) records' repetitions as events of their cell (its exact D and P, the
    repetition's baseline, located chunk steps and interference per stream): what
    `LaunchLevels.level_of` reads each repetition's launch level from. A repetition's `at_s` is its
    start (epoch s; 0 where the record has none): which block of a spread run it belongs to."""
    out: dict[Key, list[FitEvent]] = {}
    for record in records:
        c = record.config
        if getattr(c, "mode", None) == "passive":
            continue
        key = (int(c.chunk_size), int(c.decode_batch_size), int(c.new_prefill_tokens))
        for rep in record.reps:
            total = rep.derived.total_interference_ms
            if total is None:
                continue
            out.setdefault(key, []).append(FitEvent(
                key[0], key[1], key[2], float(total), rep.baseline.tpot_p50_ms,
                tuple(rep.interference.chunk_step_times_ms or ()), at_s=iso_epoch_s(rep.started_at) or 0.0,
                source="injected"))
    return out


@dataclass(frozen=True)
class MatchedCell:
    """One cell scored at the launch level its injected repetitions ran at."""

    cell: Cell  # the estimate scored: the level fits' (mixed in the repetitions' proportion), else the mixed fit's
    level: str  # "slow", "fast", "slow+fast", or why the mixed estimate stands: "not launch-bound",
    # "no two levels" (the events show one), "unread" (no repetition's chunk step says its level)
    slow_reps: int = 0
    fast_reps: int = 0
    reps: int = 0
    level_events: int = 0  # events in the cell's bins the level fit keeps (the cell's events for "mixed" ones)
    read_events: int = 0  # of those, the launch-bound one-chunk events read at the cell's level(s)

    @property
    def matched(self) -> bool:
        return self.slow_reps + self.fast_reps > 0


@dataclass(frozen=True)
class LevelMatched:
    """The event model scored cell by cell at the injected repetitions' own launch levels."""

    levels: LaunchLevels
    cells: tuple[MatchedCell, ...]
    errors: Errors  # the level-matched figure; never the headline (module docs)
    minutes: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "scoring": "level-matched (not the headline: the mixed fit's error is)",
            "launch_levels": self.levels.to_dict(),
            "vs_injected": self.errors.to_dict(),
            "cells": [
                {"chunk_size": m.cell.key[0], "decode_batch_size": m.cell.key[1], "new_prefill_tokens": m.cell.key[2],
                 "level": m.level, "slow_reps": m.slow_reps, "fast_reps": m.fast_reps, "reps": m.reps,
                 "level_events": m.level_events, "read_events": m.read_events,
                 "aggregate_interference_ms": _r(m.cell.aggregate_ms, 4),
                 "error": _r(self.errors.by_cell.get(m.cell.key))}
                for m in self.cells if m.cell.key in self.errors.by_cell
            ],
        }


def _mix(a: float | None, b: float | None, w: float) -> float | None:
    return None if a is None or b is None else w * a + (1 - w) * b


def level_matched(
    events: Sequence[FitEvent],
    grid: Grid,
    injected: Mapping[Key, float],
    reps: Mapping[Key, Sequence[FitEvent]],
    *,
    bootstrap: int = BOOTSTRAP,
    min_events: int = MIN_EVENTS,
    seed: int = 0,
    variation: Mapping[str, Any] | None = None,
    mixed: PassiveModel | None = None,
) -> LevelMatched | None:
    """Each reached injected cell scored at the launch level its own repetitions ran at (module docs,
    "Level-matched scoring"): where the cell is launch-bound and the events show two levels, every
    repetition is classified by `launch_levels`' modes (`LaunchLevels.level_of`) and the cell is
    compared with the slow and the fast fits' estimates mixed in the repetitions' proportion (their
    interval bounds mixed alike: at least as wide as the mixture's); every other cell with the mixed
    fit's (`mixed`, given or fitted), as the headline figure has it."""
    if mixed is None:
        mixed = fit_passive_model(events, grid, bootstrap=bootstrap, seed=seed)
    if mixed is None:
        return None
    levels = launch_levels(events, grid, mixed.model)
    base = cells(mixed, events, grid, min_events, variation)
    at: dict[str, dict[Key, Cell]] = {}
    kept: dict[str, dict[Key, int]] = {}
    read = {name: _events_per_cell([events[i] for i in sorted(ix)], grid)
            for name, ix in (("slow", levels.slow), ("fast", levels.fast))}
    if levels.split:
        for name, other in (("slow", levels.fast), ("fast", levels.slow)):
            fit = fit_passive_model(events, grid, bootstrap=bootstrap, seed=seed, launch_level=name, levels=levels)
            if fit is None:
                continue
            at[name] = {c.key: c for c in cells(fit, events, grid, min_events, variation)}
            kept[name] = _events_per_cell([e for i, e in enumerate(events) if i not in other], grid)
    out = []
    for c in base:
        b, d, p = c.key
        if not levels.launch_bound(d, p, b):
            out.append(MatchedCell(c, "not launch-bound", level_events=c.events))
            continue
        seen = [levels.level_of(r) for r in reps.get(c.key, ())]
        slow, fast = seen.count("slow"), seen.count("fast")
        n = len(seen)
        if not levels.split or len(at) < 2:
            out.append(MatchedCell(c, "no two levels", reps=n, level_events=c.events))
            continue
        if not slow + fast:
            out.append(MatchedCell(c, "unread", reps=n, level_events=c.events))
            continue
        w = slow / (slow + fast)
        s, f = at["slow"][c.key], at["fast"][c.key]
        cell = dataclasses.replace(c, aggregate_ms=w * s.aggregate_ms + (1 - w) * f.aggregate_ms,
                                   low_ms=_mix(s.low_ms, f.low_ms, w), high_ms=_mix(s.high_ms, f.high_ms, w))
        level = "slow" if not fast else "fast" if not slow else "slow+fast"
        names = [x for x, k in (("slow", slow), ("fast", fast)) if k]
        count = kept[names[0]].get(c.key, 0) if len(names) == 1 else c.events
        out.append(MatchedCell(cell, level, slow, fast, n, count, sum(read[x].get(c.key, 0) for x in names)))
    return LevelMatched(levels, tuple(out), injected_errors([m.cell for m in out], injected), mixed.minutes)


# --- convergence -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Convergence:
    minutes: float
    events: int
    reached: int
    halfwidth: float | None
    errors: Errors | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "minutes": self.minutes,
            "events_used": self.events,
            "cells_reached": self.reached,
            "median_relative_halfwidth": _r(self.halfwidth),
            "vs_injected": self.errors.to_dict() if self.errors is not None else None,
        }


def convergence(
    events: Sequence[FitEvent],
    grid: Grid,
    minutes: Sequence[float] = CONVERGENCE_MINUTES,
    *,
    injected: Mapping[Key, float] | None = None,
    bootstrap: int = BOOTSTRAP,
    min_events: int = MIN_EVENTS,
    seed: int = 0,
    launch_level: str = "mixed",
) -> list[Convergence]:
    """The model refitted on the first m minutes of traffic, for each m the events cover."""
    out = []
    end = max((e.at_s for e in events), default=0.0) / 60.0
    for m in sorted(minutes):
        if m > end + 0.5:
            break
        first = [e for e in events if e.at_s <= m * 60.0]
        model = fit_passive_model(first, grid, bootstrap=bootstrap, seed=seed, launch_level=launch_level)
        if model is None:
            out.append(Convergence(m, 0, 0, None, None))
            continue
        rows = cells(model, first, grid, min_events)
        out.append(
            Convergence(
                m,
                model.events,
                sum(c.reached for c in rows),
                halfwidth(rows),
                injected_errors(rows, injected) if injected is not None else None,
            )
        )
    return out


# --- the verdict -------------------------------------------------------------------------------


def decision_inputs(
    model: PassiveModel, rows: Sequence[Cell], modelled: bool, engine: str
) -> tuple[FitReport, pd.DataFrame]:
    """What `breakeven.decision_document` takes: a report whose chosen model is the event fit, and a
    table of the reached cells (their range is the verdict's valid range)."""
    reached = [c for c in rows if c.reached] or list(rows)
    table = pd.DataFrame(
        {
            "chunk_size": [c.key[0] for c in reached],
            "decode_batch_size": [c.key[1] for c in reached],
            "new_prefill_tokens": [c.key[2] for c in reached],
            "aggregate_interference_ms": [c.aggregate_ms for c in reached],
            "modelled": [modelled] * len(reached),
            "engine": [engine] * len(reached),
        }
    )
    scheme = "bootstrap over events"
    fit = ModelFit(
        cast("CostModel", model.model),
        model.in_sample_r2,
        {scheme: HeldOut(scheme, len(model.draws), None, None, None, np.empty(0))},
    )
    reason = (
        f"passive mode: fitted on {model.events} production prefills event by event (exact D and P), "
        f"95 % intervals from {len(model.draws)} bootstrap refits over events"
    )
    return FitReport({CONTEXT_MODEL: fit}, CONTEXT_MODEL, scheme, reason, model.events), table


def _r(x: float | None, digits: int = 6) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


# --- the whole answer --------------------------------------------------------------------------


@dataclass(frozen=True)
class PassiveAnswer:
    """The event model, the table derived from it, and how it converged."""

    model: PassiveModel
    grid: Grid
    cells: tuple[Cell, ...]
    convergence: tuple[Convergence, ...]
    errors: Errors | None  # the full fit against the injected table, when one was given
    min_events: int = MIN_EVENTS
    campaign_variation: bool = False  # the cells' intervals carry the campaign variation

    @property
    def halfwidth(self) -> float | None:
        return halfwidth(self.cells)

    @property
    def not_reached(self) -> dict[str, list[str]]:
        """Why cells are not reached, each reason with the cells it holds for."""
        out: dict[str, list[str]] = {}
        for c in self.cells:
            for why in (c.why_not or "").split("; "):
                if why:
                    out.setdefault(_reason_kind(why), []).append(f"D={c.key[1]} P={c.key[2]}")
        return out

    def table(self) -> pd.DataFrame:
        return cell_table(self.cells)

    def summary(self) -> dict[str, Any]:
        """What decision.json's `passive` block and the exporter's gauges say about the answer."""
        return {
            "events_used": self.model.events,
            "events_left_out": self.model.left_out,
            "traffic_minutes": round(self.model.minutes, 3),
            "cells": len(self.cells),
            "cells_reached": sum(c.reached for c in self.cells),
            "median_relative_halfwidth": _r(self.halfwidth),
            "intervals_carry_campaign_variation": self.campaign_variation,
            "min_events_per_bin": self.min_events,
            "not_reached": {k: len(v) for k, v in self.not_reached.items()},
            "vs_injected": self.errors.to_dict() if self.errors is not None else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "fit": self.model.to_dict(),
            "grid": {
                "chunk_sizes": list(self.grid.chunk_sizes),
                "decode_batch_sizes": list(self.grid.decode_batch_sizes),
                "new_prefill_tokens": list(self.grid.prefill_tokens),
            },
            "not_reached": self.not_reached,
            "convergence": [c.to_dict() for c in self.convergence],
            "vs_injected_by_cell": (
                [
                    {
                        "chunk_size": k[0],
                        "decode_batch_size": k[1],
                        "new_prefill_tokens": k[2],
                        "error": _r(v),
                    }
                    for k, v in sorted(self.errors.by_cell.items())
                ]
                if self.errors is not None
                else None
            ),
        }


def _reason_kind(why: str) -> str:
    head = why.split(" (")[0]
    return head.split(" ", 3)[-1] if head.startswith(("D = ", "P = ")) else head


def answer(
    events: Sequence[FitEvent],
    grid: Grid,
    *,
    injected: Mapping[Key, float] | None = None,
    minutes: Sequence[float] = CONVERGENCE_MINUTES,
    bootstrap: int = BOOTSTRAP,
    min_events: int = MIN_EVENTS,
    seed: int = 0,
    variation: Mapping[str, Any] | None = None,
    launch_level: str = "mixed",
) -> PassiveAnswer | None:
    """The model on every event, its table, and its convergence over the first minutes of traffic
    (each of `minutes` the traffic covers, and all of it). `variation` (held_out.json's, from
    `pdexporter validate`): the table's intervals carry the campaign-to-campaign variation
    (`PassiveModel.interval`); the convergence keeps the events' own intervals, which is what
    narrows as traffic comes. `launch_level`: the fits' launch-bound one-chunk events (module docs,
    "Launch levels")."""
    model = fit_passive_model(events, grid, bootstrap=bootstrap, seed=seed, launch_level=launch_level)
    if model is None:
        return None
    rows = tuple(cells(model, events, grid, min_events, variation))
    events_only = tuple(cells(model, events, grid, min_events)) if variation else rows  # what the events alone say
    end = max((e.at_s for e in events), default=0.0) / 60.0
    earlier = sorted(
        {m for m in minutes if m < end - 0.05}
    )  # every cut-off the traffic covers, then all of it
    series = convergence(
        events,
        grid,
        earlier,
        injected=injected,
        bootstrap=min(bootstrap, CONVERGENCE_BOOTSTRAP),
        min_events=min_events,
        seed=seed,
        launch_level=launch_level,
    )
    errors = injected_errors(rows, injected) if injected is not None else None
    series.append(
        Convergence(round(end, 2), model.events, sum(c.reached for c in rows), halfwidth(events_only), errors)
    )
    return PassiveAnswer(model, grid, rows, tuple(series), errors, min_events, campaign_variation=bool(variation))


def passive_decision(
    result: PassiveAnswer, transfer_ms: float, *, modelled: bool, engine: str, source: str = ""
) -> dict[str, Any]:
    """decision.json from the event model, in the schema `export-table` writes, marked `mode: passive`
    (its valid range: the reached cells)."""
    from pdexporter.analysis.breakeven import decision_document

    report, table = decision_inputs(result.model, result.cells, modelled, engine)
    doc = decision_document(report, table, transfer_ms, source=source)
    doc["mode"] = "passive"
    doc["passive"] = result.summary()
    return doc
