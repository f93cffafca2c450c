"""Both arms of the offload decision: the colocated table joined with the offloaded one, the
measured transfer model, the linear models the two-arm verdict evaluates, the thresholds a P/D
router takes, and the check of a prediction from one GPU against a measured pair.
Pure: tables in, tables and dicts out (docs/disaggregation.md).

The offloaded table comes from records of a P/D pair's decode instance (`config.arm` =
"offloaded"): DecodeBenchConnector on one GPU (a free transfer, no prefill instance) or a real
1P1D pair (NixlConnector; the routed request's TTFT split and the connector-measured transfer).

Models (each `{"features", "coefficients", "r2", "n", "target", "source"}`, linear in the
features of `decision_eval.feature`, least squares over the grid points that have the number):

- `offloaded_cost_per_stream`: the offloaded arm's total_interference_ms ~ 1 + D + P (x D gives
  the aggregate the D decodes still lose on the decode instance);
- `colocated_ttft`: the colocated prefill's TTFT ~ 1 + P + P^2 + chunks + D x chunks;
- `offloaded_prefill`: the prefill instance's half, measured (offload_prefill_ms ~ 1 + P + P^2),
  else the colocated TTFT model evaluated at D = 0 (the prefill alone on its GPU);
- `offloaded_decode`: the decode instance's half, measured on a pair (offload_decode_ms ~ 1 + P
  + D: transfer included), else DecodeBench's submission-to-first-token (the transfer is free
  there, so the transfer model is added: `decode_side_excludes_transfer`);
- `colocated_tpot` / `offloaded_tpot`: the decodes' TPOT during the prefill (the seed's
  TPOT_interference) for the TPOT SLO;
- `transfer`: kv_transfer_ms = fixed_ms + P x ms_per_token fitted on the pair's measured
  transfers (bandwidth = measured bytes per token / ms_per_token), or given, or none (then the
  seed's constant stands in, and says so).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from pdexporter.analysis.decision_eval import evaluate_decision, feature, offload_threshold, transfer_time
from pdexporter.analysis.table import KEY_COLUMNS

JOIN_COLUMNS = (
    "offloaded_tpot_penalty_ms", "offloaded_aggregate_interference_ms", "kv_transfer_ms", "kv_bytes",
    "offloaded_ttft_ms", "offload_prefill_ms", "offloaded_decode_side_ms", "colocated_ttft_ms", "offloaded_engine",
)
THRESHOLDS_JSON = "offload_thresholds.json"
THRESHOLDS_SCHEMA = "pdexporter.offload-thresholds/v1"
LLMD_SNIPPET = "llm-d-pd-decider.yaml"
LLMD_DOCS = "https://github.com/llm-d/llm-d-inference-scheduler/blob/main/docs/disaggregation.md"


def join_arms(colocated: pd.DataFrame, offloaded: pd.DataFrame) -> pd.DataFrame:
    """The colocated table, unchanged and first, with the offloaded arm's numbers at the same
    (B, D, P) appended (`JOIN_COLUMNS`; empty where the offloaded arm has no such point)."""
    off = pd.DataFrame({k: offloaded[k] for k in KEY_COLUMNS})
    off["offloaded_tpot_penalty_ms"] = offloaded["tpot_penalty_ms"]
    off["offloaded_aggregate_interference_ms"] = offloaded["aggregate_interference_ms"]
    for name in ("kv_transfer_ms", "kv_bytes", "offload_prefill_ms"):
        off[name] = offloaded.get(name, np.nan)
    off["offloaded_ttft_ms"] = offloaded.get("offload_ttft_ms", np.nan)
    off["offloaded_decode_side_ms"] = offloaded["prefill_duration_ms"]
    off["offloaded_engine"] = offloaded["engine"]
    merged = colocated.merge(off, on=list(KEY_COLUMNS), how="left")
    merged["colocated_ttft_ms"] = colocated["prefill_duration_ms"].to_numpy()
    return merged[list(colocated.columns) + list(JOIN_COLUMNS)]


# ---------------------------------------------------------------------------------------------
# Fits


@dataclass(frozen=True)
class LinearFit:
    features: tuple[str, ...]
    coefficients: dict[str, float]
    r2: float | None
    n: int
    target: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"features": list(self.features), "coefficients": self.coefficients,
                "r2": None if self.r2 is None else round(self.r2, 4), "n": self.n, "target": self.target,
                "source": self.source}

    def __call__(self, d: int, p: int, b: int) -> float:
        return sum(self.coefficients[f] * feature(f, d, p, b) for f in self.features)


def fit_linear(frame: pd.DataFrame, target: str, features: Sequence[str], source: str,
               rows: pd.Series | None = None) -> LinearFit | None:
    """Least squares of `target` on `features` over the rows that have it; fewer features when
    the rows cannot carry them all (never fewer than the constant); None without rows."""
    if target not in frame:
        return None
    data = frame if rows is None else frame[rows]
    data = data[data[target].notna()]
    if not len(data):
        return None
    feats = list(features)
    while len(feats) > 1 and len(data) < len(feats) + 1:
        feats.pop()
    x = np.array([[feature(f, int(r.decode_batch_size), int(r.new_prefill_tokens), int(r.chunk_size)) for f in feats]
                  for r in data.itertuples()], dtype=np.float64)
    y = data[target].to_numpy(np.float64)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    pred = x @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else None
    return LinearFit(tuple(feats), {f: float(c) for f, c in zip(feats, coef)}, r2, len(data), target, source)


@dataclass(frozen=True)
class TransferModel:
    """kv_transfer_ms = fixed_ms + P x ms_per_token."""

    fixed_ms: float
    ms_per_token: float
    bytes_per_token: float | None
    source: str  # "measured" | "given"
    n: int = 0
    r2: float | None = None

    @property
    def bandwidth_gb_s(self) -> float | None:
        if self.bytes_per_token is None or self.ms_per_token <= 0:
            return None
        return self.bytes_per_token / (self.ms_per_token * 1e-3) / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "fixed_ms": round(self.fixed_ms, 4), "ms_per_token": self.ms_per_token,
                "bytes_per_token": self.bytes_per_token,
                "bandwidth_gb_s": None if self.bandwidth_gb_s is None else round(self.bandwidth_gb_s, 3),
                "n": self.n, "r2": None if self.r2 is None else round(self.r2, 4),
                "formula": "transfer_ms = fixed_ms + P x ms_per_token; bandwidth = bytes_per_token / ms_per_token"}

    def __call__(self, p: int) -> float:
        return transfer_time(self.to_dict(), p)


def fit_transfer(offloaded: pd.DataFrame) -> TransferModel | None:
    """The transfer model from the pair's measured transfers (kv_transfer_ms vs P), or None when
    none was measured (DecodeBench, or a connector without metrics)."""
    if "kv_transfer_ms" not in offloaded:
        return None
    rows = offloaded[offloaded["kv_transfer_ms"].notna()]
    if not len(rows):
        return None
    p = rows["new_prefill_tokens"].to_numpy(np.float64)
    y = rows["kv_transfer_ms"].to_numpy(np.float64)
    per_token = None
    if "kv_bytes" in rows and rows["kv_bytes"].notna().any():
        ok = rows["kv_bytes"].notna()
        per_token = float(np.median(rows.loc[ok, "kv_bytes"].to_numpy(np.float64) / p[ok.to_numpy()]))
    if len(set(p.tolist())) >= 2:
        slope, fixed = np.polyfit(p, y, 1)
        pred = fixed + slope * p
        ss = float(((y - y.mean()) ** 2).sum())
        r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else None
    else:  # one prompt length: no intercept to be had
        slope, fixed, r2 = float(np.mean(y / p)), 0.0, None
    return TransferModel(float(fixed), float(slope), per_token, "measured", len(rows), r2)


def given_transfer(link_gb_s: float, bytes_per_token: float, fixed_ms: float = 0.0) -> TransferModel:
    """A transfer model from a link bandwidth and the model's KV bytes per token (not measured)."""
    return TransferModel(fixed_ms, bytes_per_token / (link_gb_s * 1e9) * 1e3, bytes_per_token, "given")


def two_arm_section(colocated: pd.DataFrame, offloaded: pd.DataFrame, transfer: TransferModel | None,
                    *, source: str = "") -> dict[str, Any] | None:
    """decision.json's `two_arm` section (module docs); None when a needed model cannot be fitted."""
    col_d = colocated["decode_batch_size"] >= 1
    off_d = offloaded["decode_batch_size"] >= 1
    off_engines = sorted(str(e) for e in offloaded["engine"].dropna().unique())
    pair = "offload_prefill_ms" in offloaded and offloaded["offload_prefill_ms"].notna().any()
    cost = fit_linear(offloaded, "total_interference_ms", ("1", "d", "p"), "offloaded arm", off_d)
    col_ttft = fit_linear(colocated, "prefill_duration_ms", ("1", "p", "p2", "chunks", "d_chunks"), "colocated arm")
    if pair:
        prefill = fit_linear(offloaded, "offload_prefill_ms", ("1", "p", "p2"), "measured: the pair's prefill instance")
        decode = fit_linear(offloaded, "offload_decode_ms", ("1", "p", "d"),
                            "measured: the pair's decode instance (transfer, admission, first decode)")
    else:  # the prefill alone on its GPU: the colocated TTFT model at D = 0 (evaluate_decision passes D = 0)
        prefill = None if col_ttft is None else LinearFit(
            col_ttft.features, col_ttft.coefficients, col_ttft.r2, col_ttft.n, col_ttft.target,
            "the colocated TTFT model at D = 0: the prefill alone on its GPU")
        decode = fit_linear(offloaded, "prefill_duration_ms", ("1", "p", "d"),
                            "DecodeBench admission (free transfer; the transfer model is added)")
    if cost is None or col_ttft is None or prefill is None or decode is None:
        return None
    col_tpot = fit_linear(colocated, "tpot_interference_ms", ("1", "d", "chunk", "chunk_p"), "colocated arm", col_d)
    off_tpot = fit_linear(offloaded, "tpot_interference_ms", ("1", "d", "p"), "offloaded arm", off_d)
    return {
        "rule": "offload iff saved_ms > ttft_cost_ms, unless only one arm holds the SLOs given",
        "saved_ms": "D x (colocated per-stream interference (cost model) - offloaded_cost_per_stream)",
        "ttft_cost_ms": "offloaded_prefill(P) + [transfer(P)] + offloaded_decode(D, P) - colocated_ttft(D, P, B)",
        "offloaded_engines": off_engines,
        "offloaded_setup": "1P1D pair" if pair else "DecodeBenchConnector (one GPU, free transfer)",
        "decode_side_excludes_transfer": not pair,
        "offloaded_cost_per_stream": cost.to_dict(),
        "colocated_ttft": col_ttft.to_dict(),
        "offloaded_prefill": prefill.to_dict(),
        "offloaded_decode": decode.to_dict(),
        "colocated_tpot": col_tpot.to_dict() if col_tpot else None,
        "offloaded_tpot": off_tpot.to_dict() if off_tpot else None,
        "transfer": transfer.to_dict() if transfer else {"source": "seed-constant"},
        "source": source,
    }


# ---------------------------------------------------------------------------------------------
# For routers


def thresholds(doc: dict[str, Any], *, tpot_slo_ms: float | None = None, ttft_slo_ms: float | None = None,
               mode: str | None = None, p_max: int = 131072, step: int = 64) -> dict[str, Any]:
    """Per (B, D) of the document's range: the prefill length from which offloading wins."""
    rng = doc.get("valid_range") or {}
    chunk_sizes = sorted({int(b) for b in (rng.get("chunk_size") or [])}) or [8192]
    d_lo, d_hi = (rng.get("decode_batch_size") or [1, 1])
    per: dict[str, dict[str, int | None]] = {}
    for b in chunk_sizes:
        per[str(b)] = {str(d): offload_threshold(doc, d, b, tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms,
                                                 mode=mode, p_max=p_max, step=step)
                       for d in range(max(1, d_lo), d_hi + 1) if d < b}
    return {
        "schema": THRESHOLDS_SCHEMA,
        "meaning": "offload a prefill of at least this many (non-cached) tokens at that chunk size B and number of "
                   "running decodes D; null: offloading never wins up to p_max",
        "mode": mode or ("two-arm" if doc.get("two_arm") else "seed"),
        "tpot_slo_ms": tpot_slo_ms, "ttft_slo_ms": ttft_slo_ms, "p_max": p_max, "step_tokens": step,
        "min_prefill_tokens": per,
        "modelled": bool(doc.get("modelled")),
    }


def llmd_snippet(doc: dict[str, Any], b: int, d: int) -> str:
    """An llm-d EndpointPickerConfig fragment: the prefix-based PD decider with the threshold at
    (B, D). llm-d disaggregates when a prompt's non-cached suffix is longer than `nonCachedTokens`
    (llm-d-inference-scheduler docs/disaggregation.md), so it gets the threshold minus one."""
    per = doc["min_prefill_tokens"].get(str(b), {})
    threshold = per.get(str(d))
    others = ", ".join(f"D={k}: {v if v is not None else 'never'}" for k, v in per.items())
    if threshold is None:
        value, note = 2 ** 31 - 1, f"offloading never wins at B={b}, D={d} up to {doc['p_max']} tokens: never disaggregate"
    else:
        value, note = threshold - 1, f"offload prompts of >= {threshold} non-cached tokens at B={b}, D={d}"
    slos = ", ".join(f"{k} {doc[k]:g} ms" for k in ("tpot_slo_ms", "ttft_slo_ms") if doc.get(k) is not None)
    modelled = "# MODELLED: from the embedded engine, not from a GPU\n" if doc.get("modelled") else ""
    return (
        f"# pdexporter: {note} ({doc['mode']} verdict{', SLOs ' + slos if slos else ''}).\n"
        f"# Thresholds at B={b} for the other D: {others}\n"
        "# llm-d's decider takes one number: pick the D your decode pods usually run.\n"
        f"# Plugin and parameter: {LLMD_DOCS}\n{modelled}"
        "featureGates:\n- prepareDataPlugins\nplugins:\n"
        "- type: prefix-based-pd-decider\n  parameters:\n"
        f"    nonCachedTokens: {value}\n"
        "- type: disagg-profile-handler\n  parameters:\n    prefillProfile: prefill\n    decodeProfile: decode\n"
        "    prefillDeciderPluginName: prefix-based-pd-decider\n"
    )


# ---------------------------------------------------------------------------------------------
# Validation: one GPU's tables + transfer model -> the pair's saving, against the pair's records


def _at(table: pd.DataFrame, key: tuple[int, int, int], column: str) -> float | None:
    b, d, p = key
    row = table[(table["chunk_size"] == b) & (table["decode_batch_size"] == d) & (table["new_prefill_tokens"] == p)]
    if not len(row) or column not in row or pd.isna(row[column].iloc[0]):
        return None
    return float(row[column].iloc[0])


def predict_pair(colocated: pd.DataFrame, decode_bench: pd.DataFrame, pair: pd.DataFrame,
                 transfer: TransferModel | None, doc: dict[str, Any] | None = None) -> pd.DataFrame:
    """At every point of the pair's table: the saving and TTFT cost predicted from the colocated
    and DecodeBench tables (their measured point where they have it, else `doc`'s two-arm models
    fitted on them) plus the transfer model, beside what the pair measured, and the % errors."""
    rows = []
    for r in pair.itertuples():
        key = (int(r.chunk_size), int(r.decode_batch_size), int(r.new_prefill_tokens))
        b, d, p = key
        model = evaluate_decision(doc, d, p, b, mode="two-arm") if doc and doc.get("two_arm") else None

        def pick(table: pd.DataFrame, k: tuple[int, int, int], column: str, fallback: str,
                 model: dict[str, Any] | None = model) -> float | None:
            got = _at(table, k, column)
            return got if got is not None or model is None else float(model[fallback])

        col_cost = pick(colocated, key, "aggregate_interference_ms", "colocated_cost_ms")
        db_cost = pick(decode_bench, key, "aggregate_interference_ms", "offloaded_cost_ms")
        col_ttft = pick(colocated, key, "prefill_duration_ms", "colocated_ttft_ms")
        alone = _at(colocated, (b, 0, p), "prefill_duration_ms")
        if alone is None and model is not None:
            alone = float(model["offloaded_ttft_split_ms"]["prefill"])
        db_side = _at(decode_bench, key, "prefill_duration_ms")
        t_ms = transfer(p) if transfer is not None else None
        pred_saved = None if col_cost is None or db_cost is None else col_cost - db_cost
        pred_ttft = (None if None in (alone, t_ms, db_side, col_ttft)
                     else alone + t_ms + db_side - col_ttft)  # type: ignore[operator]
        meas_off = _at(pair, key, "aggregate_interference_ms")
        meas_col = _at(colocated, key, "aggregate_interference_ms")
        meas_saved = None if meas_off is None or meas_col is None else meas_col - meas_off
        meas_ttft_off = _at(pair, key, "offload_ttft_ms")
        meas_ttft = None if meas_ttft_off is None or col_ttft is None else meas_ttft_off - col_ttft
        rows.append({
            "chunk_size": b, "decode_batch_size": d, "new_prefill_tokens": p,
            "predicted_saved_ms": pred_saved, "measured_saved_ms": meas_saved,
            "saved_error_pct": _pct(pred_saved, meas_saved),
            "predicted_ttft_cost_ms": pred_ttft, "measured_ttft_cost_ms": meas_ttft,
            "ttft_cost_error_pct": _pct(pred_ttft, meas_ttft),
            "predicted_transfer_ms": t_ms, "measured_transfer_ms": _at(pair, key, "kv_transfer_ms"),
            "predicted_offloaded_cost_ms": db_cost, "measured_offloaded_cost_ms": meas_off,
        })
    return pd.DataFrame(rows)


def _pct(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured == 0 or not math.isfinite(measured):
        return None
    return round(100.0 * (predicted - measured) / abs(measured), 2)


def validation_summary(frame: pd.DataFrame, goal_pct: float = 15.0) -> dict[str, Any]:
    errors = frame["saved_error_pct"].dropna().abs()
    ttft = frame["ttft_cost_error_pct"].dropna().abs()
    return {
        "points": len(frame), "points_compared": len(errors),
        "saved_median_abs_error_pct": None if not len(errors) else round(float(errors.median()), 2),
        "saved_max_abs_error_pct": None if not len(errors) else round(float(errors.max()), 2),
        "saved_within_goal": int((errors <= goal_pct).sum()), "goal_pct": goal_pct,
        "ttft_cost_median_abs_error_pct": None if not len(ttft) else round(float(ttft.median()), 2),
    }


__all__ = [
    "JOIN_COLUMNS",
    "LLMD_DOCS",
    "LLMD_SNIPPET",
    "THRESHOLDS_JSON",
    "THRESHOLDS_SCHEMA",
    "LinearFit",
    "TransferModel",
    "fit_linear",
    "fit_transfer",
    "given_transfer",
    "join_arms",
    "llmd_snippet",
    "predict_pair",
    "thresholds",
    "two_arm_section",
    "validation_summary",
]
