"""Both arms of the offload decision: the colocated table joined with the offloaded one, the
measured KV transfer, the physical terms the two-arm verdict evaluates (with their ranges,
held-out R^2 and bootstrap replicates), the thresholds a P/D router takes, and the check of a
prediction from one GPU against a measured pair. Pure: samples in, tables and dicts out
(docs/disaggregation.md).

The offloaded arm comes from records of a P/D pair's decode instance (`config.arm` =
"offloaded"): DecodeBenchConnector on one GPU (a free transfer, no prefill instance) or a real
1P1D pair (NixlConnector; the routed request's TTFT split and the connector-measured transfer).

Terms (`TERM_FEATURES`; evaluated by `decision_eval`, which says what each means physically):
each is fitted by non-negative least squares (Huber-weighted) on the repetitions themselves, over
features that cannot be negative, so no term can give a negative time and each grows with what
it should grow with. Each carries its range, its leave-one-P-out R^2 and 200 bootstrap replicates
(grid points resampled with replacement). The KV transfer is latency + bytes / bandwidth, fitted
on the windows of its nominal regime; windows that took more than 4x that model (a 1P1D pair on
two H200s had a ~70 s stretch at ~4 GB/s where the rest ran at 50-280 GB/s) are its degraded
regime, reported with their share and the stall they put on the decode instance, and left out of
the nominal terms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from pdexporter.analysis.decision_eval import (
    TWO_ARM_RULE,
    chunk_context,
    evaluate_decision,
    transfer_time,
)
from pdexporter.analysis.table import KEY_COLUMNS, ConfigSamples
from pdexporter.analysis.thresholds import (
    LLMD_DOCS,
    LLMD_SNIPPET,
    THRESHOLDS_JSON,
    THRESHOLDS_SCHEMA,
    UNDECIDED_RATIO,
    compute_thresholds,
    llmd_snippet,
)

JOIN_COLUMNS = (
    "offloaded_tpot_penalty_ms", "offloaded_aggregate_interference_ms", "kv_transfer_ms", "kv_bytes",
    "offloaded_ttft_ms", "offload_prefill_ms", "offloaded_decode_side_ms", "colocated_ttft_ms", "offloaded_engine",
)


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
# Terms: non-negative least squares on physical features, per repetition, with their ranges,
# held-out R^2 and bootstrap replicates


# term -> (features (decision_eval.chunk_context), what it is)
TERM_FEATURES: dict[str, tuple[tuple[str, ...], str]] = {
    "colocated_ttft": (("1", "p", "q", "eager_chunks", "chunks", "d_chunks", "graph_p"),
                       ("the colocated prefill's TTFT: overheads + its chunk steps (eager launches, tokens, attention, "
                        "the decodes riding in each step)")),
    "prefill_offset": (("1", "p"), ("the pair's prefill instance over the prefill alone (the colocated TTFT at D = 0): "
                                    "the producer's own work (registering and keeping the KV for the reader)")),
    "decode_side": (("1", "d", "p"), ("the decode side of an offloaded request, the KV transfer left out: the router's "
                                      "hop, admission and first step on the decode instance")),
    "offloaded_loss": (("1", "d", "p"), ("per decode stream, what admitting the offloaded request stalls the running "
                                         "decodes on the decode instance")),
    "offloaded_tpot": (("1", "d", "p"), "the decodes' TPOT on the decode instance while the request is admitted"),
}
HELD_OUT = "leave-one-P-out"
TERM_REPLICATES = 200


@dataclass(frozen=True)
class Rows:
    """Per-repetition observations of one term: features, target, the grid point each came from."""

    x: np.ndarray
    y: np.ndarray
    key: list[tuple[int, int, int]]  # (B, D, P) of each row

    def __len__(self) -> int:
        return int(self.y.size)


def _features(names: Sequence[str], rule: dict[str, Any], d: int, p: int, b: int) -> list[float]:
    f = chunk_context({"chunk_rule": rule}, d, p, b)["f"]
    return [f[n] for n in names]


def _rows(samples: Sequence[ConfigSamples], names: Sequence[str], rule: dict[str, Any],
          target: Callable[[Mapping[str, Any]], float | None], *, at_d: int | None = None,
          keep: Callable[[ConfigSamples, Mapping[str, Any]], bool] | None = None) -> Rows:
    xs, ys, keys = [], [], []
    for s in samples:
        b, d, p = s.key
        for rep in s.reps:
            if keep is not None and not keep(s, rep):
                continue
            value = target(rep)
            if value is None or not math.isfinite(value):
                continue
            xs.append(_features(names, rule, d if at_d is None else at_d, p, b))
            ys.append(float(value))
            keys.append(s.key)
    return Rows(np.asarray(xs, np.float64).reshape(-1, len(names)), np.asarray(ys, np.float64), keys)


RELATIVE_FLOOR_MS = 1.0  # a relative fit's rows: a value below this weighs as this


def _nnls_fit(rows: Rows, weights: np.ndarray | None = None, relative: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative Huber fit of a term (coefficients, the weights used); with `weights`, one
    weighted NNLS; `relative`: Huber on relative residuals (each row divided by its value, at least
    RELATIVE_FLOOR_MS). Constant columns beyond the first, and empty ones, get 0."""
    from pdexporter.analysis.models import huber_nnls, nnls

    scale = np.abs(rows.x).max(axis=0)
    active = scale > 0
    scale[~active] = 1.0
    xs = rows.x[:, active] / scale[active]
    if weights is None and relative:
        rel = 1.0 / np.maximum(np.abs(rows.y), RELATIVE_FLOOR_MS)
        coef_scaled, robust = huber_nnls(xs * rel[:, None], rows.y * rel)
        weights = robust * rel * rel
    elif weights is None:
        coef_scaled, weights = huber_nnls(xs, rows.y)
    else:
        root = np.sqrt(weights)
        coef_scaled = nnls(xs * root[:, None], rows.y * root)
    coef = np.zeros(rows.x.shape[1])
    coef[active] = coef_scaled / scale[active]
    return coef, weights


def _r2(y: np.ndarray, y_hat: np.ndarray) -> float | None:
    ok = np.isfinite(y) & np.isfinite(y_hat)
    if ok.sum() < 2:
        return None
    ss = float(np.sum((y[ok] - y[ok].mean()) ** 2))
    return None if ss == 0 else 1.0 - float(np.sum((y[ok] - y_hat[ok]) ** 2)) / ss


def _held_out_r2(rows: Rows, relative: bool = False) -> float | None:
    """Leave one prompt length out: refit without it, predict its points' means; R^2 pooled over
    the grid points (None with fewer than three prompt lengths)."""
    p_of = np.array([k[2] for k in rows.key])
    if np.unique(p_of).size < 3:
        return None
    predicted = np.full(len(rows), np.nan)
    for p in np.unique(p_of):
        train = p_of != p
        coef, _ = _nnls_fit(Rows(rows.x[train], rows.y[train], [k for k, t in zip(rows.key, train) if t]),
                            relative=relative)
        predicted[~train] = rows.x[~train] @ coef
    means, preds = [], []
    for key in sorted(set(rows.key)):
        m = np.array([k == key for k in rows.key])
        means.append(float(rows.y[m].mean()))
        preds.append(float(predicted[m].mean()))
    return _r2(np.asarray(means), np.asarray(preds))


def _range(keys: Sequence[tuple[int, int, int]]) -> dict[str, Any]:
    bs = sorted({k[0] for k in keys})
    ds = [k[1] for k in keys]
    ps = [k[2] for k in keys]
    return {"decode_batch_size": [min(ds), max(ds)], "new_prefill_tokens": [min(ps), max(ps)], "chunk_sizes": bs}


@dataclass(frozen=True)
class Term:
    name: str
    features: tuple[str, ...]
    coefficients: np.ndarray
    rows: Rows
    weights: np.ndarray
    source: str
    held_out_r2: float | None
    relative: bool = False  # fitted on relative residuals (`RELATIVE_TERMS`)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "coefficients": {f: float(c) for f, c in zip(self.features, self.coefficients)},
            "range": _range(self.rows.key),
            "n": len(self.rows),
            "points": len(set(self.rows.key)),
            "held_out_r2": None if self.held_out_r2 is None else round(self.held_out_r2, 4),
            "held_out": HELD_OUT,
            "source": self.source,
            "meaning": TERM_FEATURES[self.name][1],
            "fit": "non-negative least squares, Huber-weighted, per repetition"
                   + (", on relative residuals" if self.relative else ""),
        }

    def replicate(self, drawn_keys: Sequence[tuple[int, int, int]]) -> dict[str, float]:
        """The term refitted on the rows of a resample of its grid points (full-fit Huber weights)."""
        by_key = self._by_key()
        index = [i for key in drawn_keys for i in by_key.get(key, ())]
        if not index:
            return {f: float(c) for f, c in zip(self.features, self.coefficients)}
        ix = np.asarray(index)
        coef, _ = _nnls_fit(Rows(self.rows.x[ix], self.rows.y[ix], [self.rows.key[i] for i in ix]), self.weights[ix])
        return {f: float(c) for f, c in zip(self.features, coef)}

    def _by_key(self) -> dict[tuple[int, int, int], list[int]]:
        cached = self.__dict__.get("_by_key_cache")
        if cached is None:
            cached = {}
            for i, key in enumerate(self.rows.key):
                cached.setdefault(key, []).append(i)
            object.__setattr__(self, "_by_key_cache", cached)
        return cached


# Terms fitted on relative residuals: the offloaded decodes' loss is 4-6 ms per decode for most
# prompts and ~20 ms at 32K, and in absolute terms the longest prompts set it (as the colocated
# stall, models._stall_fit). Weighted so, its error on H200 campaigns it never saw fell from 22.2,
# 19.5 and 20.0 % MAPE (s3, s5 left out; the validation campaign s6) to 17.2, 19.2 and 16.3 %
# (docs/analysis.md, "Held-out campaigns").
RELATIVE_TERMS = frozenset({"offloaded_loss"})


def fit_term(name: str, rows: Rows, source: str) -> Term | None:
    if len(rows) == 0:
        return None
    relative = name in RELATIVE_TERMS
    coef, weights = _nnls_fit(rows, relative=relative)
    return Term(name, TERM_FEATURES[name][0], coef, rows, weights, source, _held_out_r2(rows, relative), relative)


# ---------------------------------------------------------------------------------------------
# The KV transfer: latency + bytes / bandwidth, its nominal regime and the slow episodes


@dataclass(frozen=True)
class TransferModel:
    """kv_transfer_ms = latency_ms + P x bytes_per_token / bandwidth (nominal regime), and, where
    some windows ran far slower (`degraded`), that regime's bandwidth, its share of the windows and
    how much of its duration the decode instance's running decodes stalled."""

    latency_ms: float
    gb_per_s: float
    bytes_per_token: float
    source: str  # "measured" | "given"
    n: int = 0
    r2: float | None = None
    degraded: dict[str, Any] | None = None  # figures, and a "meaning" line
    p_range: tuple[int, int] | None = None
    chunk_sizes: tuple[int, ...] = ()

    @property
    def bandwidth_gb_s(self) -> float:
        return self.gb_per_s

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source, "latency_ms": round(self.latency_ms, 4), "gb_per_s": round(self.gb_per_s, 3),
            "bytes_per_token": self.bytes_per_token, "n": self.n, "r2": None if self.r2 is None else round(self.r2, 4),
            "formula": "transfer_ms = latency_ms + P x bytes_per_token / (gb_per_s x 1e9) x 1e3",
            "degraded": self.degraded,
        }
        if self.p_range:
            out["range"] = {"new_prefill_tokens": list(self.p_range), "chunk_sizes": list(self.chunk_sizes)}
        return out

    def __call__(self, p: int) -> float:
        return transfer_time(self.to_dict(), p)

    def describe(self) -> str:
        """One line: the nominal model, and the degraded regime where there was one."""
        text = (f"{self.source}: {self.latency_ms:.1f} ms + P x {self.bytes_per_token / 1024:.0f} KiB at "
                f"{self.gb_per_s:.0f} GB/s" + (f" ({self.n} windows)" if self.n else ""))
        if self.degraded:
            text += (f"; {self.degraded['windows']} windows ({self.degraded['share_of_windows']:.0%}) ran degraded "
                     f"at {self.degraded['gb_per_s']:.1f} GB/s, the decode instance's decodes stalled for "
                     f"{self.degraded['stall_share']:.0%} of it")
        return text

    def replicate(self, drawn: np.ndarray, bytes_: np.ndarray, times: np.ndarray) -> dict[str, float]:
        lat, bw = _transfer_fit(bytes_[drawn], times[drawn])
        return {"latency_ms": lat, "gb_per_s": bw}


DEGRADED_FACTOR = 4.0  # a window whose transfer took this many times the nominal model's is degraded


def _transfer_fit(bytes_: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """(latency ms, GB/s) of time = latency + bytes / bandwidth, both >= 0, Huber-weighted."""
    from pdexporter.analysis.models import huber_nnls

    x = np.column_stack([np.ones(bytes_.size), bytes_ / 1e9])  # ms per GB
    scale = np.abs(x).max(axis=0)
    coef, _ = huber_nnls(x / scale, times)
    latency, ms_per_gb = coef / scale
    return float(latency), float(1e3 / ms_per_gb) if ms_per_gb > 0 else math.inf


def transfer_observations(offloaded: Sequence[ConfigSamples]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """Per repetition with a measured transfer: (bytes, ms, per-stream decodes' loss, grid keys)."""
    b_, t_, loss, keys = [], [], [], []
    for s in offloaded:
        for rep in s.reps:
            t, by = rep.get("kv_transfer_ms"), rep.get("kv_bytes")
            if t is None or by is None or not (t > 0 and by > 0):
                continue
            b_.append(float(by))
            t_.append(float(t))
            total = rep.get("total_interference_ms")
            loss.append(float(total) if total is not None else math.nan)
            keys.append(s.key)
    return np.asarray(b_), np.asarray(t_), np.asarray(loss), keys


def fit_transfer(offloaded: Sequence[ConfigSamples] | pd.DataFrame) -> TransferModel | None:
    """The transfer model from the pair's measured transfers (kv_transfer_ms and kv_bytes per
    window): a first fit on each prompt size's fast windows (within 1.5x of its fastest: a slow
    stretch can hold most of a run's windows, so a fit over all of them would be the stretch's),
    then every window slower than DEGRADED_FACTOR x that model is set apart as the degraded regime
    and the nominal one is refitted on the rest. None when no transfer was measured (DecodeBench,
    or a connector without metrics)."""
    if isinstance(offloaded, pd.DataFrame):
        return None  # tables carry medians only; the regimes need the windows (analysis.job passes samples)
    bytes_, times, loss, keys = transfer_observations(offloaded)
    if bytes_.size == 0:
        return None
    per_token = float(np.median(bytes_ / np.array([k[2] for k in keys], np.float64)))
    if np.unique(bytes_).size < 2:
        lat, bw = 0.0, float(np.median(bytes_ / times / 1e6))
        slow = np.zeros(bytes_.size, dtype=bool)
    else:
        fastest = {b: times[bytes_ == b].min() for b in np.unique(bytes_)}
        fast = np.array([t <= 1.5 * fastest[b] for b, t in zip(bytes_, times)])
        lat, bw = _transfer_fit(bytes_[fast], times[fast]) if np.unique(bytes_[fast]).size >= 2 \
            else _transfer_fit(bytes_, times)
        predicted = lat + bytes_ / (bw * 1e9) * 1e3
        slow = times > DEGRADED_FACTOR * predicted
        if slow.any() and (~slow).sum() >= 3 and np.unique(bytes_[~slow]).size >= 2:
            lat, bw = _transfer_fit(bytes_[~slow], times[~slow])
    predicted = lat + bytes_ / (bw * 1e9) * 1e3
    degraded: dict[str, Any] | None = None
    if slow.any():
        share = loss[slow] / times[slow]
        degraded = {"gb_per_s": round(float(np.median(bytes_[slow] / times[slow] / 1e6)), 3),
                    "share_of_windows": round(float(slow.mean()), 4), "windows": int(slow.sum()),
                    "stall_share": round(float(np.nanmedian(share)) if np.isfinite(share).any() else 0.0, 4),
                    "meaning": "windows whose transfer took more than 4x the nominal model: their bandwidth, how "
                               "many, and the share of the transfer's duration the decode instance's running "
                               "decodes stalled for"}
    ok = ~slow
    r2 = _r2(times[ok], predicted[ok]) if ok.sum() >= 2 else None
    ps = [k[2] for k in keys]
    return TransferModel(lat, bw, per_token, "measured", int(ok.sum()), r2, degraded, (min(ps), max(ps)),
                         tuple(sorted({k[0] for k in keys})))


def slow_windows(
    offloaded: Sequence[ConfigSamples], model: TransferModel | None
) -> set[tuple[tuple[int, int, int], int]]:
    """(grid key, repetition index) of the windows in the degraded regime (excluded from the nominal terms)."""
    out: set[tuple[tuple[int, int, int], int]] = set()
    if model is None or model.degraded is None:
        return out
    for s in offloaded:
        for i, rep in enumerate(s.reps):
            t, by = rep.get("kv_transfer_ms"), rep.get("kv_bytes")
            if t and by and t > DEGRADED_FACTOR * (model.latency_ms + by / (model.gb_per_s * 1e9) * 1e3):
                out.add((s.key, i))
    return out


def given_transfer(link_gb_s: float, bytes_per_token: float, latency_ms: float = 0.0) -> TransferModel:
    """A transfer model from a link bandwidth and the model's KV bytes per token (not measured)."""
    return TransferModel(latency_ms, link_gb_s, bytes_per_token, "given")


# ---------------------------------------------------------------------------------------------
# decision.json's two-arm section


def _pair_terms(offloaded: Sequence[ConfigSamples], col_ttft: Term | None, rule: dict[str, Any],
                nominal: Callable[[ConfigSamples, Mapping[str, Any]], bool]) -> dict[str, Term | None]:
    """A 1P1D pair's own terms: the decode side (routed TTFT less the prefill instance and the KV
    transfer) and, given the colocated TTFT, the prefill instance's offset over it at D = 0."""
    def decode_side(r: Mapping[str, Any]) -> float | None:
        ttft, pre, xfer = r.get("offload_ttft_ms"), r.get("offload_prefill_ms"), r.get("kv_transfer_ms")
        if ttft is None or pre is None:
            return None
        return float(ttft) - float(pre) - float(xfer or 0.0)

    terms: dict[str, Term | None] = {
        "decode_side": fit_term("decode_side", _rows(offloaded, TERM_FEATURES["decode_side"][0], rule,
                                                     decode_side, keep=nominal),
                                "measured on the pair: routed TTFT - prefill instance - KV transfer"),
    }
    if col_ttft is None:
        return terms
    alone = {f: c for f, c in zip(col_ttft.features, col_ttft.coefficients)}
    rows_x, rows_y, rows_k = [], [], []
    for s in offloaded:
        b, _, p = s.key
        base = sum(alone[f] * v for f, v in zip(col_ttft.features, _features(col_ttft.features, rule, 0, p, b)))
        for rep in s.reps:
            pre = rep.get("offload_prefill_ms")
            if pre is not None:
                rows_x.append(_features(TERM_FEATURES["prefill_offset"][0], rule, 0, p, b))
                rows_y.append(float(pre) - base)
                rows_k.append(s.key)
    terms["prefill_offset"] = fit_term(
        "prefill_offset",
        Rows(np.asarray(rows_x).reshape(-1, 2), np.asarray(rows_y), rows_k),
        "measured on the pair's prefill instance, over the colocated TTFT at D = 0",
    )
    return terms


def two_arm_section(colocated: Sequence[ConfigSamples], offloaded: Sequence[ConfigSamples],
                    transfer: TransferModel | None, doc: dict[str, Any], *, source: str = "",
                    replicates: int = TERM_REPLICATES) -> dict[str, Any] | None:
    """decision.json's `two_arm` section (decision_eval's module docs) and its replicates (set on
    `doc["replicates"]["two_arm"]`, one per replicate of the colocated model); None when a needed
    term has no data."""
    rule = doc.get("chunk_rule") or {}
    pair = any(rep.get("offload_prefill_ms") is not None for s in offloaded for rep in s.reps)
    slow = slow_windows(offloaded, transfer)
    col = [s for s in colocated if s.arm == "colocated"]
    off_d = [s for s in offloaded if s.decode_batch_size >= 1]

    def nominal(s: ConfigSamples, rep: Mapping[str, Any]) -> bool:
        return (s.key, list(s.reps).index(rep)) not in slow

    terms: dict[str, Term | None] = {
        "colocated_ttft": fit_term("colocated_ttft", _rows(col, TERM_FEATURES["colocated_ttft"][0], rule,
                                                           lambda r: r.get("prefill_duration_ms")), "colocated arm"),
        "offloaded_loss": fit_term("offloaded_loss", _rows(off_d, TERM_FEATURES["offloaded_loss"][0], rule,
                                                           lambda r: r.get("total_interference_ms"), keep=nominal),
                                   "offloaded arm (nominal transfers)" if slow else "offloaded arm"),
        "offloaded_tpot": fit_term("offloaded_tpot", _rows(off_d, TERM_FEATURES["offloaded_tpot"][0], rule,
                                                           lambda r: r.get("tpot_interference_ms"), keep=nominal),
                                   "offloaded arm"),
    }
    if pair:
        terms.update(_pair_terms(offloaded, terms["colocated_ttft"], rule, nominal))
    else:
        terms["decode_side"] = fit_term("decode_side", _rows(offloaded, TERM_FEATURES["decode_side"][0], rule,
                                                             lambda r: r.get("prefill_duration_ms")),
                                        "DecodeBench: submission to first token (a free transfer)")
    if terms["colocated_ttft"] is None or terms["decode_side"] is None or terms["offloaded_loss"] is None:
        return None
    present = {name: t for name, t in terms.items() if t is not None}
    transfer_doc = transfer.to_dict() if transfer else {"source": "seed-constant"}
    section = {
        "version": 2,
        "rule": TWO_ARM_RULE,
        "saved_ms": "colocated decodes' loss (the colocated cost model) - D x offloaded_loss",
        "ttft_cost_ms": "colocated_ttft(D=0) + prefill_offset + transfer + decode_side - colocated_ttft",
        "offloaded_engines": sorted({s.engine for s in offloaded}),
        "offloaded_setup": "1P1D pair" if pair else "DecodeBenchConnector (one GPU, free transfer)",
        "measured_chunk_sizes": sorted({s.chunk_size for s in offloaded} & {s.chunk_size for s in col}),
        "terms": {**{name: t.to_dict() for name, t in present.items()}, "transfer": transfer_doc},
        "source": source,
    }
    n = len((doc.get("replicates") or {}).get("model") or []) or replicates
    rng = np.random.default_rng(1)
    bytes_, times, _, _ = transfer_observations(offloaded)
    nominal_t = np.array([(k, i) not in slow for k, i in _rep_index(offloaded)], dtype=bool) if bytes_.size else None
    reps_out = []
    for _ in range(n):
        one: dict[str, Any] = {}
        for name, t in present.items():
            keys = sorted(set(t.rows.key))
            drawn = [keys[i] for i in rng.integers(0, len(keys), len(keys))]
            one[name] = t.replicate(drawn)
        if transfer is not None and transfer.source == "measured" and nominal_t is not None and nominal_t.sum() >= 3:
            idx = np.nonzero(nominal_t)[0]
            drawn_t = rng.choice(idx, idx.size)
            if np.unique(bytes_[drawn_t]).size >= 2:
                one["transfer"] = transfer.replicate(drawn_t, bytes_, times)
        reps_out.append(one)
    doc.setdefault("replicates", {})["two_arm"] = reps_out
    return section


def _rep_index(offloaded: Sequence[ConfigSamples]) -> list[tuple[tuple[int, int, int], int]]:
    """(key, rep index) in transfer_observations' order."""
    out = []
    for s in offloaded:
        for i, rep in enumerate(s.reps):
            t, by = rep.get("kv_transfer_ms"), rep.get("kv_bytes")
            if t is None or by is None or not (t > 0 and by > 0):
                continue
            out.append((s.key, i))
    return out


# ---------------------------------------------------------------------------------------------
# For routers: one computation (`analysis.thresholds`), re-exported here for the callers that know it


def thresholds(doc: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """offload_thresholds.json of `analysis.thresholds.compute_thresholds(doc, **kw)`."""
    return compute_thresholds(doc, **kw).to_dict()


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
    r: Any  # pandas-stubs types a row's fields as the union of every scalar; these columns are numbers
    for r in pair.itertuples():
        key = (int(r.chunk_size), int(r.decode_batch_size), int(r.new_prefill_tokens))
        b, d, p = key
        model = evaluate_decision(doc, d, p, b, mode="two-arm") if doc and doc.get("two_arm") else None

        def pick(table: pd.DataFrame, k: tuple[int, int, int], column: str, fallback: str,
                 model: Mapping[str, Any] | None = model) -> float | None:
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
    "DEGRADED_FACTOR", "HELD_OUT", "JOIN_COLUMNS", "LLMD_DOCS", "LLMD_SNIPPET", "TERM_FEATURES", "TERM_REPLICATES",
    "THRESHOLDS_JSON", "THRESHOLDS_SCHEMA", "UNDECIDED_RATIO", "Rows", "Term", "TransferModel", "fit_term",
    "fit_transfer", "given_transfer", "join_arms", "llmd_snippet", "predict_pair", "slow_windows", "thresholds",
    "transfer_observations", "two_arm_section", "validation_summary",
]
