"""The router thresholds: per (B, D), the prompt length from which offloading wins. One computation
for `pdexporter thresholds`, the report, decision.json's `thresholds_min_prefill_tokens` and the
live exporter (`run --passive --decision`): `compute_thresholds(doc, ...)` takes a decision
document and returns typed records. Pure, standard library only at import (the exporter imports it without
numpy or pandas); numpy, where there, speeds the replicates' scan (`array_stack`).

The verdict at each P is `decision_eval`'s (`offload_thresholds`: the two-arm verdict, or the
seed's rule, for the central coefficients and each bootstrap replicate), so a change to how the
evaluation decides flows through here. Per (B, D):

- `threshold`: the smallest P (a multiple of `step`) from which every P up to `p_max` offloads
  for the central coefficients; None ("never") when P = p_max does not;
- `low`..`high`: the 5th..95th percentile of the replicates' thresholds (`high` None: some
  replicates never offload up to p_max), each replicate judged at every P by its numbers widened
  as the verdict's agreement widens them there (how far the terms lie beyond their fitted range),
  so a threshold beyond the measured P has the wider interval the verdicts there have;
  "undecided" where `high` > UNDECIDED_RATIO x `low`;
- `at_floor`: every P scanned offloads (the threshold is "<= step", not exactly `step`);
- `outside`: "below" / "above" where the threshold lies outside the prompt lengths every model
  of the verdict was fitted on (`measured_p`), so the answer there is the models' extrapolation;
- the transfer budget the verdict charged (`Budget`), and at the threshold's P (`transfer_ms`).

A router takes `safe`: the threshold, or the interval's upper end where undecided (offload only
where it surely wins).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdexporter.analysis.decision_eval import evaluate_decision, offload_thresholds
from pdexporter.engines import DEFAULT_CHUNK_SIZE

__all__ = [
    "LLMD_DOCS", "LLMD_SNIPPET", "THRESHOLDS_JSON", "THRESHOLDS_SCHEMA", "UNDECIDED_RATIO", "Budget", "Threshold",
    "ThresholdSet", "array_stack", "budget_of", "compute_thresholds", "llmd_snippet", "measured_p_range",
]

THRESHOLDS_JSON = "offload_thresholds.json"
LLMD_SNIPPET = "llm-d-pd-decider.yaml"
THRESHOLDS_SCHEMA = "pdexporter.offload-thresholds/v2"
LLMD_DOCS = "https://github.com/llm-d/llm-d-inference-scheduler/blob/main/docs/disaggregation.md"
UNDECIDED_RATIO = 2.0  # a threshold whose 90 % interval spans more than this factor is "undecided"
NEVER = 2**31 - 1  # llm-d's nonCachedTokens that never disaggregates


@dataclass(frozen=True)
class Budget:
    """The transfer an offload is charged: a fixed time (`ms`: given, or the seed's constant) or
    the measured model latency + P x bytes per token / bandwidth (`model`)."""

    source: str  # "given" | "measured" | "seed-constant"
    ms: float | None
    model: Mapping[str, Any] | None
    regime: str

    def text(self) -> str:
        if self.ms is not None:
            what = "--transfer-ms" if self.source == "given" else "the seed's constant: no transfer measured"
            return f"transfer budget {self.ms:g} ms ({what})"
        m = self.model or {}
        return (f"transfer budget measured: {m.get('latency_ms', 0.0):.1f} ms + P x "
                f"{m.get('bytes_per_token', 0.0) / 1024:.0f} KiB at {m.get('gb_per_s', 0.0):.0f} GB/s "
                f"({self.regime} regime)")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "ms": self.ms, "regime": self.regime}
        if self.model is not None:
            out["model"] = {k: self.model.get(k) for k in ("latency_ms", "gb_per_s", "bytes_per_token")}
        return out


def budget_of(doc: Mapping[str, Any], mode: str, regime: str, transfer_ms: float | None) -> Budget:
    """What `decision_eval` charges for the transfer in this mode (its own rule, read off the document)."""
    if transfer_ms is not None:
        return Budget("given", float(transfer_ms), None, regime)
    transfer = ((doc.get("two_arm") or {}).get("terms") or {}).get("transfer") or {}
    if transfer.get("source") in ("measured", "given"):
        if regime == "degraded" and transfer.get("degraded") and mode == "two-arm":
            transfer = {**transfer, **transfer["degraded"]}
        return Budget(str(transfer["source"]), None, transfer, regime)
    return Budget("seed-constant", float(doc.get("transfer_ms_default", 50.0)), None, regime)


def measured_p_range(doc: Mapping[str, Any], mode: str) -> tuple[int, int] | None:
    """The prompt lengths every model of the verdict was fitted on: the colocated cost model's
    range, and in two-arm mode each term's (with a measured transfer's) as well."""
    ranges = [(doc.get("valid_range") or {}).get("new_prefill_tokens")]
    if mode == "two-arm":
        for term in ((doc.get("two_arm") or {}).get("terms") or {}).values():
            ranges.append(((term or {}).get("range") or {}).get("new_prefill_tokens"))
    found = [(int(r[0]), int(r[1])) for r in ranges if r]
    if not found:
        return None
    return max(lo for lo, _ in found), min(hi for _, hi in found)


@dataclass(frozen=True)
class Threshold:
    """One (B, D)'s threshold (module docs)."""

    chunk_size: int
    decode_batch_size: int
    threshold: int | None
    low: int | None
    high: int | None
    has_interval: bool
    status: str  # "decided" | "undecided" | "never"
    at_floor: bool
    outside: str | None  # "below" | "above" | None
    extrapolated: tuple[str, ...]
    transfer_ms: float | None
    modelled_b: bool  # two-arm: the offloaded arm was not measured at this B

    @property
    def safe(self) -> int | None:
        """The router's number: the threshold, or its interval's upper end where undecided."""
        if self.status == "undecided" and self.has_interval:
            return self.high
        return self.threshold

    def interval(self) -> list[int | None] | None:
        return [self.low, self.high] if self.has_interval else None

    def mark(self, measured_p: tuple[int, int] | None, *, short: bool = False) -> str:
        """What a reader must know beside the number: outside the measured P, or at the floor."""
        parts = []
        if self.at_floor:
            parts.append("every P scanned offloads")
        if self.outside and measured_p:
            parts.append(f"{self.outside} the measured P" if short else
                         f"{self.outside} the measured P {measured_p[0]}..{measured_p[1]}: extrapolated")
        return "; ".join(parts)

    def text(self, step: int, p_max: int, measured_p: tuple[int, int] | None = None) -> str:
        """One line: '>= 512 (90 %: 448..576)', 'undecided between 64 and 320 (central 192)', 'never'."""
        if self.threshold is None:
            return f"never (up to {p_max} tokens)"
        high = "never" if self.high is None else str(self.high)
        mark = self.mark(measured_p)
        mark = f" [{mark}]" if mark else ""
        if self.status == "undecided":
            return f"undecided between {self.low} and {high} (central {self.threshold}){mark}"
        value = f"<= {step}" if self.at_floor else f">= {self.threshold}"
        span = f" (90 %: {self.low}..{high})" if self.has_interval else ""
        return f"{value}{span}{mark}"

    def cell(self, measured_p: tuple[int, int] | None = None, *, short: bool = False) -> str:
        """A table cell: '512 (448..576)', 'undecided: 192 (64..320)', 'never', with its marks."""
        if self.threshold is None:
            return "never"
        span = f" ({self.low}..{'never' if self.high is None else self.high})" if self.has_interval else ""
        value = f"<= {self.threshold}" if self.at_floor else str(self.threshold)
        mark = self.mark(measured_p, short=short)
        return (f"{'undecided: ' if self.status == 'undecided' else ''}{value}{span}"
                + (f" [{mark}]" if mark else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "interval": self.interval(), "status": self.status,
                "safe": self.safe, "at_floor": self.at_floor, "outside_measured_p": self.outside,
                "transfer_ms": None if self.transfer_ms is None else round(self.transfer_ms, 3),
                "extrapolated": list(self.extrapolated)}


@dataclass(frozen=True)
class ThresholdSet:
    """Every (B, D)'s threshold under one verdict, budget and set of SLOs."""

    mode: str
    regime: str
    budget: Budget
    tpot_slo_ms: float | None
    ttft_slo_ms: float | None
    p_max: int
    step: int
    replicates: int
    measured_p: tuple[int, int] | None
    records: tuple[Threshold, ...]
    modelled: bool
    measured_chunk_sizes: tuple[int, ...] = field(default=())

    def at(self, b: int, d: int) -> Threshold | None:
        return next((r for r in self.records if r.chunk_size == b and r.decode_batch_size == d), None)

    def chunk_sizes(self) -> list[int]:
        return sorted({r.chunk_size for r in self.records})

    def by_chunk_size(self, b: int) -> list[Threshold]:
        return sorted((r for r in self.records if r.chunk_size == b), key=lambda r: r.decode_batch_size)

    def rising(self) -> list[str]:
        """Where a decided threshold rises with D at a fixed B beyond both thresholds' intervals
        (more decodes lose more to a colocated prefill, so it should fall or stay): listed for the
        reader to look at. A rise inside the intervals is the bootstrap's noise, not a finding."""
        out = []
        for b in self.chunk_sizes():
            last: tuple[int, int, int] | None = None
            for t in self.by_chunk_size(b):
                if t.threshold is None:
                    continue
                low = t.low if t.has_interval and t.low is not None else t.threshold
                if last is not None and t.threshold > last[1] and t.status == "decided" and low > last[2]:
                    out.append(f"B={b}: D={last[0]} {last[1]} -> D={t.decode_batch_size} {t.threshold}")
                high = t.high if t.has_interval else t.threshold
                last = (t.decode_batch_size, t.threshold, t.threshold if high is None else high)
        return out

    def to_dict(self) -> dict[str, Any]:
        """offload_thresholds.json (schema `THRESHOLDS_SCHEMA`)."""
        per = {str(b): {"modelled": any(r.modelled_b for r in self.by_chunk_size(b)),
                        "by_decode_batch_size": {str(r.decode_batch_size): r.to_dict() for r in self.by_chunk_size(b)}}
               for b in self.chunk_sizes()}
        return {
            "schema": THRESHOLDS_SCHEMA,
            "meaning": "offload a prefill of at least `threshold` (non-cached) tokens at chunk size B and D running "
                       "decodes; `interval`: the 5th-95th percentile over the bootstrap resamples, each judged with "
                       "its numbers widened as the verdict's where the models extrapolate; status "
                       "'undecided' where that interval spans more than a factor 2 (the fits cannot place it "
                       "closer), 'never' where offloading does not win up to p_max; `safe`: the router's number "
                       "(the upper end where undecided); `at_floor`: every P scanned offloads (<= step_tokens); "
                       "`outside_measured_p`: below/above the prompt lengths every model was fitted on "
                       "(`measured_p`), an extrapolation; `transfer`: the budget the verdict charged, "
                       "`transfer_ms` its value at the threshold",
            "mode": self.mode, "regime": self.regime, "transfer": self.budget.to_dict(),
            "tpot_slo_ms": self.tpot_slo_ms, "ttft_slo_ms": self.ttft_slo_ms, "p_max": self.p_max,
            "step_tokens": self.step, "replicates": self.replicates,
            "measured_p": None if self.measured_p is None else list(self.measured_p),
            "chunk_sizes": per, "rises_with_d": self.rising(), "modelled": self.modelled,
        }


def _percentile_interval(values: Sequence[int | None], p_max: int) -> tuple[int | None, int | None]:
    """5th..95th percentile (nearest rank) of the replicates' thresholds; a replicate that never
    offloads counts as beyond p_max, and an upper end beyond p_max is None ("never")."""
    ordered = sorted(v if v is not None else p_max * 2 for v in values)
    lo = ordered[round(0.05 * (len(ordered) - 1))]
    hi = ordered[round(0.95 * (len(ordered) - 1))]
    return lo, (None if hi > p_max else hi)


def _record(doc: Mapping[str, Any], b: int, d: int, values: Sequence[int | None], ctx: dict[str, Any]) -> Threshold:
    central, reps = values[0], values[1:]
    p_max, step, mode = ctx["p_max"], ctx["step"], ctx["mode"]
    low = high = None
    if reps:
        low, high = _percentile_interval(reps, p_max)
    if central is None:
        status = "never"
    elif reps and (high is None or high > UNDECIDED_RATIO * max(low or 0, 1)):
        status = "undecided"
    else:
        status = "decided"
    outside = None
    measured = ctx["measured_p"]
    if central is not None and measured is not None:
        outside = "below" if central < measured[0] else ("above" if central > measured[1] else None)
    extrapolated: tuple[str, ...] = ()
    transfer = None
    if central is not None:
        # the seed's rule charges the nominal transfer whatever the regime (decision_eval's `_wins`)
        v = evaluate_decision(doc, d, central, b, ctx["transfer_ms"], mode=mode,
                              regime=ctx["regime"] if mode == "two-arm" else "nominal", intervals=False)
        extrapolated, transfer = tuple(v["extrapolated"]), float(v["transfer_ms"])
    return Threshold(b, d, central, low, high, bool(reps), status, central is not None and central <= step,
                     outside, extrapolated, transfer, ctx["two_arm"] and b not in ctx["measured_b"])


def compute_thresholds(doc: Mapping[str, Any], *, tpot_slo_ms: float | None = None, ttft_slo_ms: float | None = None,
                       mode: str | None = None, regime: str = "nominal", transfer_ms: float | None = None,
                       p_max: int = 131072, step: int = 64, replicates: int | None = 100,
                       chunk_sizes: Iterable[int] | None = None,
                       decode_batch_sizes: Iterable[int] | None = None) -> ThresholdSet:
    """Per (B, D): the threshold with its interval over up to `replicates` bootstrap replicates
    (module docs). B: `chunk_sizes`, else the chunk sizes the colocated model was fitted on and
    those where both arms were measured; D: `decode_batch_sizes`, else the fitted range (D < B)."""
    dict_doc: dict[str, Any] = dict(doc)
    arms = dict_doc.get("two_arm") or {}
    mode = mode or ("two-arm" if arms else "seed")
    rng = dict_doc.get("valid_range") or {}
    measured_b = tuple(sorted(int(b) for b in (arms.get("measured_chunk_sizes") or [])))
    colocated_bs = sorted({int(b) for b in (rng.get("chunk_sizes") or [])}) or [DEFAULT_CHUNK_SIZE]
    sizes = list(chunk_sizes) if chunk_sizes else (sorted(set(measured_b) | set(colocated_bs)) if arms
                                                    else colocated_bs)
    d_lo, d_hi = (rng.get("decode_batch_size") or [1, 1])
    decodes = list(decode_batch_sizes) if decode_batch_sizes else list(range(max(1, d_lo), d_hi + 1))
    n_reps = len((dict_doc.get("replicates") or {}).get("model") or [])
    use = list(range(min(n_reps, replicates))) if replicates else []
    measured_p = measured_p_range(dict_doc, mode)
    ctx = {"p_max": p_max, "step": step, "mode": mode, "regime": regime, "transfer_ms": transfer_ms,
           "measured_p": measured_p, "two_arm": bool(arms) and mode == "two-arm", "measured_b": measured_b}
    stack = array_stack()
    records = []
    for b in sizes:
        for d in decodes:
            if d >= b:
                continue
            values = offload_thresholds(dict_doc, d, b, (None, *use), tpot_slo_ms=tpot_slo_ms,
                                        ttft_slo_ms=ttft_slo_ms, mode=mode, p_max=p_max, step=step, regime=regime,
                                        transfer_ms=transfer_ms, stack=stack)
            records.append(_record(dict_doc, b, d, values, ctx))
    return ThresholdSet(mode, regime, budget_of(dict_doc, mode, regime, transfer_ms), tpot_slo_ms, ttft_slo_ms,
                        p_max, step, len(use), measured_p, tuple(records), bool(dict_doc.get("modelled")), measured_b)


def array_stack() -> Callable[[list[float]], Any] | None:
    """The `stack` `decision_eval`'s array paths take (`offload_thresholds` here, `replicate_costs` in `pdexporter
    validate`): numpy.asarray where numpy speaks the Python array API (>= 2.0), else None, one by one (a numpy 1.x
    array brings no namespace, and the scalar branches would meet it). Imported when asked for, not with the module:
    `decision_eval` itself stays standard library only."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a dependency; decision_eval alone runs without it
        return None
    return numpy.asarray if hasattr(numpy.ndarray, "__array_namespace__") else None


def llmd_snippet(result: ThresholdSet, b: int, d: int, *, notes: Sequence[str] = ()) -> str:
    """An llm-d EndpointPickerConfig fragment: the prefix-based PD decider with the threshold at
    (B, D). llm-d disaggregates when a prompt's non-cached suffix is longer than `nonCachedTokens`
    (llm-d-inference-scheduler docs/disaggregation.md), so it gets the safe threshold minus one (an
    undecided threshold's upper end: offload only where it surely wins, and it says so). `notes`:
    further comment lines (the live exporter's age and events)."""
    entry = result.at(b, d)
    others = ", ".join(f"D={t.decode_batch_size}: {t.cell(result.measured_p, short=True)}"
                       for t in result.by_chunk_size(b))
    safe = entry.safe if entry is not None else None
    if entry is None or safe is None:
        value, note = NEVER, f"offloading never wins at B={b}, D={d} up to {result.p_max} tokens: never disaggregate"
    else:
        value, note = safe - 1, f"offload prompts of >= {safe} non-cached tokens at B={b}, D={d}"
        if entry.status == "undecided":
            note += f" (undecided between {entry.low} and {entry.high}: its upper end)"
        mark = entry.mark(result.measured_p)
        if mark:
            note += f" [{mark}]"
    slos = ", ".join(f"{k} {v:g} ms" for k, v in (("tpot_slo_ms", result.tpot_slo_ms),
                                                  ("ttft_slo_ms", result.ttft_slo_ms)) if v is not None)
    modelled = "# MODELLED: from the embedded engine, not from a GPU\n" if result.modelled else ""
    if entry is not None and entry.modelled_b:
        modelled += f"# MODELLED: the offloaded arm was not measured at B={b}\n"
    extra = "".join(f"# {line}\n" for line in notes)
    return (
        f"# pdexporter: {note} ({result.mode} verdict{', SLOs ' + slos if slos else ''}; {result.budget.text()}).\n"
        f"# Thresholds at B={b} for the other D: {others}\n"
        "# llm-d's decider takes one number: pick the D your decode pods usually run.\n"
        f"# Plugin and parameter: {LLMD_DOCS}\n{modelled}{extra}"
        "featureGates:\n- prepareDataPlugins\nplugins:\n"
        "- type: prefix-based-pd-decider\n  parameters:\n"
        f"    nonCachedTokens: {value}\n"
        "- type: disagg-profile-handler\n  parameters:\n    prefillProfile: prefill\n    decodeProfile: decode\n"
        "    prefillDeciderPluginName: prefix-based-pd-decider\n"
    )
