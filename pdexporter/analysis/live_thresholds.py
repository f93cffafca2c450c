"""The router threshold, live from production traffic (`run --passive --decision FILE`). Pure.

A committed two-arm `decision.json` supplies what production traffic cannot show the exporter:
the offloaded arm (its terms), the KV transfer and the colocated TTFT. The colocated side, what a
prefill costs the decodes running beside it, is the one passive mode measures: the event-fitted
cost model (`analysis.passive_model`) replaces the file's, with its bootstrap refits as the
replicates behind every interval and the events' D and P as its fitted range. The thresholds are
then `analysis.thresholds.compute_thresholds` of that document: the one computation `pdexporter
thresholds` runs.

What the events do not measure is kept from the file and said so: the live fit leaves out events
below the prediction grid's P span (their chunk runs as a CUDA-graph step, `analysis.passive_model`),
so where it has no graph-step term (`kappa_graph_ms_per_token` unmeasured) the file's graph-step
terms (kappa, graph0) stand in, replicate by replicate. A threshold below the events' prompts is
marked as outside the measured P (`Threshold.outside`).

The router's number is for the current load: the median D of the recent events (`RECENT_S`), and
the interval's safe end where the threshold is undecided (`Threshold.safe`).
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdexporter.analysis.passive_model import FitEvent, Grid, PassiveModel
from pdexporter.analysis.thresholds import ThresholdSet, compute_thresholds, llmd_snippet
from pdexporter.engines import DEFAULT_CHUNK_SIZE

__all__ = [
    "GRAPH_TERMS", "MAX_LIVE_D", "RECENT_S", "LiveThresholds", "decision_problem", "live_decision", "live_thresholds",
]

GRAPH_TERMS = ("kappa_graph_ms_per_token", "graph0_ms")  # kept from the file where the events measured none
RECENT_S = 300.0  # the current load: the events of the last 5 minutes of traffic
MAX_LIVE_D = 64  # thresholds for D = 1 .. this at most (a bounded label set)


def decision_problem(doc: Mapping[str, Any]) -> str | None:
    """Why a decision document cannot supply the live thresholds' offloaded arm (None: it can)."""
    if not doc.get("two_arm"):
        return "has one arm only: the live threshold needs the offloaded arm and the transfer (export-table " \
               "RESULTS --offloaded DIR writes a two-arm decision.json)"
    if (doc.get("model") or {}).get("name") != "context_aware":
        return f"its colocated model is {(doc.get('model') or {}).get('name')!r}: the live fit replaces a " \
               "context_aware one"
    try:  # the file's own threshold at one point: a document the evaluator cannot read fails here, not live
        b = int(((doc.get("two_arm") or {}).get("measured_chunk_sizes") or [DEFAULT_CHUNK_SIZE])[0])
        compute_thresholds(doc, chunk_sizes=[b], decode_batch_sizes=[1], replicates=0)
    except (ArithmeticError, KeyError, TypeError, ValueError) as exc:
        return f"its two-arm verdict cannot be evaluated ({type(exc).__name__}: {exc})"
    return None


def _merged(live: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The live coefficients, the file's graph-step terms where the events measured none."""
    out = dict(live)
    if out.get("kappa_graph_ms_per_token") is None:
        for name in GRAPH_TERMS:
            out[name] = base.get(name)
    return out


def live_decision(base: Mapping[str, Any], model: PassiveModel, chunk_size: int, *,
                  modelled: bool = False) -> dict[str, Any]:
    """`base` (a two-arm decision.json) with its colocated cost model fitted on the events (module docs)."""
    doc = copy.deepcopy(dict(base))
    base_k = (base.get("model") or {}).get("coefficients") or {}
    live = model.model.to_dict()
    borrowed = live["coefficients"].get("kappa_graph_ms_per_token") is None and \
        base_k.get("kappa_graph_ms_per_token") is not None
    doc["model"] = {**live, "coefficients": _merged(live["coefficients"], base_k),
                    "graph_regime": "from the decision file" if borrowed else live.get("graph_regime")}
    reps = base.get("replicates") or {}
    base_reps = list(reps.get("model") or [])
    n = min(len(model.draws), len(reps.get("two_arm") or []) or len(model.draws))
    doc["replicates"] = {
        "model": [_merged(m.to_dict()["coefficients"], base_reps[i] if i < len(base_reps) else base_k)
                  for i, m in enumerate(model.draws[:n])],
        "two_arm": list(reps.get("two_arm") or [])[:n],
    }
    doc["valid_range"] = {"decode_batch_size": list(model.d_range), "new_prefill_tokens": list(model.p_range),
                          "chunk_size": [chunk_size, chunk_size], "chunk_sizes": [chunk_size]}
    doc["fit"] = {"held_out_r2": None, "scheme": "bootstrap over events", "in_sample_r2": model.in_sample_r2,
                  "n_points": model.events, "chosen_because": "passive mode: fitted on production prefills"}
    doc["modelled"] = bool(base.get("modelled")) or modelled
    doc["live"] = {"events_used": model.events, "traffic_minutes": round(model.minutes, 3),
                   "graph_terms": "decision file" if borrowed else "events"}
    return doc


@dataclass(frozen=True)
class LiveThresholds:
    """One refresh of the live thresholds."""

    result: ThresholdSet
    chunk_size: int
    current_d: int | None  # the D the router's number is for (None: no recent event)
    events: int  # events the fit used
    events_by_d: dict[int, int]  # of those, at each exact D
    d_range: tuple[int, int]
    p_range: tuple[int, int]
    minutes: float
    graph_terms: str  # "events" | "decision file"

    def snippet(self, age_s: float | None = None) -> str:
        """The llm-d decider configuration for the current load, with its age and the events behind it."""
        d = self.current_d if self.current_d is not None else max(self.events_by_d or {1: 0})
        notes = [f"live: from {self.events} production prefills over {self.minutes:.1f} min of traffic "
                 f"(D {self.d_range[0]}..{self.d_range[1]}, P {self.p_range[0]}..{self.p_range[1]}); "
                 f"{self.events_by_d.get(d, 0)} of them at D={d}",
                 f"live: the current load is D={d} (the median of the last {RECENT_S / 60:g} min of events); "
                 f"CUDA-graph step terms from the {self.graph_terms}"]
        if age_s is not None:
            notes.append(f"live: computed {age_s:.0f} s ago")
        return llmd_snippet(self.result, self.chunk_size, d, notes=notes)


def _usable(events: Sequence[FitEvent], grid: Grid) -> list[FitEvent]:
    """The events the live fit uses (`passive_model.fit_passive_model`'s choice)."""
    chunk = set(grid.chunk_sizes)
    return [e for e in events if e.decode >= 1 and e.chunk_size in chunk and grid.fits_prompt(e.prompt)]


def live_thresholds(base: Mapping[str, Any], model: PassiveModel, events: Sequence[FitEvent], grid: Grid, *,
                    replicates: int | None = None, modelled: bool = False) -> LiveThresholds:
    """The thresholds at the grid's chunk size for D = 1 .. max(the file's D, the events' D)."""
    chunk_size = grid.chunk_sizes[0]
    doc = live_decision(base, model, chunk_size, modelled=modelled)
    used = _usable(events, grid)
    d_hi = max(int(((base.get("valid_range") or {}).get("decode_batch_size") or [1, 1])[1]), model.d_range[1])
    decodes = [d for d in range(1, min(d_hi, MAX_LIVE_D) + 1) if d < chunk_size]
    result = compute_thresholds(doc, chunk_sizes=[chunk_size], decode_batch_sizes=decodes,
                                replicates=len(doc["replicates"]["model"]) if replicates is None else replicates)
    by_d: dict[int, int] = {}
    for e in used:
        by_d[e.decode] = by_d.get(e.decode, 0) + 1
    last = max((e.at_s for e in events), default=0.0)
    recent = [e.decode for e in events if e.decode >= 1 and e.at_s >= last - RECENT_S]
    current = None
    if recent and decodes:
        current = min(max(round(statistics.median(recent)), decodes[0]), decodes[-1])
    return LiveThresholds(result, chunk_size, current, model.events, by_d, model.d_range, model.p_range,
                          model.minutes, doc["live"]["graph_terms"])
