"""Break-even: when does moving a prefill to another instance beat running it beside the decodes?

    break_even_transfer_time(D, P, B) = C(D, P, B)

the aggregate interference cost of the prefill (ms of decode time lost summed over the D running
streams, `analysis.models`). Offloading costs a transfer (the layer-wise KV pipeline of P/D
disaggregation); it wins when that transfer takes less than C: **offload iff C > transfer_ms**.
The default transfer budget is the seed's 50 ms.

`decision_document` exports the chosen fitted model as JSON a router can load (schema
"pdexporter.decision/v2", documented in docs/analysis.md), with the engine's chunk rule and the
model's bootstrap replicates (every answer's interval); `evaluate_decision` (module
`decision_eval`, standard library only, meant to be copied into a router) is the whole evaluator,
the seed's rule and, when the document carries both arms (`two_arm`, `analysis.arms`), the
verdict in the user's terms (docs/disaggregation.md).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from pdexporter import __version__
from pdexporter.analysis import DECISION_JSON, DECISION_SCHEMA, DEFAULT_TRANSFER_MS  # noqa: F401 (re-exported)
from pdexporter.analysis.models import ContextAwareModel, CostModel, FitData, FitReport, bootstrap_context, num_chunks
from pdexporter.analysis.thresholds import compute_thresholds
from pdexporter.engines import DEFAULT_ENGINE, adapter

__all__ = [
    "Region", "break_even_frame", "decision_document", "model_decision", "offload_region",
]


def break_even_frame(table: pd.DataFrame, model: CostModel, transfer_ms: float = DEFAULT_TRANSFER_MS) -> pd.DataFrame:
    """Per grid point with D >= 1: measured and modelled break-even transfer time, and the verdicts."""
    rows = table[table["decode_batch_size"] >= 1]
    out = rows[["chunk_size", "decode_batch_size", "new_prefill_tokens"]].copy()
    out["break_even_measured_ms"] = rows["aggregate_interference_ms"].to_numpy(np.float64)
    out["break_even_model_ms"] = model.predict(
        rows["decode_batch_size"], rows["new_prefill_tokens"], rows["chunk_size"]
    )
    out["offload_measured"] = out["break_even_measured_ms"] > transfer_ms
    out["offload_model"] = out["break_even_model_ms"] > transfer_ms
    return out.reset_index(drop=True)


@dataclass(frozen=True)
class Region:
    """Modelled cost over a (D, P) grid at one chunk size; offload wins where cost > transfer."""

    chunk_size: int
    decodes: np.ndarray
    prefills: np.ndarray
    cost_ms: np.ndarray  # shape (len(decodes), len(prefills))
    transfer_ms: float

    @property
    def offload(self) -> np.ndarray:
        return self.cost_ms > self.transfer_ms


def offload_region(model: CostModel, chunk_size: int, decodes: ArrayLike, prefills: ArrayLike,
                   transfer_ms: float = DEFAULT_TRANSFER_MS) -> Region:
    d = np.asarray(decodes, np.float64)
    p = np.asarray(prefills, np.float64)
    dd, pp = np.meshgrid(d, p, indexing="ij")
    cost = model.predict(dd, pp, np.full_like(dd, chunk_size))
    return Region(chunk_size, d, p, cost, transfer_ms)


REPLICATES = 200  # bootstrap resamples behind every interval


def decision_document(
    report: FitReport,
    table: pd.DataFrame,
    transfer_ms: float = DEFAULT_TRANSFER_MS,
    *,
    source: str = "",
    now: dt.datetime | None = None,
    data: FitData | None = None,
    replicates: int = REPLICATES,
) -> dict[str, Any]:
    """The chosen model as the router's decision function (schema in docs/analysis.md). With the
    fit's `data`, the context-aware model's bootstrap replicates ride along (`replicates`)."""
    fit = report.best
    model = fit.model
    fitted = table[(table["decode_batch_size"] >= 1) & table["aggregate_interference_ms"].notna()]
    chunk_sizes = sorted(int(b) for b in fitted["chunk_size"].unique())
    max_d = int(fitted["decode_batch_size"].max()) if len(fitted) else 0
    modelled = bool(table["modelled"].any()) if len(table) else False
    engines = sorted(str(e) for e in table["engine"].dropna().unique())
    engine = data.engine if data is not None else DEFAULT_ENGINE
    rule = model.rule if isinstance(model, ContextAwareModel) else adapter(engine).chunk_rule
    reps: list[dict[str, float | None]] = []
    if data is not None and isinstance(model, ContextAwareModel) and replicates:
        reps = bootstrap_context(data, model, replicates)
    doc: dict[str, Any] = {
        "schema": DECISION_SCHEMA,
        "rule": "offload when cost_ms > transfer_ms",
        "cost": "aggregate interference of the prefill over the running decode batch, ms (D x per-stream total)",
        "chunks": ("n = ceil(P / budget), budget = B - D where the decodes take their tokens of the step budget "
                   "first (chunk_rule.decodes_take_budget), else B; B = max_num_batched_tokens"),
        "chunk_rule": {"engine": engine, **rule.to_dict()},
        "transfer_ms_default": float(transfer_ms),
        "model": model.to_dict(),
        "replicates": {"model": reps} if reps else {},
        "fit": {
            "held_out_r2": report.held_out_r2(),
            "scheme": report.primary_scheme,
            "in_sample_r2": fit.in_sample_r2,
            "n_points": report.n_points,
            "chosen_because": report.reason,
        },
        "valid_range": {
            "decode_batch_size": [int(fitted["decode_batch_size"].min()), max_d] if len(fitted) else None,
            "new_prefill_tokens": ([int(fitted["new_prefill_tokens"].min()), int(fitted["new_prefill_tokens"].max())]
                                   if len(fitted) else None),
            "chunk_size": [chunk_sizes[0], chunk_sizes[-1]] if chunk_sizes else None,
            "chunk_sizes": chunk_sizes,
        },
        "thresholds_min_prefill_tokens": {},
        "modelled": modelled,
        "engines": engines,
        "source": source,
        "generated_by": f"pdexporter {__version__}",
        "generated_at": (now or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds"),
    }
    # the seed's rule at this budget, central coefficients: the one computation (analysis.thresholds)
    seed = compute_thresholds(doc, mode="seed", transfer_ms=transfer_ms, replicates=0,
                              decode_batch_sizes=range(1, max_d + 1))
    doc["thresholds_min_prefill_tokens"] = {
        str(b): {str(t.decode_batch_size): t.threshold for t in seed.by_chunk_size(b)} for b in chunk_sizes
    }
    return doc


# ---------------------------------------------------------------------------------------------
# The evaluator a router copies lives in `decision_eval` (standard library only, both arms).

from pdexporter.analysis.decision_eval import evaluate_decision, offload_threshold  # noqa: E402,F401 (re-exported)


def model_decision(model: CostModel, d: int, p: int, b: int, transfer_ms: float = DEFAULT_TRANSFER_MS) -> dict:
    """The same verdict straight from a fitted model (what the JSON must reproduce)."""
    cost = float(model.predict(d, p, b))
    return {"offload": cost > transfer_ms, "cost_ms": cost, "transfer_ms": transfer_ms,
            "margin_ms": cost - transfer_ms, "chunks": int(num_chunks(p, b, d)), "model": model.name}
