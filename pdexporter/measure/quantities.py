"""Every number a window produces, declared once.

A `Quantity` says what the number is (name, unit, meaning), where it comes from (`source`: an
attribute of the window maths' `BaselineStats`, `WindowStats` or `Derived`, or of the
repetition's context), and every name it goes by downstream:

- `block`/`field`: its key in the per-run record (`measure.records`: the block models are
  generated from this table, the seed's keys first);
- `column`: its column in the interference table (`analysis.table`), None if not tabulated;
- `gauge`: the last-window gauge the exporter and a sweep's `--listen` publish
  (`exporter.metrics`), which `export-table --prometheus` reads back into `column`;
- `span`: the attribute on the window span (`exporter.tracing`).

`docs/metrics.md` carries a table generated from `QUANTITIES` (a test keeps it current), and the
dashboards' "last window" panel lists every gauge declared here. Adding a quantity is one entry
here plus its computation in `measure.window`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Unit = Literal["ms", "ratio", "count", "bytes"]
Block = Literal["baseline", "interference", "derived"]
PREFIX = "pdexporter"


@dataclass(frozen=True)
class Quantity:
    field: str  # key in the record block
    block: Block
    unit: Unit
    meaning: str
    source: str  # "baseline.p50_ms", "window.during_p50_ms", "derived.slowdown", "context.prompt_tokens"
    column: str | None = None
    gauge: str | None = None  # without the `pdexporter_` prefix
    span: str | None = None  # without the `pdexporter.window.` prefix
    # "table": the seed's table column and record key; "column": the seed's table column only (the record
    # keeps the seed's key for another statistic); "record": the seed's record key only
    seed: Literal["table", "column", "record"] | None = None
    arm: Literal["offloaded"] | None = None  # a column only tables of that arm carry (docs/disaggregation.md)
    # A difference that may come out below zero (a penalty inside the noise); every other quantity
    # (a duration, a TPOT, a count, a ratio of two of them) is >= 0, and a record saying otherwise is refused.
    signed: bool = False

    @property
    def integer(self) -> bool:
        return self.unit in ("count", "bytes")

    @property
    def gauge_name(self) -> str | None:
        return f"{PREFIX}_{self.gauge}" if self.gauge else None

    @property
    def gauge_factor(self) -> float:
        """Record value -> gauge value (ms -> seconds, base units for Prometheus)."""
        return 1e-3 if self.unit == "ms" else 1.0

    @property
    def span_attribute(self) -> str | None:
        return f"{PREFIX}.window.{self.span}" if self.span else None

    def value(self, sources: Mapping[str, Any]) -> Any:
        """Read the quantity off the window maths' objects (`sources`: name -> object or None)."""
        owner, attribute = self.source.split(".", 1)
        obj = sources.get(owner)
        return None if obj is None else getattr(obj, attribute)


def _q(*args: Any, **kwargs: Any) -> Quantity:
    return Quantity(*args, **kwargs)


QUANTITIES: tuple[Quantity, ...] = (
    # --- the seed's table columns, in the seed's order ----------------------------------------
    _q("tpot_p50_ms", "baseline", "ms", "decode-only TPOT p50 (Phase 1, or the live quiet period)",
       "baseline.p50_ms", column="tpot_baseline_ms", gauge="window_tpot_baseline_seconds",
       span="tpot_baseline_ms", seed="table"),
    _q("tpot_during_prefill_mean_ms", "interference", "ms",
       "TPOT over the chunk steps, their mean with each step weighted by its chunk's tokens (the seed's "
       "TPOT_interference; it moves with P within a chunk count)",
       "window.during_mean_ms", column="tpot_interference_ms", gauge="window_tpot_during_prefill_seconds",
       span="tpot_during_prefill_mean_ms", seed="column"),
    _q("tpot_penalty_ms", "derived", "ms",
       "TPOT during the prefill (token-weighted mean) minus the baseline: how much slower each decode token is "
       "while the prefill runs (the seed's TPOT_penalty)",
       "derived.tpot_penalty_ms", column="tpot_penalty_ms", gauge="window_tpot_penalty_seconds",
       span="tpot_penalty_ms", seed="column", signed=True),
    _q("tpot_penalty_ratio", "derived", "ratio", "penalty / baseline (the seed's tpot_penalty_ratio)",
       "derived.tpot_penalty_ratio", column="penalty_ratio", gauge="window_tpot_penalty_ratio",
       span="tpot_penalty_ratio", seed="table", signed=True),
    _q("num_chunks_actual", "interference", "count",
       "the prefill's chunks: the engine log's count, else the chunk steps the probes saw slow",
       "window.num_chunks_actual", column="num_chunks", gauge="window_chunks", span="num_chunks", seed="table"),
    _q("prefill_duration_ms", "interference", "ms", "prefill submission to its first token",
       "window.prefill_duration_ms", column="prefill_duration_ms", gauge="window_prefill_duration_seconds",
       span="prefill_duration_ms", seed="table"),
    # --- the seed's other record keys ------------------------------------------------------------
    _q("tpot_during_prefill_p50_ms", "interference", "ms",
       "TPOT p50 over the chunk steps, each weighted by its chunk's tokens (the seed's record key)",
       "window.during_p50_ms", column="tpot_interference_p50_ms", gauge="window_tpot_during_prefill_p50_seconds",
       span="tpot_during_prefill_p50_ms", seed="record"),
    _q("tpot_penalty_p50_ms", "derived", "ms", "TPOT during the prefill (token-weighted p50) minus the baseline "
       "(the seed's record key; jumps between chunk steps as P grows within a chunk count)",
       "derived.tpot_penalty_p50_ms", column="tpot_penalty_p50_ms", gauge="window_tpot_penalty_p50_seconds",
       span="tpot_penalty_p50_ms", seed="record", signed=True),
    _q("tpot_p90_ms", "baseline", "ms", "decode-only TPOT p90", "baseline.p90_ms",
       column="tpot_baseline_p90_ms", seed="record"),
    _q("tpot_p99_ms", "baseline", "ms", "decode-only TPOT p99", "baseline.p99_ms", seed="record"),
    _q("step_time_ms", "baseline", "ms", "decode-only engine step (the decode cadence)", "baseline.step_time_ms",
       seed="record"),
    _q("tpot_during_prefill_p90_ms", "interference", "ms", "TPOT p90 over the chunk steps (token-weighted)",
       "window.during_p90_ms", column="tpot_interference_p90_ms", span="tpot_during_prefill_p90_ms", seed="record"),
    _q("tpot_after_prefill_p50_ms", "interference", "ms", "TPOT p50 over the 32 intervals after the window",
       "window.after_p50_ms", column="tpot_after_prefill_ms", gauge="window_tpot_after_prefill_seconds",
       span="tpot_after_prefill_p50_ms", seed="record"),
    _q("prefill_ttft_ms", "interference", "ms", "the prefill's time to first token (= prefill_duration_ms)",
       "window.prefill_duration_ms", seed="record"),
    _q("total_interference_ms", "derived", "ms",
       "per decode stream: the sum over the window of (interval - the decodes' own step just before the "
       "injection, Phase 1's p50 where they ran fewer than 8 steps before it), the time one decode lost",
       "derived.total_interference_ms", column="total_interference_ms", gauge="window_total_interference_seconds",
       span="total_interference_ms", seed="record", signed=True),
    _q("decode_tokens_delayed", "derived", "count", "slow decode intervals in the window, all streams",
       "derived.decode_tokens_delayed", column="decode_tokens_delayed", seed="record"),
    # --- beyond the seed -----------------------------------------------------------------------
    _q("tpot_mean_ms", "baseline", "ms", "decode-only TPOT mean", "baseline.mean_ms"),
    _q("n_intervals", "baseline", "count", "intervals the baseline pooled", "baseline.n_intervals",
       span="baseline_intervals"),
    _q("tpot_during_prefill_p99_ms", "interference", "ms", "TPOT p99 over the chunk steps (token-weighted)",
       "window.during_p99_ms", column="tpot_interference_p99_ms", gauge="window_tpot_during_prefill_p99_seconds",
       span="tpot_during_prefill_p99_ms"),
    _q("tpot_window_p50_ms", "interference", "ms", "TPOT p50 over every interval of the window (stalls included)",
       "window.window_p50_ms"),
    _q("tpot_pre_injection_p50_ms", "interference", "ms", "TPOT p50 of the probes before the injection",
       "window.pre_p50_ms"),
    _q("num_chunks_seen", "interference", "count", "located chunk steps the probes saw slow",
       "window.num_chunks_seen", column="num_chunks_seen", gauge="window_chunks_seen", span="chunks_seen"),
    _q("num_chunks_expected", "interference", "count",
       "the chunk steps the decodes see by the engine's rule: ceil(P / (B - D)) for vLLM, 1 for SGLang's default",
       "context.num_chunks_expected", column="num_chunks_expected", gauge="window_expected_chunks",
       span="expected_chunks"),
    _q("num_chunks_engine_log", "interference", "count", "chunks in the engine's own step log, when read",
       "context.num_chunks_engine_log", column="num_chunks_engine_log", span="engine_log_chunks"),
    _q("slow_steps", "interference", "count",
       "decode steps the prefill slowed (its chunks plus the engine's admission/retirement stalls)",
       "window.slow_steps", column="slow_steps", gauge="window_slow_steps", span="slow_steps"),
    _q("slow_step_threshold_ms", "interference", "ms", "an interval above this is slow", "window.slow_threshold_ms"),
    _q("window_intervals", "interference", "count", "probe intervals in the window, all streams",
       "window.window_intervals"),
    _q("zero_intervals", "interference", "count", "~0 ms intervals in the window (client stamping delays)",
       "window.zero_intervals", span="zero_intervals"),
    _q("min_interval_ms", "interference", "ms", "the shortest interval in the window", "window.min_interval_ms"),
    _q("stamp_corrections", "interference", "count",
       "probe events whose arrival stamp came before the previous event's, held at it (a 0 ms interval); "
       "null: none",
       "window.stamp_corrections"),
    _q("prefill_prompt_tokens", "interference", "count", "the engine's usage.prompt_tokens of the prefill",
       "context.prefill_prompt_tokens"),
    _q("slowdown", "derived", "ratio", "TPOT during the prefill / baseline", "derived.slowdown"),
    _q("aggregate_interference_ms", "derived", "ms",
       "D x total_interference_ms: what the prefill cost the whole decode batch (the offload rule's cost)",
       "derived.aggregate_interference_ms", column="aggregate_interference_ms",
       gauge="window_aggregate_interference_seconds", span="aggregate_interference_ms", signed=True),
    # --- the offloaded arm: a P/D pair's routed prefill (measure/pd.py, docs/disaggregation.md) --
    _q("offload_prefill_ms", "interference", "ms",
       "offloaded arm: the prefill instance's half of the routed request (sent -> its answer)",
       "offload.prefill_ms", column="offload_prefill_ms", arm="offloaded"),
    _q("offload_route_ms", "interference", "ms",
       "offloaded arm: the router's own work between the two halves (the prefill's answer -> decode request ready)",
       "offload.route_ms", arm="offloaded"),
    _q("offload_decode_ms", "interference", "ms",
       "offloaded arm: the decode instance's half (sent -> first token): KV transfer, admission, first decode step",
       "offload.decode_ms", column="offload_decode_ms", arm="offloaded"),
    _q("offload_ttft_ms", "interference", "ms",
       "offloaded arm: the routed request's TTFT, prefill + route + decode halves",
       "offload.ttft_ms", column="offload_ttft_ms", arm="offloaded"),
    _q("kv_transfer_ms", "interference", "ms",
       "offloaded arm: KV transfer time the decode instance's connector measured in the window "
       "(NixlConnector: vllm:nixl_xfer_time_seconds)", "offload.kv_transfer_ms", column="kv_transfer_ms",
       arm="offloaded"),
    _q("kv_bytes", "interference", "bytes",
       "offloaded arm: KV bytes the decode instance received in the window (vllm:nixl_bytes_transferred)",
       "offload.kv_bytes", column="kv_bytes", arm="offloaded"),
    _q("kv_transfers", "interference", "count", "offloaded arm: KV transfers the connector counted in the window",
       "offload.kv_transfers", arm="offloaded"),
)

BY_FIELD: dict[tuple[str, str], Quantity] = {(q.block, q.field): q for q in QUANTITIES}
BY_COLUMN: dict[str, Quantity] = {q.column: q for q in QUANTITIES if q.column}


def in_block(block: Block) -> tuple[Quantity, ...]:
    return tuple(q for q in QUANTITIES if q.block == block)


def tabulated(arm: str | None = None) -> tuple[Quantity, ...]:
    """Quantities with a table column: the seed's columns first, in the seed's order; with `arm`,
    also the columns only that arm's tables carry (appended at the end)."""
    return tuple(q for q in QUANTITIES if q.column and (q.arm is None or q.arm == arm))


def seed_record_keys(block: Block) -> tuple[str, ...]:
    """The seed's record keys of a block (its example record)."""
    return tuple(q.field for q in in_block(block) if q.seed in ("table", "record"))


def seed_columns() -> tuple[str, ...]:
    """The seed's value columns of interference_table.csv, in its order."""
    return tuple(q.column for q in QUANTITIES if q.seed in ("table", "column") and q.column)


def gauged() -> tuple[Quantity, ...]:
    return tuple(q for q in QUANTITIES if q.gauge)


def spanned() -> tuple[Quantity, ...]:
    return tuple(q for q in QUANTITIES if q.span)


def _round(value: Any, integer: bool, digits: int = 4) -> Any:
    if value is None:
        return None
    return int(value) if integer else round(float(value), digits)


def block_values(block: Block, sources: Mapping[str, Any]) -> dict[str, Any]:
    """The record block's quantity fields, read off the window maths' objects and rounded."""
    return {q.field: _round(q.value(sources), q.integer) for q in in_block(block)}


def markdown_table(quantities: Iterable[Quantity] = QUANTITIES) -> str:
    """The table docs/metrics.md carries (between its generated-section markers)."""
    rows = ["| record key | unit | table column | gauge | span attribute | meaning |", "|---|---|---|---|---|---|"]
    for q in quantities:
        rows.append(
            f"| `{q.block}.{q.field}` | {q.unit} | {f'`{q.column}`' if q.column else ''} | "
            f"{f'`{q.gauge_name}`' if q.gauge else ''} | {f'`{q.span_attribute}`' if q.span else ''} | "
            f"{q.meaning}{' (seed)' if q.seed else ''} |"
        )
    return "\n".join(rows)


__all__ = [
    "BY_COLUMN", "BY_FIELD", "QUANTITIES", "Quantity", "block_values", "gauged", "in_block", "markdown_table",
    "seed_columns", "seed_record_keys", "spanned", "tabulated",
]
