"""Cost models of a prefill's interference, fitted with numpy; pure (data in, data out).

Both models predict the same quantity, the **aggregate interference cost** of one prefill:

    C(D, P, B) = D x total_interference_ms     [ms of decode time lost, summed over the batch]

(`total_interference_ms` is per decode stream, see `measure.window`). This is the seed's
`total_interference_cost`, the number the offload rule compares with a transfer time. Chunks are
n(P, B, D) = ceil(P / (B - D)) (ceil(P / B) at D = 0): running decodes take their tokens of the
step budget first. D = 0 costs nothing (no decode is delayed) and is left out of the fits.

Seed model ("seed_per_chunk")
    C = n(P, B, D) x D x pi(D, B)
    pi(D, B), the per-chunk TPOT penalty of one decode stream, is a lookup table fitted per
    (B, D) cell by least squares through the origin over the cell's prefills:
    pi = sum(n * T) / sum(n^2) with T = total_interference_ms. Between fitted D values of a chunk
    size it is interpolated linearly (clamped at the ends); an unfitted chunk size takes the
    nearest fitted one in log2 distance. A constant penalty per chunk cannot follow the growth of
    a chunk's cost with its position in a long prompt, which is why the second model exists.

Context-aware model ("context_aware")
    A mixed step k carries chunk c_k whose tokens start at prefix position p_k; its queries attend
    to the prefix and causally within the chunk, q_k = c_k * p_k + c_k * (c_k + 1) / 2
    (query x context pairs). The extra time it costs each decode stream over a decode-only step:

        pi_k = alpha0 + alpha1 * D + gamma * c_k + beta * q_k

    alpha0 + alpha1 * D: the fixed extra of a mixed step (weights and MoE experts a large chunk
    pulls in that D decode tokens alone would not; it shrinks as D grows); gamma: per prefill token
    through the weights; beta: per query-context pair of attention. Summed over the chunks,
    sum c_k = P and sum q_k = P (P + 1) / 2 whatever the chunking, so

        C = D x [ n (alpha0 + alpha1 D) + gamma P + beta P (P + 1) / 2 ]

    Chunk size enters only through n: smaller chunks pay the fixed extra more often. Fitted by
    ordinary least squares on (a) every mixed step of every repetition whose slow-step count
    equals n (y = step_time - baseline, x = [1, D, c_k, q_k]) and (b) for grid points without such
    steps, the mean chunk penalty T / n (x = [1, D, P / n, P (P + 1) / (2 n)]).

Held-out R^2: the models are refitted with folds of configurations left out and predict the left
out ones; R^2 = 1 - sum (C - C_hat)^2 / sum (C - mean C)^2 over all held-out predictions pooled.
The primary scheme leaves out one prefill length P at a time (all chunk sizes and D with that P);
a 5-fold split by configuration is reported too. The model with the higher primary held-out R^2
is chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import pandas as pd

from pdexporter._internal.text import plural
from pdexporter.analysis.table import ConfigSamples
from pdexporter.engines import adapter

__all__ = [
    "CONTEXT_IF_NEGATIVE", "CONTEXT_MEANINGS", "CONTEXT_MODEL", "CONTEXT_NAMES", "CONTEXT_UNITS", "Coefficient",
    "ContextAwareModel", "CostModel", "Design", "FITTERS", "FitData", "FitReport", "HUBER_K", "HeldOut", "KFOLD",
    "LEAVE_B_OUT", "LEAVE_D_OUT", "LEAVE_P_OUT", "ModelFit", "NO_HELD_OUT", "SCHEMES", "SEED_MODEL", "SeedModel",
    "attention_pairs", "chunk_schedule", "cross_validate", "fit_context_model", "fit_data", "fit_models",
    "fit_seed_model", "folds_for", "num_chunks", "r_squared",
]

SEED_MODEL = "seed_per_chunk"
CONTEXT_MODEL = "context_aware"
LEAVE_P_OUT = "leave-one-P-out"
LEAVE_B_OUT = "leave-one-chunk-size-out"  # generalisation to a chunk size nobody measured
LEAVE_D_OUT = "leave-one-D-out"  # ... and to a decode batch between (or beyond) the grid's
KFOLD = "5-fold-by-config"
SCHEMES = (LEAVE_P_OUT, LEAVE_B_OUT, LEAVE_D_OUT, KFOLD)


# ---------------------------------------------------------------------------------------------
# The chunk arithmetic shared by the fits, the synthetic records and the decision function


def num_chunks(p: Any, b: Any, d: Any, engine: str | None = None) -> np.ndarray:
    """The engine's chunk count for each (P, B, D) (vLLM: ceil(P / (B - D))), element-wise."""
    p, b, d = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (p, b, d)))
    rule = adapter(engine)
    counts = {key: len(rule.chunk_schedule(*key)) for key in set(zip(p.ravel().tolist(), b.ravel().tolist(),
                                                                    d.ravel().tolist()))}
    return np.asarray([counts[key] for key in zip(p.ravel().tolist(), b.ravel().tolist(), d.ravel().tolist())],
                      dtype=np.float64).reshape(p.shape)


def chunk_schedule(new_prefill_tokens: int, chunk_size: int, decode_batch_size: int) -> list[int]:
    """Chunk sizes in order (the engine adapter's rule: B - D tokens per step, the rest last)."""
    return list(adapter(None).chunk_schedule(new_prefill_tokens, chunk_size, decode_batch_size))


def attention_pairs(chunk: Any, prefix: Any) -> np.ndarray:
    """Query x context pairs of a chunk of `chunk` tokens starting at position `prefix`."""
    c = np.asarray(chunk, dtype=np.float64)
    return c * np.asarray(prefix, dtype=np.float64) + c * (c + 1) / 2


# ---------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class FitData:
    """Grid points with D >= 1 and a measured cost, plus their per-step observations."""

    chunk_size: np.ndarray
    decode: np.ndarray
    prefill: np.ndarray
    cost_ms: np.ndarray  # aggregate: D x total_interference_ms
    total_ms: np.ndarray  # per stream
    steps: tuple[tuple[tuple[float, tuple[float, ...]], ...], ...]  # per point: (baseline, slow step times) per rep
    design: Design | None = field(default=None, repr=False, compare=False)  # context-aware rows, if built

    def __len__(self) -> int:
        return int(self.decode.size)

    def with_design(self) -> FitData:
        """The same data with the context-aware fit's rows built once (cross-validation reuses them)."""
        return self if self.design is not None else replace(self, design=_design(self))

    def subset(self, index: np.ndarray) -> FitData:
        index = np.asarray(index, dtype=np.int64)
        return FitData(
            self.chunk_size[index], self.decode[index], self.prefill[index], self.cost_ms[index],
            self.total_ms[index], tuple(self.steps[i] for i in index),
            self.design.rows_of(index) if self.design is not None else None,
        )

    @property
    def chunks(self) -> np.ndarray:
        return num_chunks(self.prefill, self.chunk_size, self.decode)


def fit_data(table: pd.DataFrame, samples: Sequence[ConfigSamples] = ()) -> FitData:
    """The fit's view of the table: D >= 1, a cost present; steps from the samples by key."""
    steps_by_key = {s.key: tuple((c.baseline_ms, c.step_times_ms) for c in s.steps) for s in samples}
    rows = table[(table["decode_batch_size"] >= 1) & table["aggregate_interference_ms"].notna()
                 & table["total_interference_ms"].notna()]
    keys = list(zip(rows["chunk_size"], rows["decode_batch_size"], rows["new_prefill_tokens"]))
    return FitData(
        chunk_size=rows["chunk_size"].to_numpy(np.float64),
        decode=rows["decode_batch_size"].to_numpy(np.float64),
        prefill=rows["new_prefill_tokens"].to_numpy(np.float64),
        cost_ms=rows["aggregate_interference_ms"].to_numpy(np.float64),
        total_ms=rows["total_interference_ms"].to_numpy(np.float64),
        steps=tuple(steps_by_key.get((int(b), int(d), int(p)), ()) for b, d, p in keys),
    )


# ---------------------------------------------------------------------------------------------
# Models


@dataclass(frozen=True)
class Coefficient:
    name: str
    value: float
    stderr: float | None
    unit: str
    meaning: str
    if_negative: str = "the term would lower the cost"  # what a value below zero would claim

    @property
    def note(self) -> str | None:
        """A word on a negative value (a cost term is expected to be >= 0): within two standard
        errors of zero it is a fit artefact; beyond, say what it claims and that it is real in the data."""
        if not self.value < 0:
            return None
        if self.stderr is not None and abs(self.value) <= 2 * self.stderr:
            return f"negative: {self.if_negative} here, a fit artefact within its ± error"
        return (f"negative: {self.if_negative} in this data, beyond its ± error (an effect of the engine, or "
                "a model form that does not fit every point)")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "stderr": self.stderr, "unit": self.unit,
                "meaning": self.meaning}


class CostModel(Protocol):
    name: str
    formula: str

    def predict(self, d: Any, p: Any, b: Any) -> np.ndarray:
        """Aggregate interference cost in ms for each (D, P, B)."""
        ...

    def coefficients(self) -> list[Coefficient]: ...

    def to_dict(self) -> dict[str, Any]: ...


CONTEXT_NAMES = ("alpha0_ms", "alpha1_ms_per_decode", "gamma_ms_per_token", "beta_ms_per_token_pair",
                 "sigma0_ms", "sigma1_ms_per_token")
CONTEXT_UNITS = ("ms per mixed step", "ms per mixed step per decode stream", "ms per prefill token",
                 "ms per query-context token pair", "ms per prefill per decode stream",
                 "ms per prefill token per decode stream")
CONTEXT_MEANINGS = (
    "fixed extra cost of a step that carries a prefill chunk",
    "change of that fixed extra per running decode",
    "cost of one prefill token through the weights",
    "attention cost of one query token over one context token",
    "the engine's stalls around a prefill (admission, retirement) outside its chunk steps: fixed part",
    "those stalls' growth with the prompt (hashing its blocks, freeing its KV)",
)
CONTEXT_IF_NEGATIVE = (
    "a step carrying a prefill chunk would cost less than the decode step it replaces",
    "larger decode batches shorten the mixed step",
    "more prefill tokens would make a chunk cheaper",
    "a longer prefix would make attention cheaper",
    "the engine's loop would run faster around a prefill than without one",
    "longer prompts would stall the engine's loop less",
)


@dataclass(frozen=True)
class ContextAwareModel:
    alpha0_ms: float
    alpha1_ms_per_decode: float
    gamma_ms_per_token: float
    beta_ms_per_token_pair: float
    stderr: tuple[float | None, float | None, float | None, float | None] = (None, None, None, None)
    n_step_rows: int = 0
    n_point_rows: int = 0
    n_downweighted: int = 0  # rows the robust fit gave less than half a weight
    # The engine's admission/retirement stalls around a prefill, per decode stream (second stage,
    # fitted on what the chunk steps leave unexplained of each point's total interference).
    sigma0_ms: float = 0.0
    sigma1_ms_per_token: float = 0.0
    sigma_stderr: tuple[float | None, float | None] = (None, None)
    name: str = CONTEXT_MODEL
    formula: str = ("C = D * (n * (alpha0 + alpha1 * D) + gamma * P + beta * P * (P + 1) / 2 + sigma0 + sigma1 * P), "
                    "n = ceil(P / (B - D))")

    @property
    def values(self) -> tuple[float, float, float, float]:
        return (self.alpha0_ms, self.alpha1_ms_per_decode, self.gamma_ms_per_token, self.beta_ms_per_token_pair)

    def chunk_penalty_ms(self, d: Any, chunk: Any, prefix: Any) -> np.ndarray:
        a0, a1, g, be = self.values
        return a0 + a1 * np.asarray(d, np.float64) + g * np.asarray(chunk, np.float64) + be * attention_pairs(chunk, prefix)

    def per_stream_ms(self, d: Any, p: Any, b: Any) -> np.ndarray:
        a0, a1, g, be = self.values
        d, p = np.asarray(d, np.float64), np.asarray(p, np.float64)
        n = num_chunks(p, b, d)
        return n * (a0 + a1 * d) + g * p + be * p * (p + 1) / 2 + self.sigma0_ms + self.sigma1_ms_per_token * p

    def predict(self, d: Any, p: Any, b: Any) -> np.ndarray:
        return np.asarray(d, np.float64) * self.per_stream_ms(d, p, b)

    def coefficients(self) -> list[Coefficient]:
        values = (*self.values, self.sigma0_ms, self.sigma1_ms_per_token)
        errors = (*self.stderr, *self.sigma_stderr)
        return [Coefficient(n, float(v), None if s is None else float(s), u, m, w)
                for n, v, s, u, m, w in zip(CONTEXT_NAMES, values, errors, CONTEXT_UNITS, CONTEXT_MEANINGS,
                                            CONTEXT_IF_NEGATIVE)]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "formula": self.formula,
                "coefficients": {c.name: c.value for c in self.coefficients()}}


def _interp_clamped(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Linear interpolation through sorted (xs, ys); outside their range, the end value."""
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        return float(ys[-1])
    i = int(np.searchsorted(np.asarray(xs), x, side="right")) - 1
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class SeedModel:
    """pi(D, B) per fitted cell: {B: ((D, ...), (pi, ...), (stderr, ...))}, D ascending."""

    cells: Mapping[int, tuple[tuple[int, ...], tuple[float, ...], tuple[float | None, ...]]]
    name: str = SEED_MODEL
    formula: str = "C = n * D * pi(D, B), n = ceil(P / (B - D)); pi fitted per (B, D), interpolated in D"

    def penalty_per_chunk_ms(self, d: float, b: float) -> float:
        if not self.cells:
            return math.nan
        sizes = sorted(self.cells)
        if b in self.cells:
            chosen = int(b)
        else:
            # Nearest chunk size in log2 distance; on a tie the smaller one.
            chosen = min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(b)), s))
        ds, pis, _ = self.cells[chosen]
        return _interp_clamped(float(d), [float(x) for x in ds], pis)

    def predict(self, d: Any, p: Any, b: Any) -> np.ndarray:
        d, p, b = np.broadcast_arrays(np.asarray(d, np.float64), np.asarray(p, np.float64), np.asarray(b, np.float64))
        n = num_chunks(p, b, d)
        pi = np.array([self.penalty_per_chunk_ms(di, bi) for di, bi in zip(d.ravel(), b.ravel())]).reshape(d.shape)
        return n * d * pi

    def coefficients(self) -> list[Coefficient]:
        out = []
        for b in sorted(self.cells):
            ds, pis, ses = self.cells[b]
            for d, pi, se in zip(ds, pis, ses):
                out.append(Coefficient(f"pi[B={b},D={d}]", float(pi), se, "ms per chunk per decode stream",
                                       "TPOT penalty one chunk adds to one decode stream",
                                       "a prefill chunk would speed the decodes up"))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "formula": self.formula,
                "penalty_per_chunk_ms": {str(b): {"decode_batch_size": [int(x) for x in ds],
                                                   "penalty_ms": [float(x) for x in pis]}
                                         for b, (ds, pis, _) in sorted(self.cells.items())}}


# ---------------------------------------------------------------------------------------------
# Fitting


def fit_seed_model(data: FitData) -> SeedModel:
    cells: dict[int, dict[int, tuple[float, float | None]]] = {}
    n = data.chunks
    for b in np.unique(data.chunk_size):
        for d in np.unique(data.decode[data.chunk_size == b]):
            mask = (data.chunk_size == b) & (data.decode == d)
            x, y = n[mask], data.total_ms[mask]
            sxx = float(np.sum(x * x))
            pi = float(np.sum(x * y) / sxx)
            se = None
            if mask.sum() >= 2:
                rss = float(np.sum((y - pi * x) ** 2))
                se = math.sqrt(rss / (mask.sum() - 1) / sxx)
            cells.setdefault(int(b), {})[int(d)] = (pi, se)
    return SeedModel({b: (tuple(sorted(c)), tuple(c[d][0] for d in sorted(c)), tuple(c[d][1] for d in sorted(c)))
                      for b, c in cells.items()})


@dataclass(frozen=True)
class Design:
    """Rows of the context-aware fit. `point` says which grid point each row comes from (so
    cross-validation can drop a point's rows), `group` which repetition (rows of one repetition
    share its noise: standard errors are clustered on it)."""

    x: np.ndarray
    y: np.ndarray
    point: np.ndarray
    group: np.ndarray
    is_step: np.ndarray

    def rows_of(self, points: np.ndarray) -> Design:
        """The rows of these points, renumbered as in `FitData.subset(points)`."""
        points = np.asarray(points, dtype=np.int64)
        renumber = np.full(int(self.point.max(initial=-1)) + 1, -1, dtype=np.int64)
        renumber[points] = np.arange(points.size)
        keep = np.isin(self.point, points)
        return Design(self.x[keep], self.y[keep], renumber[self.point[keep]], self.group[keep], self.is_step[keep])


def _design(data: FitData) -> Design:
    """Per mixed step where a repetition's slow steps line up with the chunk schedule (one row per
    step), else one row per grid point with its mean chunk penalty."""
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    points: list[np.ndarray] = []
    groups: list[np.ndarray] = []
    steps: list[np.ndarray] = []
    cluster = 0
    n_all = data.chunks
    for i in range(len(data)):
        b, d, p, n = int(data.chunk_size[i]), int(data.decode[i]), int(data.prefill[i]), int(n_all[i])
        usable = [(base, times) for base, times in data.steps[i] if len(times) == n]
        if usable:
            chunks = np.asarray(chunk_schedule(p, b, d), np.float64)
            prefix = np.concatenate([[0.0], np.cumsum(chunks)[:-1]])
            block = np.column_stack([np.ones(n), np.full(n, float(d)), chunks, attention_pairs(chunks, prefix)])
            k = len(usable)
            xs.append(np.tile(block, (k, 1)))
            ys.append(np.concatenate([np.asarray(times, np.float64) - base for base, times in usable]))
            groups.append(np.repeat(np.arange(cluster, cluster + k), n))
            cluster += k
            points.append(np.full(n * k, i))
            steps.append(np.ones(n * k, dtype=bool))
        else:
            xs.append(np.array([[1.0, d, p / n, p * (p + 1) / (2 * n)]]))
            ys.append(np.array([data.total_ms[i] / n]))
            groups.append(np.array([cluster]))
            cluster += 1
            points.append(np.array([i]))
            steps.append(np.zeros(1, dtype=bool))
    if not xs:
        empty = np.empty(0, np.int64)
        return Design(np.empty((0, 4)), np.empty(0), empty, empty, np.empty(0, dtype=bool))
    return Design(np.vstack(xs), np.concatenate(ys), np.concatenate(points), np.concatenate(groups),
                  np.concatenate(steps))


def fit_context_model(data: FitData) -> ContextAwareModel:
    design = data.design if data.design is not None else _design(data)
    x, y, groups = design.x, design.y, design.group
    n_steps, n_points = int(design.is_step.sum()), int((~design.is_step).sum())
    if y.size == 0:
        raise ValueError("no grid point with D >= 1 and a measured cost to fit")
    active = [0, 1, 2, 3]
    if np.ptp(x[:, 1]) == 0:
        active.remove(1)  # one D value only: alpha1 cannot be told from alpha0
    xa = x[:, active]
    scale = np.abs(xa).max(axis=0)
    scale[scale == 0] = 1.0
    xs = xa / scale
    coef_scaled, weights, rank = _huber_irls(xs, y)
    coef = coef_scaled / scale
    stderr: list[float | None] = [None] * len(active)
    if rank == len(active) and y.size > len(active):
        raw = np.asarray(_clustered_stderr(xs, y - xs @ coef_scaled, groups, weights)) / scale
        stderr = [float(v) for v in raw]
    values = [0.0, 0.0, 0.0, 0.0]
    errors: list[float | None] = [None, None, None, None]
    for j, col in enumerate(active):
        values[col] = float(coef[j])
        errors[col] = stderr[j]
    downweighted = int(np.sum(weights < 0.5))
    stage1 = ContextAwareModel(*values, stderr=tuple(errors), n_step_rows=n_steps, n_point_rows=n_points,  # type: ignore[arg-type]
                               n_downweighted=downweighted)
    return _with_stalls(stage1, data) if n_steps else stage1


def _with_stalls(model: ContextAwareModel, data: FitData) -> ContextAwareModel:
    """Second stage: what the chunk steps leave unexplained of each point's per-stream total
    interference (the engine's admission and retirement stalls, seen on vLLM 0.22 as one to three
    slow steps beside the chunks) as sigma0 + sigma1 * P, Huber-fitted over the grid points."""
    residual = data.total_ms - model.per_stream_ms(data.decode, data.prefill, data.chunk_size)
    ok = np.isfinite(residual)
    if ok.sum() < 3 or np.ptp(data.prefill[ok]) == 0:
        return model
    x = np.column_stack([np.ones(int(ok.sum())), data.prefill[ok]])
    scale = np.abs(x).max(axis=0)
    coef_scaled, weights, rank = _huber_irls(x / scale, residual[ok])
    coef = coef_scaled / scale
    errors: tuple[float | None, float | None] = (None, None)
    if rank == 2 and ok.sum() > 2:
        raw = np.asarray(_clustered_stderr(x / scale, residual[ok] - (x / scale) @ coef_scaled,
                                           np.arange(int(ok.sum())), weights)) / scale
        errors = (float(raw[0]), float(raw[1]))
    return replace(model, sigma0_ms=float(coef[0]), sigma1_ms_per_token=float(coef[1]), sigma_stderr=errors)


HUBER_K = 1.345  # 95 % efficiency of least squares when the errors are normal


def _huber_irls(x: np.ndarray, y: np.ndarray, iterations: int = 50) -> tuple[np.ndarray, np.ndarray, int]:
    """Huber regression by iteratively reweighted least squares, from the OLS solution; the scale is
    re-estimated each round as 1.4826 x the median absolute residual. Rows the linear form cannot
    describe (e.g. a tiny last chunk that runs under CUDA graphs, a stray hiccup) then weigh
    k*s/|r| instead of 1 and cannot bend the coefficients of the rows that carry the cost."""
    coef, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    weights = np.ones_like(y)
    floor = 1e-9 * max(float(np.mean(np.abs(y))), 1e-12)
    for _ in range(iterations):
        residuals = y - x @ coef
        sigma = 1.4826 * float(np.median(np.abs(residuals - np.median(residuals))))
        k = HUBER_K * max(sigma, floor)
        new_weights = np.where(np.abs(residuals) <= k, 1.0, k / np.maximum(np.abs(residuals), 1e-300))
        root = np.sqrt(new_weights)
        new_coef, _, rank, _ = np.linalg.lstsq(x * root[:, None], y * root, rcond=None)
        converged = np.allclose(new_coef, coef, rtol=1e-10, atol=0.0)
        coef, weights = new_coef, new_weights
        if converged:
            break
    return coef, weights, int(rank)


def _clustered_stderr(x: np.ndarray, residuals: np.ndarray, groups: np.ndarray,
                      weights: np.ndarray | None = None) -> list[float]:
    """Cluster-robust (sandwich) standard errors of a (weighted) least-squares fit, with the usual
    small-sample factor."""
    w = np.ones_like(residuals) if weights is None else weights
    bread = np.linalg.inv(x.T @ (x * w[:, None]))
    labels, index = np.unique(groups, return_inverse=True)
    scores = np.zeros((labels.size, x.shape[1]))
    np.add.at(scores, index, x * (w * residuals)[:, None])
    meat = scores.T @ scores
    m, n, k = labels.size, x.shape[0], x.shape[1]
    factor = (m / max(m - 1, 1)) * ((n - 1) / max(n - k, 1))
    cov = factor * bread @ meat @ bread
    return [float(math.sqrt(max(v, 0.0))) for v in np.diag(cov)]


FITTERS: dict[str, Callable[[FitData], CostModel]] = {
    SEED_MODEL: fit_seed_model,
    CONTEXT_MODEL: fit_context_model,
}


# ---------------------------------------------------------------------------------------------
# Scores


def r_squared(y: np.ndarray, y_hat: np.ndarray) -> float | None:
    ok = np.isfinite(y) & np.isfinite(y_hat)
    y, y_hat = y[ok], y_hat[ok]
    if y.size < 2:
        return None
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if ss_tot == 0:
        return None
    return 1.0 - float(np.sum((y - y_hat) ** 2)) / ss_tot


@dataclass(frozen=True)
class HeldOut:
    scheme: str
    folds: int
    r2: float | None
    rmse_ms: float | None
    median_abs_rel_error: float | None
    predictions: np.ndarray = field(repr=False)
    mape: float | None = None  # mean |predicted - measured| / measured over the points predicted
    predicted: int = 0  # points a fold could predict (a model may not reach a held-out B or D)

    def to_dict(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "folds": self.folds, "r2": _round(self.r2),
                "rmse_ms": _round(self.rmse_ms), "median_abs_rel_error": _round(self.median_abs_rel_error),
                "mape": _round(self.mape), "points_predicted": self.predicted}


def folds_for(data: FitData, scheme: str, k: int = 5, seed: int = 0) -> list[np.ndarray]:
    """Index arrays of the held-out points of each fold."""
    if scheme == LEAVE_P_OUT:
        return [np.nonzero(data.prefill == p)[0] for p in np.unique(data.prefill)]
    if scheme == LEAVE_B_OUT:
        return [np.nonzero(data.chunk_size == b)[0] for b in np.unique(data.chunk_size)]
    if scheme == LEAVE_D_OUT:
        return [np.nonzero(data.decode == d)[0] for d in np.unique(data.decode)]
    if scheme == KFOLD:
        order = np.random.default_rng(seed).permutation(len(data))
        return [fold for fold in np.array_split(order, min(k, len(data))) if fold.size]
    raise ValueError(f"unknown cross-validation scheme {scheme!r}")


def cross_validate(fitter: Callable[[FitData], CostModel], data: FitData, scheme: str) -> HeldOut:
    predictions = np.full(len(data), np.nan)
    folds = folds_for(data, scheme)
    for held in folds:
        train = np.setdiff1d(np.arange(len(data)), held)
        if train.size == 0:
            continue
        try:
            model = fitter(data.subset(train))
        except (ValueError, np.linalg.LinAlgError):
            continue
        predictions[held] = model.predict(data.decode[held], data.prefill[held], data.chunk_size[held])
    return _scores(scheme, len(folds), data.cost_ms, predictions)


def _scores(scheme: str, folds: int, y: np.ndarray, y_hat: np.ndarray) -> HeldOut:
    ok = np.isfinite(y_hat)
    rmse = float(np.sqrt(np.mean((y[ok] - y_hat[ok]) ** 2))) if ok.any() else None
    rel = np.abs(y[ok] - y_hat[ok]) / np.where(y[ok] != 0, np.abs(y[ok]), np.nan)
    rel = rel[np.isfinite(rel)]
    return HeldOut(scheme, folds, r_squared(y, y_hat), rmse, float(np.median(rel)) if rel.size else None, y_hat,
                   float(np.mean(rel)) if rel.size else None, int(ok.sum()))


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


@dataclass(frozen=True)
class ModelFit:
    model: CostModel
    in_sample_r2: float | None
    held_out: dict[str, HeldOut]

    def to_dict(self) -> dict[str, Any]:
        out = self.model.to_dict()
        out["coefficients_detail"] = [c.to_dict() for c in self.model.coefficients()]
        out["in_sample_r2"] = _round(self.in_sample_r2)
        out["held_out"] = {k: v.to_dict() for k, v in self.held_out.items()}
        if isinstance(self.model, ContextAwareModel):
            out["rows"] = {"mixed_steps": self.model.n_step_rows, "grid_points": self.model.n_point_rows,
                           "downweighted": self.model.n_downweighted, "fit": "Huber IRLS, k = 1.345 x MAD scale"}
        return out


@dataclass(frozen=True)
class FitReport:
    fits: dict[str, ModelFit]
    chosen: str
    primary_scheme: str
    reason: str
    n_points: int
    target: str = "aggregate interference cost C = D x total_interference_ms (ms)"

    @property
    def best(self) -> ModelFit:
        return self.fits[self.chosen]

    def held_out_r2(self, name: str | None = None) -> float | None:
        return self.fits[name or self.chosen].held_out[self.primary_scheme].r2

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "n_points": self.n_points, "primary_scheme": self.primary_scheme,
                "chosen": self.chosen, "reason": self.reason,
                "models": {k: v.to_dict() for k, v in self.fits.items()}}


NO_HELD_OUT = "not enough points for a held-out fit"


def fit_models(data: FitData) -> FitReport:
    """Fit both models on everything, score them held out, choose the better one."""
    if len(data) == 0:
        raise ValueError("no grid point with D >= 1 and a measured cost to fit")
    data = data.with_design()
    primary = LEAVE_P_OUT if np.unique(data.prefill).size >= 3 else KFOLD
    fits: dict[str, ModelFit] = {}
    for name, fitter in FITTERS.items():
        model = fitter(data)
        in_sample = r_squared(data.cost_ms, model.predict(data.decode, data.prefill, data.chunk_size))
        held = {scheme: cross_validate(fitter, data, scheme) for scheme in SCHEMES
                if scheme == KFOLD or len(folds_for(data, scheme)) >= 2}
        fits[name] = ModelFit(model, in_sample, held)
    scores = {name: fit.held_out[primary].r2 for name, fit in fits.items()}
    chosen = max(scores, key=lambda k: -math.inf if scores[k] is None else scores[k])  # type: ignore[arg-type]
    other = next(k for k in scores if k != chosen)
    if scores[chosen] is None:
        reason = (f"{NO_HELD_OUT} ({plural(len(data), 'grid point')} with D >= 1, "
                  f"{plural(int(np.unique(data.prefill).size), 'prompt length')}): {chosen} taken without a comparison")
    elif scores[other] is None:
        reason = f"{chosen} has a held-out R^2 ({_fmt(scores[chosen])}, {primary}); {other} could not be scored"
    else:
        reason = (f"{chosen} has the higher held-out R^2 ({_fmt(scores[chosen])} vs {_fmt(scores[other])} "
                  f"for {other}, {primary})")
    return FitReport(fits, chosen, primary, reason, len(data))


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
