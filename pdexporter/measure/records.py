"""The per-run record: the seed's JSON, exactly its keys, plus what a reviewer needs to trust it.

`results/{chunk_size}/D{d}_P{p}.json` holds `config / baseline / interference / derived` with
the seed's keys (values are medians over repetitions, "p50 over 5 runs"), then extra keys:
`reps` (each repetition's own numbers, its engine-metric deltas and the file of its raw
timestamps), `summary` (CV across repetitions) and `provenance`. Records from the embedded
engine say so in `config.engine`, `config.modelled` and `config.note`.
"""

from __future__ import annotations

import datetime as dt
import platform
import statistics
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from pdexporter import __version__
from pdexporter._internal.bounds import MAX_DECODE_BATCH, MAX_TOKENS, MIN_DECODE_BATCH
from pdexporter.engines import DEFAULT_ENGINE
from pdexporter.measure.quantities import Block, block_values, in_block
from pdexporter.measure.window import BaselineStats, Derived, WindowStats

__all__ = [
    "BaselineBlock", "DerivedBlock", "InterferenceBlock", "RECORD_SCHEMA", "RecordConfig", "RepRecord", "RunRecord",
    "SEED_KEYS",
    "Summary", "aggregate", "baseline_block", "counted_reps", "cv", "derived_block", "interference_block", "provenance",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class RecordConfig(_Model):
    # Bounded as the options and sweep files are (`_internal.bounds`): a record outside them is
    # one line naming its file (`store.load_record_file`), never a crash of the table built on it.
    decode_batch_size: int = Field(ge=MIN_DECODE_BATCH, le=MAX_DECODE_BATCH)
    new_prefill_tokens: int = Field(ge=1, le=MAX_TOKENS)
    chunk_size: int = Field(ge=1, le=MAX_TOKENS)
    model: str
    gpu: str
    engine: str = DEFAULT_ENGINE
    engine_version: str | None = None
    engine_url: str | None = None
    modelled: bool = False
    note: str | None = None
    profile: str | None = None
    cuda_graphs: bool | None = None
    decode_context_tokens: int = 4096
    decode_output_tokens: int = 256
    prefill_max_tokens: int = 1
    mode: str = "faithful"
    reps_planned: int = 1
    # how the engine was started (secrets redacted); None where pdexporter did not start it
    engine_command: list[str] | None = None
    # "given" (a flag, a sweep file, the embedded engine's own), "published" (the engine said it:
    # SGLang's /server_info) or "assumed": the engine's default, nobody said (see window.py)
    chunk_size_source: str = "given"
    # Which side of the offload decision (docs/disaggregation.md): "colocated" (the prefill beside
    # the decodes) or "offloaded" (this engine is a P/D pair's decode instance), and its KV connector.
    arm: str = "colocated"
    kv_connector: str | None = None
    prefill_engine: dict[str, Any] | None = None  # a pair's prefill instance: kind, url, version, command


SEED_KEYS: dict[str, tuple[str, ...]] = {
    "config": ("decode_batch_size", "new_prefill_tokens", "chunk_size", "model", "gpu"),
    "baseline": ("tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "step_time_ms"),
    "interference": (
        "tpot_during_prefill_p50_ms",
        "tpot_during_prefill_p90_ms",
        "tpot_after_prefill_p50_ms",
        "num_chunks_actual",
        "prefill_duration_ms",
        "prefill_ttft_ms",
    ),
    "derived": ("tpot_penalty_p50_ms", "tpot_penalty_ratio", "total_interference_ms", "decode_tokens_delayed"),
}


def _block_model(name: str, block: Block, **meta: Any) -> type[_Model]:
    """A record block: the seed's keys first (required, in the seed's order), then every other
    quantity `measure.quantities` declares for the block (optional), then `meta`: what the block
    says about where its numbers come from."""
    seed = SEED_KEYS[block]
    declared = {q.field: q for q in in_block(block)}
    ordered = [declared[f] for f in seed] + [q for q in declared.values() if q.field not in seed]
    fields: dict[str, Any] = {}
    for q in ordered:
        kind: Any = int if q.integer else float
        floor = None if q.signed else 0  # `Quantity.signed`: every other quantity is >= 0
        default: Any = ... if q.field in seed else None
        fields[q.field] = (kind | None, Field(default, ge=floor))
    return create_model(name, __base__=_Model, **fields, **meta)


if TYPE_CHECKING:
    # What mypy sees of the three block models: `_block_model` builds their fields at import from
    # `measure.quantities` (declared once there), which no static checker can follow, so a field
    # read is typed Any; the models themselves (constructors, model_dump, ...) are checked.
    class _TypedBlock(_Model):
        def __getattr__(self, name: str) -> Any: ...

    class BaselineBlock(_TypedBlock): ...

    class InterferenceBlock(_TypedBlock): ...

    class DerivedBlock(_TypedBlock): ...
else:
    BaselineBlock = _block_model("BaselineBlock", "baseline", source=(str, "phase1"))  # "phase1" | "live-quiet"
    InterferenceBlock = _block_model(
        "InterferenceBlock", "interference",
        num_chunks_source=(str | None, None),  # "engine-log" | "cadence" | "slow-steps" (measure.window)
        chunk_schedule_check=(str | None, None),  # "confirmed" | "contradicted"
        chunk_tokens_engine_log=(list[int] | None, None),
        chunk_step_times_ms=(list[float], Field(default_factory=list)),
        # usage.prompt_tokens of the prefill against the P token ids sent: "exact" | "unreported"
        # ("differs" fails the window: measure.protocol.prompt_tokens_check)
        prompt_tokens_check=(str | None, None),
        # What the engine's step log says against "exactly the D probes decoding when the prefill
        # came" (measure.protocol.logged_injection_problem), None when it says nothing against it: a
        # repetition that has one is kept in the record and left out of every aggregate (`RepRecord.counted`)
        injection_check=(str | None, None),
    )
    DerivedBlock = _block_model("DerivedBlock", "derived")


class RepRecord(_Model):
    rep: int = Field(ge=0)
    baseline: BaselineBlock
    interference: InterferenceBlock
    derived: DerivedBlock
    raw: str | None = None
    engine_metrics: dict[str, float] = Field(default_factory=dict)
    started_at: str | None = None
    # How often this repetition was run again after a fault before it was kept, and how often the
    # Phase 1 its baseline came from was (`measure.point.retrying`; issue 31: only the raw file said).
    retries: int = Field(0, ge=0)
    baseline_retries: int = Field(0, ge=0)
    # Extra keys an interleaved sweep (sweep file `order: interleaved`) adds: `block`, the block
    # this repetition ran in, and `block_position`, its place in that block's order (sweep.json
    # lists each block's order). Absent otherwise, so other records are unchanged.

    @property
    def counted(self) -> bool:
        """Whether the aggregates use this repetition: not when the engine's step log showed it
        decoding other requests than the D probes at the injection (`interference.injection_check`)."""
        return self.interference.injection_check is None

    def summary_line(self) -> str:
        b, i, d = self.baseline, self.interference, self.derived
        return (f"baseline {_ms(b.tpot_p50_ms)} during {_ms(i.tpot_during_prefill_mean_ms)} penalty "
                f"{_ms(d.tpot_penalty_ms)} prefill {_ms(i.prefill_duration_ms)} slow steps {i.slow_steps}, "
                f"chunks {i.num_chunks_actual}/{i.num_chunks_expected} ({i.num_chunks_source})")


def counted_reps(reps: Sequence[RepRecord]) -> list[RepRecord]:
    """The repetitions every aggregate uses (`RepRecord.counted`), in their order; all of them when
    none is counted (a record is never left without numbers)."""
    return [r for r in reps if r.counted] or list(reps)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


class Summary(_Model):
    reps_done: int
    aggregation: str = "median over repetitions"
    cv_tpot_penalty: float | None = None
    cv_prefill_duration: float | None = None
    cv_tpot_interference: float | None = None


# The record's layout version. A reader refuses a record of a later one (`store.load_record_file`):
# it may hold keys this pdexporter does not know, which a rewrite (the next repetition) would drop.
# 1: every record written before the field existed; 2: the field.
RECORD_SCHEMA = 2


class RunRecord(_Model):
    config: RecordConfig
    baseline: BaselineBlock
    interference: InterferenceBlock
    derived: DerivedBlock
    reps: list[RepRecord] = Field(default_factory=list)
    summary: Summary | None = None
    provenance: dict[str, Any] = Field(default_factory=dict)
    schema_version: int = 1

    @property
    def key(self) -> tuple[int, int, int]:
        c = self.config
        return (c.chunk_size, c.decode_batch_size, c.new_prefill_tokens)


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


def baseline_block(stats: BaselineStats | None, source: str = "phase1") -> BaselineBlock:
    return BaselineBlock(**block_values("baseline", {"baseline": stats}), source=source)


def interference_block(
    window: WindowStats,
    *,
    num_chunks_expected: int | None,
    engine_chunks: Sequence[int] | None,
    prefill_prompt_tokens: int | None,
    offload: object | None = None,
    prompt_tokens_check: str | None = None,
    injection_check: str | None = None,
) -> InterferenceBlock:
    """`offload`: the offloaded arm's numbers of this repetition (`measure.pd.OffloadNumbers`)."""
    context = SimpleNamespace(
        num_chunks_expected=num_chunks_expected,
        num_chunks_engine_log=len(engine_chunks) if engine_chunks is not None else None,
        prefill_prompt_tokens=prefill_prompt_tokens,
    )
    return InterferenceBlock(
        **block_values("interference", {"window": window, "context": context, "offload": offload}),
        num_chunks_source=window.num_chunks_source,
        chunk_schedule_check=window.chunk_schedule_check,
        chunk_tokens_engine_log=list(engine_chunks) if engine_chunks is not None else None,
        chunk_step_times_ms=[round(x, 3) for x in window.chunk_step_times_ms],
        prompt_tokens_check=prompt_tokens_check,
        injection_check=injection_check,
    )


def derived_block(derived: Derived) -> DerivedBlock:
    return DerivedBlock(**block_values("derived", {"derived": derived}))


def _median(values: Sequence[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.median(present) if present else None


def cv(values: Sequence[float | None]) -> float | None:
    """Coefficient of variation (sample stdev / |mean|); None below two values or at mean 0."""
    present = [float(v) for v in values if v is not None]
    if len(present) < 2:
        return None
    mean = statistics.fmean(present)
    if mean == 0:
        return None
    return statistics.stdev(present) / abs(mean)


def _median_block(blocks: Sequence[BaselineBlock | InterferenceBlock | DerivedBlock], cls: type[_Model]) -> Any:
    """Field-wise median of numeric fields; lists and strings come from the median-penalty rep."""
    first = blocks[0].model_dump()
    out: dict[str, Any] = {}
    for name, value in first.items():
        column = [b.model_dump()[name] for b in blocks]
        if isinstance(value, bool) or not all(isinstance(v, (int, float)) or v is None for v in column):
            out[name] = value
            continue
        med = _median(column)
        if med is None:
            out[name] = None
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in column if v is not None):
            out[name] = int(round(med))
        else:
            out[name] = _r(med)
    return cls.model_validate(out)


def aggregate(config: RecordConfig, reps: Sequence[RepRecord]) -> RunRecord:
    """The record's top level: medians over repetitions, with CVs in `summary`."""
    if not reps:
        raise ValueError("a record needs at least one repetition")
    everything = sorted(reps, key=lambda r: r.rep)
    ordered = counted_reps(everything)  # a repetition beside other requests is kept, not aggregated
    # Lists (chunk sizes, slow-step times) cannot be medianed; take them from the rep whose
    # penalty is the median one so the top level describes one real run.
    penalties = [r.derived.tpot_penalty_ms for r in ordered]
    present = [(p, i) for i, p in enumerate(penalties) if p is not None]
    pivot = ordered[sorted(present)[len(present) // 2][1]] if present else ordered[len(ordered) // 2]
    baseline = _median_block([r.baseline for r in ordered], BaselineBlock)
    interference = _median_block(
        [pivot.interference] + [r.interference for r in ordered if r is not pivot], InterferenceBlock
    )
    derived = _median_block([r.derived for r in ordered], DerivedBlock)
    summary = Summary(
        reps_done=len(ordered),
        cv_tpot_penalty=_r(cv(penalties)),
        cv_prefill_duration=_r(cv([r.interference.prefill_duration_ms for r in ordered])),
        cv_tpot_interference=_r(cv([r.interference.tpot_during_prefill_mean_ms for r in ordered])),
    )
    return RunRecord(
        config=config,
        baseline=baseline,
        interference=interference,
        derived=derived,
        reps=list(everything),
        summary=summary,
        provenance=provenance(),
        schema_version=RECORD_SCHEMA,
    )


def provenance() -> dict[str, Any]:
    return {
        "pdexporter_version": __version__,
        "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
    }
