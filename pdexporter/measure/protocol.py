"""The seed's Phase 1 and Phase 2, written once against `EngineDriver`.

Phase 1 (baseline): D probe streams on the shared, cached 4096-token prefix decode 256 tokens
each; their intervals after the first 16 tokens give TPOT_baseline.

Phase 2 (interference, `run_window`, the only implementation): D probe streams; once every
stream has >= 32 tokens and its last 8 intervals are within 2x of each other (steady state), a
cold prefill of exactly P random token ids is injected with max_tokens = 1. Its body is encoded
before the window opens and nothing else runs on the loop while the window is open, so probe
timestamps are not delayed by our own work (the 0 ms-interval trap in docs/vllm-facts.md). The
engine's /metrics is scraped just before the injection and after the recovery intervals; the
engine's step log, when the driver can see it, gives the real chunk sizes. Which streams (fresh,
pooled, the exporter's continuous ones) and which baseline (Phase 1, the live quiet period) are
the caller's choice (`measure.probesets`).

All numbers are computed afterwards by the pure functions in `measure.window`, told the engine's
chunking by its adapter (`analyse_traces`): the chunk steps as the running decodes see them
(`ChunkRule.decode_view`: one step per chunk where the decodes run beside it, one stall of all the
chunks where they pause for them, SGLang's default) and where those steps end (`window_anchor_ns`:
at the prefill's first token; where the decodes paused, at the end of their stall, the probes' gap
that spans the prefill's first token or ends a moment before it).

A driver that routes the prefill through a P/D pair's prefill instance first (`measure.pd.Routing`)
runs that first half before the window opens; the window is the decode instance's half, and the
route's clock (`InterferenceRun.offload`) goes into the record and the raw file (measure/pd.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from pdexporter._internal.bounds import MAX_SECONDS, MAX_TOKENS
from pdexporter.client.iterlog import summarise_chunks
from pdexporter.client.metrics import MetricsSnapshot, metric_deltas
from pdexporter.client.stream import TokenStream
from pdexporter.engines import IterationStep, adapter
from pdexporter.errors import MeasurementError, PdexporterError
from pdexporter.measure.driver import Cancelling, EngineDriver, PreparedRequest
from pdexporter.measure.pd import RouteTiming, Routing
from pdexporter.measure.prompts import TokenRange, cold_prompt, shared_prefix
from pdexporter.measure.window import (
    BaselineStats,
    ChunkPlan,
    WindowParams,
    WindowStats,
    analyse_window,
    baseline_stats,
    held_back,
    token_event_index,
    token_times,
    window_end_ns,
)

__all__ = [
    "BaselineRun",
    "BaselineSource",
    "BusyAtInjection",
    "InterferenceRun",
    "OPTION_NAMES",
    "ProbeSet",
    "ProtocolSettings",
    "StreamTrace",
    "analyse_traces",
    "baseline_gap_problem",
    "chunk_plan",
    "chunks_expected",
    "chunks_from_steps",
    "end_streams",
    "expected_schedule",
    "injection_problem",
    "logged_injection_problem",
    "prompt_tokens_check",
    "prompt_tokens_problem",
    "protocol_settings",
    "raw_int",
    "run_baseline",
    "run_single",
    "run_window",
    "settle_engine",
    "stalled",
    "stamp_problem",
    "start_probes",
    "steady",
    "recovery_end_ns",
    "wait_for",
    "warm_prefix",
    "warm_shapes",
    "window_anchor_ns",
]


class ProtocolSettings(BaseModel):
    """The seed's control variables; defaults are the seed's values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decode_context_tokens: int = Field(4096, ge=1, le=MAX_TOKENS)
    decode_output_tokens: int = Field(256, ge=2, le=MAX_TOKENS)
    warmup_tokens: int = Field(16, ge=0, le=MAX_TOKENS)
    inject_at_tokens: int = Field(32, ge=2, le=MAX_TOKENS)
    steady_last_intervals: int = Field(8, ge=1, le=MAX_TOKENS)
    steady_max_ratio: float = Field(2.0, gt=1.0, le=1e6)
    after_intervals: int = Field(32, ge=1, le=MAX_TOKENS)
    prefill_max_tokens: int = Field(1, ge=1, le=MAX_TOKENS)
    slow_rel: float = Field(0.20, gt=0, le=1e6)
    slow_mad_k: float = Field(5.0, gt=0, le=1e6)
    token_low: int = Field(1000, ge=0, le=2**31 - 1)
    token_high: int = Field(100_000, ge=1, le=2**31 - 1)
    steady_timeout_s: float = Field(120.0, gt=0, le=MAX_SECONDS)
    window_timeout_s: float = Field(900.0, gt=0, le=MAX_SECONDS)
    # Inside a window every open probe gets a token per engine step (a chunk step included): one
    # silent this long means the engine (or its connection) stalled, and the window fails at once
    # instead of waiting for the read timeout (`--read-timeout`, 300 s by default).
    stall_timeout_s: float = Field(30.0, gt=0, le=MAX_SECONDS)
    # Before a re-run (Phase 1 or a repetition, after a fault) the failed attempt's streams are
    # ended and the engine must run nothing: its /metrics is read until no request runs or waits,
    # at most this long (`settle_engine`), else the run stops in one line.
    settle_timeout_s: float = Field(30.0, gt=0, le=MAX_SECONDS)
    # Phase 1 fails (and runs again) when a probe was silent longer than
    # max(baseline_gap_ratio x the baseline's median interval, baseline_gap_floor_ms)
    # (`baseline_gap_problem`).
    baseline_gap_ratio: float = Field(8.0, gt=1.0, le=1e6)
    baseline_gap_floor_ms: float = Field(500.0, gt=0, le=MAX_SECONDS * 1e3)

    @model_validator(mode="after")
    def _check(self) -> ProtocolSettings:
        if self.inject_at_tokens + self.after_intervals >= self.decode_output_tokens:
            raise ValueError(
                f"decode_output_tokens={self.decode_output_tokens} leaves no room for injection at token "
                f"{self.inject_at_tokens} plus {self.after_intervals} recovery intervals"
            )
        if self.token_low >= self.token_high:
            raise ValueError(f"token_low={self.token_low} must be below token_high={self.token_high}")
        return self

    def with_read_timeout(self, read_timeout_s: float | None) -> ProtocolSettings:
        """These settings under a client read timeout: a window also fails once a probe was silent
        that long, when it is shorter than `stall_timeout_s`."""
        if read_timeout_s is None or read_timeout_s >= self.stall_timeout_s:
            return self
        return self.model_copy(update={"stall_timeout_s": read_timeout_s})

    # the settings the window maths reads (a directory's records are derived with one set of them)
    WINDOW_FIELDS: ClassVar[tuple[str, ...]] = ("warmup_tokens", "after_intervals", "slow_rel", "slow_mad_k")

    @property
    def window(self) -> WindowParams:
        return WindowParams(**{name: getattr(self, name) for name in self.WINDOW_FIELDS})

    @property
    def token_range(self) -> TokenRange:
        return TokenRange(self.token_low, self.token_high)

    def window_fields(self) -> dict[str, float]:
        """The window settings as a directory keeps them (`ResultsStore.save_window`)."""
        return {name: getattr(self, name) for name in self.WINDOW_FIELDS}

    def record_fields(self) -> dict[str, int]:
        """The settings a record's config carries (and a resumed run must share)."""
        return {"decode_context_tokens": self.decode_context_tokens, "decode_output_tokens": self.decode_output_tokens,
                "prefill_max_tokens": self.prefill_max_tokens}

    def window_tokens(self, engine: str, p: int, chunk_size: int, d: int) -> int:
        """Tokens one probe stream spends on one window of a P-token prefill: the steady check,
        two steps per expected chunk (its step, and the admission/retirement stalls and async lag
        around it), the recovery intervals and a margin."""
        rules = adapter(engine)
        chunks = 1 if rules.budget_problem(chunk_size, d) else len(rules.chunk_schedule(p, chunk_size, d))
        return self.steady_last_intervals + 2 * chunks + self.after_intervals + 8


# The options of measure and run that set protocol fields (sweep files name the fields themselves).
OPTION_NAMES = {"decode_context_tokens": "--decode-context-tokens", "decode_output_tokens": "--decode-output-tokens"}


def protocol_settings(**fields: Any) -> ProtocolSettings:
    """`ProtocolSettings(**fields)` with a validation failure as one line naming the option."""
    from pydantic import ValidationError

    from pdexporter._internal.validation import format_option_error
    from pdexporter.errors import ConfigError

    try:
        return ProtocolSettings(**fields)
    except ValidationError as exc:
        text = format_option_error(exc, ProtocolSettings, OPTION_NAMES)
        field, eq, rest = text.partition("=")  # a check of the whole model: "decode_output_tokens=40 leaves ..."
        if eq and field in OPTION_NAMES:
            value, _, what = rest.partition(" ")
            text = f"{OPTION_NAMES[field]} {value}: {what}"
        raise ConfigError(text) from exc


@dataclass
class StreamTrace:
    """A finished stream's raw timing, detached from the live object."""

    request_id: str
    tag: str
    t_sent_ns: int | None
    event_times_ns: list[int]
    event_tokens: list[int]
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    stamp_clock: str | None = None  # TokenStream.stamp_clock: kernel-rx | wakeup | read; None: not recorded
    # TokenStream.stamps_held: (event index, ns its stamp went back), events held at the stamp before
    stamps_held: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def of(cls, stream: TokenStream) -> StreamTrace:
        """A consistent snapshot, also of a stream another thread is still appending to (it
        appends the time before the count: take as many of each as both have)."""
        n = min(len(stream.event_times_ns), len(stream.event_tokens))
        return cls(
            stream.request_id,
            stream.tag,
            stream.t_sent_ns,
            stream.event_times_ns[:n],
            stream.event_tokens[:n],
            stream.prompt_tokens,
            stream.finish_reason,
            stream.stamp_clock,
            [(i, back) for i, back in list(stream.stamps_held) if i < n],
        )

    def token_times(self) -> np.ndarray:
        return token_times(self.event_times_ns, self.event_tokens)

    def stamps_back_ns(self) -> list[int]:
        """How far back each out-of-order stamp of this trace went (ns): those the stream held when
        it recorded them (`TokenStream.record`) and any its times still hold (a raw file written
        before streams held them; `window.token_times` holds them for the maths)."""
        behind = held_back(np.asarray(self.event_times_ns, dtype=np.int64))
        return [b for _, b in self.stamps_held] + [int(x) for x in behind[behind > 0]]

    def to_raw(self, t0_ns: int) -> dict[str, Any]:
        """Compact form: times relative to t0, then as deltas (ns); gzip does the rest."""
        times = [t - t0_ns for t in self.event_times_ns]
        raw: dict[str, Any] = {
            "id": self.request_id,
            "tag": self.tag,
            "sent_ns": None if self.t_sent_ns is None else self.t_sent_ns - t0_ns,
            "dt_ns": [b - a for a, b in zip([0, *times[:-1]], times)],
            "n": self.event_tokens,
            "prompt_tokens": self.prompt_tokens,
            "finish_reason": self.finish_reason,
        }
        if self.stamp_clock is not None:
            raw["stamp_clock"] = self.stamp_clock
        if self.stamps_held:  # only where a stamp went back: the raw shape of before otherwise
            raw["stamps_held"] = [[i, back] for i, back in self.stamps_held]
        return raw

    @classmethod
    def from_raw(cls, raw: dict[str, Any], t0_ns: int = 0, where: str = "stream") -> StreamTrace:
        """The stream `to_raw` wrote; a field that is not what `to_raw` writes is one RecordError
        naming `where` (the raw file and the stream in it: `FILE: probes[0]`) and the field."""
        _check_raw_stream(raw, where)
        times = list(itertools.accumulate(raw["dt_ns"], initial=t0_ns))[1:]
        sent = raw.get("sent_ns")
        return cls(
            raw["id"],
            raw["tag"],
            None if sent is None else sent + t0_ns,
            times,
            list(raw["n"]),
            raw.get("prompt_tokens"),
            raw.get("finish_reason"),
            raw.get("stamp_clock"),
            [(int(i), int(back)) for i, back in raw.get("stamps_held") or []],
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def raw_int(raw: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    """An integer field of a raw timestamps file (`t_first_ns`, `t_inject_ns`); else one RecordError
    naming `where` (the file) and the field."""
    from pdexporter.errors import RecordError

    value = raw.get(key, default)
    if value is None:
        raise RecordError(f"{where}: {key}: required field is missing")
    if not _is_int(value):
        raise RecordError(f"{where}: {key}: must be an integer (got {value!r:.60})")
    return int(value)


def _check_int_list(values: Any, where: str) -> None:
    """A list of integers, else one RecordError naming `where` and the first item that is not one."""
    from pdexporter.errors import RecordError

    if not isinstance(values, list):
        raise RecordError(f"{where}: must be a list of integers (got {values!r:.60})")
    if set(map(type, values)) <= {int}:  # JSON's integers (not bool, whose type is bool): one pass, in C
        return
    for i, value in enumerate(values):
        if not _is_int(value):
            raise RecordError(f"{where}[{i}]: must be an integer (got {value!r:.60})")


def _check_raw_stream(raw: Any, where: str) -> None:
    """One line naming the field of a raw stream (`StreamTrace.to_raw`'s form) that is not what
    `to_raw` writes: its times and token counts integers, one count per time."""
    from pdexporter.errors import RecordError

    if not isinstance(raw, dict):
        raise RecordError(f"{where}: must be a mapping (got {type(raw).__name__})")
    for key in ("id", "tag", "dt_ns", "n"):
        if key not in raw:
            raise RecordError(f"{where}.{key}: required field is missing")
    for key in ("dt_ns", "n"):
        _check_int_list(raw[key], f"{where}.{key}")
    if len(raw["n"]) != len(raw["dt_ns"]):
        raise RecordError(f"{where}.n: {len(raw['n'])} item(s), one per dt_ns ({len(raw['dt_ns'])} given)")
    for key in ("sent_ns", "prompt_tokens"):
        value = raw.get(key)
        if value is not None and not _is_int(value):
            raise RecordError(f"{where}.{key}: must be an integer or null (got {value!r:.60})")
    held = raw.get("stamps_held")
    if held is not None:
        if not isinstance(held, list):
            raise RecordError(f"{where}.stamps_held: must be a list of [event index, ns] pairs (got {held!r:.60})")
        for i, pair in enumerate(held):
            if not (isinstance(pair, list) and len(pair) == 2 and all(_is_int(x) and x >= 0 for x in pair)):
                raise RecordError(f"{where}.stamps_held[{i}]: must be an [event index, ns] pair of integers >= 0 "
                                  f"(got {pair!r:.60})")


@dataclass
class BaselineRun:
    decode_batch_size: int
    probes: list[StreamTrace]
    stats: BaselineStats | None
    retries: int = 0  # how often Phase 1 was run again before this one was kept

    def to_raw(self) -> dict[str, Any]:
        t0 = min((p.t_sent_ns or 0 for p in self.probes), default=0)
        return {"decode_batch_size": self.decode_batch_size, "probes": [p.to_raw(t0) for p in self.probes],
                **({"retries": self.retries} if self.retries else {})}


@dataclass
class InterferenceRun:
    decode_batch_size: int
    new_prefill_tokens: int
    probes: list[StreamTrace]
    prefill: StreamTrace
    t_inject_ns: int
    t_first_ns: int
    window: WindowStats
    baseline: BaselineStats | None = None
    baseline_rule: str = "phase1"
    metrics_before: MetricsSnapshot | None = None
    metrics_after: MetricsSnapshot | None = None
    engine_steps: list[IterationStep] | None = None
    schedule: tuple[int, ...] | None = None  # the engine's chunk schedule for this prefill, when B is known
    salt: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    offload: RouteTiming | None = None  # the routed prefill's clock (a P/D pair, measure.pd)
    engine: str | None = None  # the engine adapter's name: the format `to_raw` keeps its steps in
    plan: ChunkPlan | None = None  # the chunk steps the window maths was told (`chunk_plan`)
    anchor_ns: int | None = None  # where the chunk steps end (`window_anchor_ns`); None: t_first_ns

    @property
    def window_end_ns(self) -> float:
        """The end of the window: the anchor plus half a baseline step (`measure.window`)."""
        return window_end_ns(self.anchor_ns if self.anchor_ns is not None else self.t_first_ns, self.baseline)

    @property
    def engine_metric_deltas(self) -> dict[str, float]:
        if self.metrics_before is None or self.metrics_after is None:
            return {}
        return {k: round(v, 6) for k, v in metric_deltas(self.metrics_before, self.metrics_after).items()}

    @property
    def engine_chunks(self) -> tuple[int, ...] | None:
        return chunks_from_steps(self.engine_steps, self.new_prefill_tokens)

    @property
    def located_chunks(self) -> tuple[int, ...] | None:
        """The chunk steps the window maths located (log, or confirmed schedule), as the decodes saw them."""
        if self.plan is not None and self.window.num_chunks_source in ("engine-log", "cadence"):
            return self.plan.sizes
        return None

    def to_raw(self) -> dict[str, Any]:
        t0 = self.t_inject_ns
        return {
            "decode_batch_size": self.decode_batch_size,
            "new_prefill_tokens": self.new_prefill_tokens,
            "salt": self.salt,
            "t_inject_ns": 0,
            # The driver's clock (perf_counter_ns: CLOCK_MONOTONIC on Linux) at the injection, so a
            # window can be lined up with host-side samples taken on the same machine.
            "t_inject_clock_ns": t0,
            "t_first_ns": self.t_first_ns - t0,
            "probes": [p.to_raw(t0) for p in self.probes],
            "prefill": self.prefill.to_raw(t0),
            # in the engine's own log format (its adapter's), read back by `reanalyse`
            "engine_steps": ([adapter(self.engine or "").format_step(s) for s in self.engine_steps]
                             if self.engine_steps else None),
            "metrics_before": self.metrics_before.values if self.metrics_before else None,
            "metrics_after": self.metrics_after.values if self.metrics_after else None,
            **({"offload": self.offload.to_raw(t0)} if self.offload is not None else {}),
            **self.extra,
        }


def chunks_from_steps(steps: Sequence[IterationStep] | None,
                      prompt_tokens: int | None = None) -> tuple[int, ...] | None:
    """The prefill's chunk sizes in the engine's own log for a window; None when the log shows
    none (an engine without iteration logging: every prefill takes at least one chunk). With
    `prompt_tokens` (the injected prompt's, uncached: it is salted), the chunks up to the one that
    completes it: a prefill step logged after it is another request's (a probe's re-prompt once the
    prefill had finished, read with the window's steps when the log was read late, on a loaded host:
    [2046, 954, 16] for a 3000-token prompt). Where they never add up to it (a cached prefix), all."""
    if steps is None:
        return None
    chunks = summarise_chunks(steps).chunk_tokens
    if prompt_tokens:
        done = next((i for i, total in enumerate(itertools.accumulate(chunks)) if total >= prompt_tokens), None)
        chunks = chunks if done is None else chunks[:done + 1]
    return chunks or None


def expected_schedule(engine: str, p: int, chunk_size: int | None, d: int) -> tuple[int, ...] | None:
    """The chunks the engine's scheduling rule gives a P-token prefill beside D decodes (what its
    step log would show), or None when the chunk size is unknown (or leaves no budget)."""
    rules = adapter(engine)
    if chunk_size is None or p < 1 or rules.budget_problem(chunk_size, d):
        return None
    return rules.chunk_schedule(p, chunk_size, d)


def chunks_expected(engine: str, schedule: Sequence[int] | None) -> int | None:
    """`num_chunks_expected`: the chunk steps the decodes should see by the engine's rule (vLLM:
    ceil(P / (B - D)); SGLang's default: one stall however many chunks), None without a schedule."""
    return len(adapter(engine).chunk_rule.decode_view(schedule)) if schedule else None


def chunk_plan(engine: str, engine_steps: Sequence[IterationStep] | None,
               schedule: Sequence[int] | None, prompt_tokens: int | None = None) -> ChunkPlan | None:
    """The engine's own log when it shows the chunks (exact; `chunks_from_steps`, up to the one that
    completes `prompt_tokens`), else its schedule (to be confirmed by the cadence), else nothing;
    either as the running decodes see the chunk steps (the engine's `ChunkRule.decode_view`)."""
    view = adapter(engine).chunk_rule.decode_view
    logged = chunks_from_steps(engine_steps, prompt_tokens)
    if logged:
        return ChunkPlan(view(logged), exact=True)
    return ChunkPlan(view(schedule), exact=False) if schedule else None


def window_anchor_ns(engine: str, t_first_ns: int, baseline: BaselineStats | None,
                     probes: Sequence[StreamTrace] = ()) -> int:
    """Where the decodes' step that carries the prefill's last chunk ends (the window maths' anchor).

    Where they share that step (vLLM; SGLang mixed: `resume_lag_steps` 0): the prefill's first
    token, which leaves with their tokens of that step. Where they paused for the chunks (SGLang's
    default): the end of their stall, the longest gap between two emissions of a probe that begins
    before the first token and ends no earlier than a baseline step before it; the median over the
    probes, the first token where none has such a gap (or no baseline says how long a step is).
    The stall spans the first token (the last chunk's step produced it) or ends a moment before it
    (the engine streamed the decodes' next token first), and it may end several steps after it:
    on SGLang 0.5.15 at P = 32768 the decodes' first step after the prefill came 21 to 24 ms (three
    to four steps) after the first token, so the end is not bounded from above."""
    lag = adapter(engine).chunk_rule.resume_lag_steps
    if not lag or baseline is None or not probes:
        return t_first_ns
    lo = t_first_ns - baseline.p50_ms * 1e6
    ends = []
    for trace in probes:
        times = [t for t, n in zip(trace.event_times_ns, trace.event_tokens) if n > 0]
        best, end = 0.0, None
        for a, b in itertools.pairwise(times):
            if a < t_first_ns and b >= lo and b - a > best:
                best, end = b - a, b
        if end is not None:
            ends.append(end)
    return int(np.median(ends)) if ends else t_first_ns


def recovery_end_ns(engine: str, t_first_ns: int, baseline: BaselineStats | None) -> float:
    """The latest the window can end (`window_anchor_ns` is found afterwards, in the traces): the
    recovery intervals are counted from here."""
    lag = adapter(engine).chunk_rule.resume_lag_steps
    return window_end_ns(t_first_ns, baseline) + (lag + 1) * (baseline.p50_ms * 1e6 if baseline and lag else 0.0)


def analyse_traces(
    probes: Sequence[StreamTrace],
    t_inject_ns: int,
    t_first_ns: int,
    baseline: BaselineStats | None,
    params: WindowParams,
    engine_steps: Sequence[IterationStep] | None = None,
    schedule: Sequence[int] | None = None,
    *,
    engine: str,
    prompt_tokens: int | None = None,
) -> WindowStats:
    """The window maths on recorded traces, told the chunks by the engine log (those of the
    `prompt_tokens`-token prompt) or its schedule, as the engine's adapter says its decodes see
    them (`chunk_plan`, `window_anchor_ns`)."""
    return _analyse_told(probes, t_inject_ns, t_first_ns, baseline, params,
                         chunk_plan(engine, engine_steps, schedule, prompt_tokens),
                         window_anchor_ns(engine, t_first_ns, baseline, probes))


def _analyse_told(probes: Sequence[StreamTrace], t_inject_ns: int, t_first_ns: int, baseline: BaselineStats | None,
                  params: WindowParams, plan: ChunkPlan | None, anchor: int) -> WindowStats:
    """`analyse_traces` once its chunk plan and anchor are known (a live window keeps both in its run)."""
    window = analyse_window(
        [t.token_times() for t in probes], t_inject_ns, anchor, baseline, params,
        plan=plan,
        token_events=[token_event_index(t.event_tokens) for t in probes],
    )
    if anchor != t_first_ns:  # the window was anchored later; the prefill's own clock is unchanged
        window = dataclasses.replace(window, t_first_ns=int(t_first_ns),
                                     prefill_duration_ms=(t_first_ns - t_inject_ns) / 1e6)
    held = sum(len(t.stamps_back_ns()) for t in probes)  # `token_times` held them: the maths saw none
    if held:
        window = dataclasses.replace(window, stamp_corrections=(window.stamp_corrections or 0) + held)
    return window


def stamp_problem(probes: Sequence[StreamTrace], baseline: BaselineStats | None, params: WindowParams) -> str | None:
    """Why a window's probe stamps are not to be trusted, in one line naming the stream, or None: a
    stamp that went back (before the stamp of the event read before it; `client.stream` says how)
    by more than `params.max_stamp_back_frac` of the baseline step. Smaller ones are held at the
    stamp before them and counted (`WindowStats.stamp_corrections`); without a baseline there is no
    step to judge them by, and they are held and counted only."""
    if baseline is None:
        return None
    limit_ns = params.max_stamp_back_frac * baseline.p50_ms * 1e6
    for trace in probes:
        back = trace.stamps_back_ns()
        if back and max(back) > limit_ns:
            return (f"probe stream {trace.request_id}: an arrival stamp {max(back) / 1e6:.3f} ms before the stamp "
                    f"of the event read before it ({len(back)} out of order, {trace.stamp_clock or 'unnamed'} "
                    f"stamps), more than {params.max_stamp_back_frac:g} x the {baseline.p50_ms:.3f} ms decode step")
    return None


def prompt_tokens_check(reported: int | None, sent: int) -> str:
    """What the engine's `usage.prompt_tokens` says about a prefill of `sent` token ids: "exact",
    "differs" or "unreported" (an engine without usage in its stream). The seed needs exactly P
    cold tokens, so a window whose prefill differs is not recorded (`prompt_tokens_problem`)."""
    if reported is None:
        return "unreported"
    return "exact" if reported == sent else "differs"


def prompt_tokens_problem(reported: int | None, sent: int) -> str | None:
    if prompt_tokens_check(reported, sent) != "differs":
        return None
    return (f"the engine counted usage.prompt_tokens={reported} for the {sent} token ids sent; the seed needs "
            f"exactly {sent} cold tokens (a tokenizer or template added or dropped some)")


def _raise_failures(streams: Iterable[TokenStream]) -> None:
    for stream in streams:
        stream.raise_if_failed()


async def wait_for(
    driver: EngineDriver, streams: Sequence[TokenStream], predicate: Callable[[], bool], timeout_s: float, what: str,
    *, stall_s: float | None = None,
) -> None:
    """Wait for `predicate`; a failed stream raises its error, a timeout a one-line MeasurementError.
    With `stall_s`, an open stream that has had tokens and then none for `stall_s` raises a
    one-line MeasurementError at once (`stalled`): every probe gets a token per engine step."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while True:
        left = max(0.0, end - loop.time())
        slice_s = left if stall_s is None else min(left, max(stall_s / 4, 0.01))
        ok = await driver.progress.wait_until(
            lambda: predicate() or any(s.error is not None for s in streams), slice_s
        )
        _raise_failures(streams)
        if ok:
            return
        if stall_s is not None:
            silent = stalled(streams, driver.now_ns(), stall_s)
            if silent:
                raise MeasurementError(
                    f"the engine stalled: {len(silent)} of {len(streams)} stream(s) got no token for {stall_s:g} s "
                    f"(protocol.stall_timeout_s) while waiting: {what}"
                )
        if loop.time() >= end:
            raise MeasurementError(f"{what} within {timeout_s:g} s")


def stalled(streams: Sequence[TokenStream], now_ns: int, stall_s: float) -> list[TokenStream]:
    """Open streams that received tokens and then none for `stall_s` (a prefill before its first
    token is silent by nature: it has none yet and is not counted)."""
    limit = stall_s * 1e9
    return [s for s in streams if not s.done and s.event_times_ns and now_ns - s.event_times_ns[-1] > limit]


async def run_single(
    driver: EngineDriver, prompt: Sequence[int], max_tokens: int, tag: str, timeout_s: float
) -> TokenStream:
    """One request outside any window (warm-ups): retried if the connection fails before any byte."""
    stream = driver.start(driver.prepare(prompt, max_tokens, tag), retry_connect=True)
    await wait_for(driver, [stream], lambda: stream.done, timeout_s, f"{tag} request did not finish")
    return stream


async def warm_prefix(driver: EngineDriver, settings: ProtocolSettings) -> None:
    """Put the shared probe prefix into the prefix cache."""
    await run_single(
        driver, shared_prefix(settings.decode_context_tokens, settings.token_range), 1, "warm-prefix",
        settings.window_timeout_s,
    )


async def warm_shapes(driver: EngineDriver, prefill_tokens: Iterable[int], settings: ProtocolSettings) -> None:
    """Run one cold prefill of every size first: a new batch shape costs JIT/autotune time once."""
    for p in sorted(set(prefill_tokens)):
        prompt = cold_prompt(p, f"warm-{uuid.uuid4()}", settings.token_range)
        await run_single(driver, prompt, 1, "warm-shape", settings.window_timeout_s)


def start_probes(
    driver: EngineDriver, d: int, settings: ProtocolSettings, max_tokens: int | None = None
) -> list[TokenStream]:
    prepared = driver.prepare(
        shared_prefix(settings.decode_context_tokens, settings.token_range),
        max_tokens or settings.decode_output_tokens,
        "probe",
    )
    return [driver.start(prepared, retry_connect=True) for _ in range(d)]


def steady(streams: Sequence[TokenStream], settings: ProtocolSettings) -> bool:
    """The seed's rule on event times: >= inject_at tokens, last 8 intervals within 2x.

    Events that share a stamp arrived in one read (the client was a step late and read two of the
    engine's writes at once: `client.kstamp` says why no stamp can split them); they count as one
    interval of their tokens together, as the client saw them, not as a 0 ms interval that would
    break the rule for a reason that is not the engine's cadence. Under CPU contention this
    happens every few hundred events, and with 12 probes x 8 intervals one of them was nearly
    always in view (issue 13's soak: "not in steady state" for minutes)."""
    k = settings.steady_last_intervals
    for s in streams:
        if s.n_tokens < settings.inject_at_tokens:
            return False
        times, tokens = s.event_times_ns, s.event_tokens
        gaps: list[float] = []  # ns per token between consecutive reads, newest first
        i = min(len(times), len(tokens)) - 1
        while i > 0 and len(gaps) < k:
            t, n = times[i], tokens[i]
            while i - 1 > 0 and times[i - 1] == t:  # same read
                i -= 1
                n += tokens[i]
            if times[i - 1] >= t:
                return False
            gaps.append((t - times[i - 1]) / n)
            i -= 1
        if len(gaps) < k:
            return False
        if max(gaps) / min(gaps) > settings.steady_max_ratio:
            return False
    return True


async def run_baseline(driver: EngineDriver, d: int, settings: ProtocolSettings) -> BaselineRun:
    """Phase 1: D decode-only streams, 256 tokens each. A failed Phase 1 ends its streams before it
    raises (`end_streams`), so a re-run never decodes beside them; one with a probe silent for
    several steps fails (`baseline_gap_problem`)."""
    if d == 0:
        return BaselineRun(0, [], None)
    probes = start_probes(driver, d, settings)
    try:
        await wait_for(driver, probes, lambda: all(p.done for p in probes), settings.window_timeout_s,
                       f"{d} baseline decode streams did not finish", stall_s=settings.stall_timeout_s)
    except PdexporterError:
        await end_streams(driver, probes, settings.window_timeout_s)
        raise
    traces = [StreamTrace.of(p) for p in probes]
    stats = baseline_stats([t.token_times() for t in traces], settings.window)
    if stats is None:
        raise MeasurementError(
            f"baseline streams produced no intervals after the {settings.warmup_tokens} warm-up tokens"
        )
    problem = baseline_gap_problem(traces, stats, settings)
    if problem:
        raise MeasurementError(problem)
    return BaselineRun(d, traces, stats)


def baseline_gap_problem(traces: Sequence[StreamTrace], stats: BaselineStats, settings: ProtocolSettings) -> str | None:
    """Why Phase 1 is not a steady decode-only cadence, or None: a probe silent (between two of its
    token events, after its first and before its last) longer than max(`baseline_gap_ratio` x the median interval,
    `baseline_gap_floor_ms`). The seed's steady state holds 8 intervals within 2x of each other;
    a silence of 8 median steps is no engine cadence but a stall (the engine's, its connection's, a
    proxy's), and it would stay in the baseline's mean and tail (a 10-20 s stall: p50 1.8 ms, mean
    23.8-44.7 ms). The floor keeps a loaded client's hiccups and a real engine's rare slow step (up
    to 361 ms at a 6-11 ms cadence in the committed H200 baselines, always the final token) from
    failing it; the final token's interval is not judged at all (641 ms on the embedded engine in
    `sim calibrate`'s simulated protocol, where every probe finishes in one step)."""
    limit_ms = max(settings.baseline_gap_ratio * stats.p50_ms, settings.baseline_gap_floor_ms)
    worst_ms, who, after = 0.0, "", 0
    for trace in traces:
        times = [t for t, n in zip(trace.event_times_ns, trace.event_tokens) if n > 0]
        counts = list(itertools.accumulate(n for n in trace.event_tokens if n > 0))
        for i in range(1, len(times) - 1):  # not the last: a stream's final token waits on its finish
            gap_ms = (times[i] - times[i - 1]) / 1e6
            if gap_ms > worst_ms:
                worst_ms, who, after = gap_ms, trace.request_id, counts[i - 1]
    if worst_ms <= limit_ms:
        return None
    return (f"a probe ({who}) was silent for {worst_ms:.0f} ms after its token {after}, more than "
            f"max({settings.baseline_gap_ratio:g} x the {stats.p50_ms:.2f} ms median interval, "
            f"{settings.baseline_gap_floor_ms:g} ms): the engine or its connection stalled")


async def end_streams(driver: EngineDriver, streams: Sequence[TokenStream], timeout_s: float) -> None:
    """End what a failed attempt left open before anything else runs: cancelled where the driver can
    (`driver.Cancelling`: each cancellation awaited, its connection closed, and the engine aborts
    the request, as when a client goes away), else waited for to its end (at most `timeout_s`)."""
    left = [s for s in streams if not s.done]
    if not left:
        return
    if isinstance(driver, Cancelling):
        await driver.cancel(left)
        return
    if not await driver.progress.wait_until(lambda: all(s.done for s in left), timeout_s):
        raise MeasurementError(f"{len(left)} stream(s) of a failed run did not end within {timeout_s:g} s, "
                               "and this engine driver cannot cancel them")


class BusyAtInjection(MeasurementError):
    """At the injection the engine ran other than the window's D probes (`injection_problem`)."""


def injection_problem(before: MetricsSnapshot | None, d: int) -> str | None:
    """What the engine's /metrics just before the injection says against "exactly the window's D
    probes running, nothing waiting", or None (also where it does not say)."""
    if before is None:
        return None
    running, waiting = before.get("num_requests_running"), before.get("num_requests_waiting")
    if running is None or waiting is None or (running == d and waiting == 0):
        return None
    return f"at injection the engine ran {running:g} and queued {waiting:g} requests (expected {d} and 0)"


def logged_injection_problem(steps: Sequence[IterationStep] | None, d: int) -> str | None:
    """What the engine's own step log says against "exactly the window's D probes decoding when the
    prefill came": the decodes of the last decode step before the prefill's first chunk, or None
    where the log shows no such step (no log, D = 0, no decode step logged in between). Exact where
    the gauges may not be (SGLang sets them only when it logs a batch): an SGLang mixed-mode window
    of GPU session 13 decoded beside 24 requests at D = 12 (a probe set not yet aborted), its
    penalty 709 ms against the others' 80-90, while /metrics could only be reported, not trusted."""
    if not steps or d < 1:
        return None
    first = next((i for i, s in enumerate(steps) if s.context_tokens > 0), None)
    decoding = [s.generation_requests for s in steps[:first] if s.generation_requests > 0]
    if first is None or not decoding or decoding[-1] == d:
        return None
    return (f"the engine's step log shows {decoding[-1]} requests decoding in the step before the prefill's "
            f"first chunk (expected the {d} probes)")


SETTLE_POLL_S = 0.05  # how often `settle_engine` reads /metrics
NUDGE_AFTER_S = 1.0  # how long the gauges may say "busy" before a one-token request makes the engine step


async def _engine_load(driver: EngineDriver) -> tuple[float, float] | None:
    snapshot = await driver.scrape_metrics()
    if snapshot is None:
        return None
    running, waiting = snapshot.get("num_requests_running"), snapshot.get("num_requests_waiting")
    return None if running is None or waiting is None else (running, waiting)


async def settle_engine(driver: EngineDriver, settings: ProtocolSettings) -> None:
    """Before a re-run, after the failed attempt's streams were ended (`end_streams`): wait until the
    engine runs nothing, by its /metrics (no request running or waiting), at most
    `settle_timeout_s`, else one line. Nothing to wait for where /metrics cannot be read or its
    gauges are not current (`EngineAdapter.request_gauges_per_step`). vLLM leaves its gauges as they
    were when every request was aborted until it steps again (vllm-project/vllm#22545), so gauges
    still busy after `NUDGE_AFTER_S` get a one-token request (outside any window) to make it step."""
    if not adapter(driver.info.kind).request_gauges_per_step:
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    nudged = start
    while (load := await _engine_load(driver)) is not None and load != (0, 0):
        now = loop.time()
        if now - start >= settings.settle_timeout_s:
            raise MeasurementError(
                f"the engine still ran {load[0]:g} and queued {load[1]:g} request(s) {settings.settle_timeout_s:g} s "
                "after the failed run's streams were ended (expected none; protocol.settle_timeout_s): another "
                "client is using it, or it did not abort those requests; a measurement needs the engine to itself")
        if now - nudged >= NUDGE_AFTER_S:
            nudge = cold_prompt(1, f"settle-{uuid.uuid4()}", settings.token_range)
            await run_single(driver, nudge, 1, "settle", settings.settle_timeout_s)
            nudged = loop.time()
            continue
        await asyncio.sleep(SETTLE_POLL_S)


def _tokens_after(stream: TokenStream, t_ns: float) -> int:
    total = 0
    for t, n in zip(reversed(stream.event_times_ns), reversed(stream.event_tokens)):
        if t <= t_ns:
            break
        total += n
    return total


@runtime_checkable
class ProbeSet(Protocol):
    """The D decode streams a window perturbs."""

    async def ready(self, driver: EngineDriver, d: int, p: int) -> list[TokenStream]:
        """Streams in the seed's steady state, able to carry a window of a P-token prefill."""
        ...

    async def settle(self, driver: EngineDriver, streams: Sequence[TokenStream],
                     after_ns: int) -> tuple[int, list[TokenStream]]:
        """Wait until the streams moved on after `after_ns` (the engine scrape just before the
        injection held up their reads); returns t_decide, the moment the injection is decided,
        and the streams the window perturbs (a continuous set may have replaced some meanwhile)."""
        ...

    async def release(self, driver: EngineDriver, streams: Sequence[TokenStream]) -> None:
        """After the window's recovery intervals: what the set does with its streams."""
        ...

    def traces(self, streams: Sequence[TokenStream], t_inject_ns: int,
               window_end_ns: float | None = None) -> list[StreamTrace]:
        """The streams as the window maths and the raw file see them; `window_end_ns`: where this
        window's intervals end and its recovery begins (`recovery_end_ns`), for a set whose streams
        carry the next window too."""
        ...

    def raw_extra(self) -> dict[str, Any]:
        """Keys the raw file gets to say how its probes were run."""
        ...

    async def abandon(self, driver: EngineDriver, others: Sequence[TokenStream]) -> None:
        """The window failed: end what it leaves open that must not run beside the next one (this
        set's streams where they were the window's own, and `others`: its prefill), `end_streams`."""
        ...


@runtime_checkable
class BaselineSource(Protocol):
    """What the window is compared with, and what the record says about it."""

    @property
    def rule(self) -> str:
        """ "phase1" | "live-quiet": the record's baseline.source"""
        ...

    def at(self, t_decide_ns: int) -> tuple[BaselineStats | None, dict[str, Any]]:
        """The baseline for a window decided at t_decide, and extra keys for the raw file."""
        ...


async def run_window(
    driver: EngineDriver,
    d: int,
    p: int,
    settings: ProtocolSettings,
    probes: ProbeSet,
    baseline: BaselineSource,
    *,
    salt: str | None = None,
    prepared: PreparedRequest | None = None,
    chunk_size: int | None = None,
    exclusive: bool = False,
) -> InterferenceRun:
    """Phase 2, the one implementation: D probe streams in steady state perturbed by one cold
    P-token prefill (module docs), for every caller; `probes` and `baseline` say which streams
    and what they are compared with (`measure.probesets`). `prepared` is the prefill's request
    when the caller encoded it earlier (it must be encoded before the window opens).

    `exclusive` (measure, sweep: the engine is theirs alone): a window whose engine, by its
    /metrics just before the injection, runs other than exactly the D probes or queues anything is
    refused before the prefill leaves (`BusyAtInjection`), where the engine's gauges are current
    (`EngineAdapter.request_gauges_per_step`). A window that fails leaves nothing of its own
    running (`ProbeSet.abandon`), so a re-run never decodes beside it."""
    started: list[TokenStream] = []  # the prefill, once sent
    try:
        return await _window(driver, d, p, settings, probes, baseline, salt=salt, prepared=prepared,
                             chunk_size=chunk_size, exclusive=exclusive, started=started)
    except PdexporterError:
        await probes.abandon(driver, started)
        raise


async def _window(
    driver: EngineDriver, d: int, p: int, settings: ProtocolSettings, probes: ProbeSet, baseline: BaselineSource,
    *, salt: str | None, prepared: PreparedRequest | None, chunk_size: int | None, exclusive: bool,
    started: list[TokenStream],
) -> InterferenceRun:
    salt = salt or str(uuid.uuid4())
    if prepared is None:
        prepared = driver.prepare(cold_prompt(p, salt, settings.token_range), settings.prefill_max_tokens, "prefill")
    if isinstance(driver, Routing):
        await driver.route_ahead(prepared)  # a P/D pair: the prefill instance's half, before the window
    streams = await probes.ready(driver, d, p) if d else []
    before = await driver.scrape_metrics()
    busy = injection_problem(before, d) if exclusive and adapter(driver.info.kind).request_gauges_per_step else None
    if busy:
        raise BusyAtInjection(busy)
    # The scrape (its parse runs on this loop) can hold up the probes' reads for several ms; the
    # tokens that waited would be stamped late, right after t_inject, as a slow interval and a
    # burst inside the window. Fresh tokens on every probe put that behind us first.
    t_decide, streams = await probes.settle(driver, streams, driver.now_ns()) if d else (driver.now_ns(), [])
    base, baseline_extra = baseline.at(t_decide)
    mark = driver.step_mark()

    prefill = driver.start(prepared)  # inside the window: never retried
    started.append(prefill)
    everything = [*streams, prefill]
    await wait_for(driver, everything, lambda: prefill.t_first_ns is not None or prefill.done,
                   settings.window_timeout_s, f"the {p}-token prefill produced no token",
                   stall_s=settings.stall_timeout_s)
    if prefill.t_first_ns is None or prefill.t_sent_ns is None:
        raise MeasurementError(f"the {p}-token prefill finished without a token ({prefill.finish_reason})")
    t_inject, t_first = prefill.t_sent_ns, prefill.t_first_ns
    ended_early = [s.request_id for s in streams if s.finished and (s.t_finished_ns or 0) <= t_first]
    if ended_early:
        raise MeasurementError(
            f"{len(ended_early)} probe stream(s) ended before the prefill's first token: raise "
            f"decode_output_tokens above {settings.decode_output_tokens}"
        )
    kind = driver.info.kind
    window_end = recovery_end_ns(kind, t_first, base)
    await wait_for(
        driver, everything,
        lambda: prefill.done and all(s.done or _tokens_after(s, window_end) > settings.after_intervals
                                     for s in streams),
        settings.window_timeout_s, "probe streams did not recover after the prefill",
        stall_s=settings.stall_timeout_s,
    )
    problem = prompt_tokens_problem(prefill.prompt_tokens, prepared.prompt_tokens)
    if problem:
        raise MeasurementError(f"the {p}-token prefill: {problem}")
    after = await driver.scrape_metrics()
    await probes.release(driver, streams)
    steps = driver.steps_since(mark)
    if steps is not None:
        steps = [s for s in steps if s.context_tokens > 0 or s.generation_requests > 0]
    logged_busy = logged_injection_problem(steps, d) if exclusive else None
    if logged_busy:  # the engine's own log, exact where its gauges were not to be trusted
        raise BusyAtInjection(logged_busy)

    traces = probes.traces(streams, t_inject, window_end)
    problem = stamp_problem(traces, base, settings.window)
    if problem:
        raise MeasurementError(problem)
    schedule = expected_schedule(kind, p, chunk_size or driver.info.chunk_size, d)
    plan, anchor = chunk_plan(kind, steps, schedule, p), window_anchor_ns(kind, t_first, base, traces)
    window = _analyse_told(traces, t_inject, t_first, base, settings.window, plan, anchor)
    return InterferenceRun(
        decode_batch_size=d,
        new_prefill_tokens=p,
        probes=traces,
        prefill=StreamTrace.of(prefill),
        t_inject_ns=t_inject,
        t_first_ns=t_first,
        window=window,
        baseline=base,
        baseline_rule=baseline.rule,
        metrics_before=before,
        metrics_after=after,
        engine_steps=steps,
        schedule=schedule,
        salt=salt,
        extra={**baseline_extra, **probes.raw_extra()} if d else dict(baseline_extra),
        offload=driver.route_of(prefill) if isinstance(driver, Routing) else None,
        engine=kind,
        plan=plan,
        anchor_ns=anchor,
    )
