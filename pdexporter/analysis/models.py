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
    (query x context pairs). The extra time it costs each decode stream over a decode-only step
    depends on how the engine runs the step (its adapter's `ChunkRule.graph_step`):

        launched eagerly (more tokens than the engine's largest CUDA graph):
            pi_k = max(0, alpha0 + alpha1 * D) + gamma * c_k + beta * q_k
        replayed as a CUDA graph (a small chunk, e.g. <= 512 tokens with the decodes on vLLM 0.22):
            pi_k = kappa * c_k  (+ graph0 in the step that admits the request: its first chunk)

    alpha0 + alpha1 * D: the fixed extra of an eager step (its kernel launches, weights and MoE
    experts a large chunk pulls in that D decode tokens alone would not; it shrinks as D grows);
    gamma: per prefill token through the weights; beta: per query-context pair of attention;
    kappa c (+ graph0): a graph step has no eager launches, but the one that admits a request is
    not the decode-only graph either: on the H200 a 64- to 384-token prompt cost each decode 8-14 ms
    in its one step whatever its length, where kappa c alone said 5-15 ms, while a graph tail after
    eager chunks costs 2-4 ms. graph0 is paid once, by the admitting step. Summed over the chunks,

        C = D x [ sum_k pi_k + sigma0 + sigma1 P ]

    (sigma: the engine's stalls around the prefill, below). Chunk size enters through the chunks:
    smaller chunks pay the fixed extra more often, and a chunk that fits a graph pays none of it.
    Physics, not just a fit: every coefficient is held non-negative (non-negative least squares in
    a Huber loop), the fixed extra at both ends of the fitted D range too (so alpha0 + alpha1 D >= 0
    there; beyond it the evaluation clamps at 0), and kappa is fitted only on steps that ran as
    graphs (None, "unmeasured", when no grid point had one: the evaluator then takes such a step as
    an eager one and says so). Rows: (a) every mixed step of every repetition whose slow-step count
    equals n (y = step_time - baseline) and (b) for grid points without such steps, the mean chunk
    penalty T / n (x = the mean of the point's chunk rows). The evaluation is
    `decision_eval.colocated_cost` (one implementation for the fits, decision.json and routers).
    `bootstrap_context` refits it on grid points resampled with replacement (the full fit's
    Huber weights kept): decision.json's replicates, from which every answer gets its interval.

    The engine's chunk rule (its adapter's, never its name) picks the form's variant:
    `decodes_pay_chunk_tokens` (SGLang's mixed chunks with triton attention: each decode row of the
    chunk's extend batch pays the chunk's length) adds delta x D x c_k to the eager step's work,
    fitted and written only there; `decodes_in_chunk_step` false (SGLang's default: the decodes
    pause while the chunks run back to back) makes each grid point one row, its per-stream total,
    of every chunk step whole, pi_k = compute0 + gamma c_k + beta q_k (no launch floor, stall or
    catch-up: `_point_observations`, `_solve`).

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
from pdexporter.analysis.decision_eval import (
    GRAPH_HINGE_TOKENS,
    ChunkContext,
    chunk_context,
    colocated_cost,
    graph_chunk_ms,
    graph_step_tokens,
)
from pdexporter.analysis.table import ConfigSamples
from pdexporter.engines import BUDGET_RULE, DEFAULT_ENGINE, ChunkRule, adapter, largest_graph

__all__ = [
    "CONTEXT_IF_NEGATIVE",
    "CONTEXT_MEANINGS",
    "CONTEXT_MODEL",
    "CONTEXT_NAMES",
    "CONTEXT_UNITS",
    "DESIGN_COLUMNS",
    "FITTERS",
    "HUBER_K",
    "KFOLD",
    "LEAVE_B_OUT",
    "LEAVE_D_OUT",
    "LEAVE_P_OUT",
    "NO_HELD_OUT",
    "RAW_COLUMNS",
    "SCHEMES",
    "SEED_MODEL",
    "UNMEASURED",
    "Coefficient",
    "ContextAwareModel",
    "CostModel",
    "Design",
    "FitData",
    "FitReport",
    "HeldOut",
    "ModelFit",
    "SeedModel",
    "attention_pairs",
    "bootstrap_context",
    "chunk_schedule",
    "cross_validate",
    "fit_context_model",
    "fit_data",
    "fit_models",
    "fit_seed_model",
    "folds_for",
    "huber_nnls",
    "nnls",
    "num_chunks",
    "predict_points",
    "r_squared",
    "stream_pairs",
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


def num_chunks(p: Any, b: Any, d: Any, engine: str = DEFAULT_ENGINE) -> np.ndarray:
    """The engine's chunk count for each (P, B, D) (vLLM: ceil(P / (B - D))), element-wise."""
    p, b, d = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (p, b, d)))
    rule = adapter(engine)
    counts = {key: len(rule.chunk_schedule(*key)) for key in set(zip(p.ravel().tolist(), b.ravel().tolist(),
                                                                    d.ravel().tolist()))}
    return np.asarray([counts[key] for key in zip(p.ravel().tolist(), b.ravel().tolist(), d.ravel().tolist())],
                      dtype=np.float64).reshape(p.shape)


def chunk_schedule(new_prefill_tokens: int, chunk_size: int, decode_batch_size: int,
                   engine: str = DEFAULT_ENGINE) -> list[int]:
    """Chunk sizes in order (the engine adapter's rule; vLLM: B - D tokens per step, the rest last)."""
    return list(adapter(engine).chunk_schedule(new_prefill_tokens, chunk_size, decode_batch_size))


def attention_pairs(chunk: Any, prefix: Any) -> np.ndarray:
    """Query x context pairs of a chunk of `chunk` tokens starting at position `prefix`."""
    c = np.asarray(chunk, dtype=np.float64)
    return c * np.asarray(prefix, dtype=np.float64) + c * (c + 1) / 2


def stream_pairs(chunks: Any, prompts: Sequence[int] | None = None) -> np.ndarray:
    """Query x context pairs of each chunk of one chunked stream. Without `prompts` (or with one) the
    stream is one prompt; with several (a passive joint event: k prefills the engine ran as one stream
    of their summed tokens, in order), each chunk's tokens attend only within their own prompt, so a
    chunk is split at the prompts' boundaries and each piece counts its pairs from its own prompt's
    start: sum_i P_i (P_i + 1) / 2 over the stream, not P (P + 1) / 2 of the sum. Prompts that do not
    add up to the stream's tokens are not its prompts: the stream is then read as one prompt."""
    c = np.asarray(chunks, np.float64)
    start = np.concatenate([[0.0], np.cumsum(c)[:-1]])
    if prompts is None or len(prompts) < 2 or sum(prompts) != round(float(c.sum())):
        return attention_pairs(c, start)
    bounds = np.concatenate([[0.0], np.cumsum(np.asarray(prompts, np.float64))])
    out = np.zeros(c.size)
    for a, b in zip(bounds[:-1], bounds[1:]):
        lo, hi = np.maximum(start, a), np.minimum(start + c, b)
        piece = np.maximum(hi - lo, 0.0)
        out += np.where(piece > 0, attention_pairs(piece, lo - a), 0.0)
    return out


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
    engine: str = DEFAULT_ENGINE  # whose chunk rule cut the prompts (engines.adapter)
    baseline_ms: np.ndarray | None = None  # per point: its decode-only step (TPOT baseline p50)
    # per point: the prompts its one chunked stream of `prefill` tokens is made of, in the order the
    # engine ran them (a passive joint event's; None, or one prompt: the point is one prompt of P).
    # Attention pairs are each prompt's own (`stream_pairs`); chunks, launches and tokens the stream's.
    prompts: tuple[tuple[int, ...], ...] | None = None
    # the step sizes the engine captured CUDA graphs for, where its records say (`_fit_graph_sizes`): graph steps are
    # padded to them, the largest is the longest graph step; None: the engine's rule's own (vLLM 0.22: to 512, no
    # padding modelled)
    graph_sizes: tuple[int, ...] | None = None

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
            self.design.rows_of(index) if self.design is not None else None, self.engine,
            None if self.baseline_ms is None else self.baseline_ms[index],
            None if self.prompts is None else tuple(self.prompts[i] for i in index), self.graph_sizes,
        )

    def prompts_of(self, i: int) -> tuple[int, ...] | None:
        """Point i's prompts where its stream is several (None: one prompt of its P)."""
        if self.prompts is None or len(self.prompts[i]) < 2:
            return None
        return self.prompts[i]

    @property
    def chunks(self) -> np.ndarray:
        return num_chunks(self.prefill, self.chunk_size, self.decode, self.engine)

    @property
    def graph_max_tokens(self) -> int | None:
        """The largest step the engine ran as a CUDA graph, where its records say (0: none; None: its rule's own)."""
        return None if self.graph_sizes is None else largest_graph(self.graph_sizes)

    @property
    def rule(self) -> ChunkRule:
        rule = adapter(self.engine).chunk_rule
        if self.graph_sizes is None:
            return rule
        return replace(rule, graph_sizes=self.graph_sizes, graph_max_tokens=largest_graph(self.graph_sizes))


def fit_data(table: pd.DataFrame, samples: Sequence[ConfigSamples] = ()) -> FitData:
    """The fit's view of the table: D >= 1, a cost present; steps from the samples by key."""
    steps_by_key = {s.key: tuple((c.baseline_ms, c.step_times_ms) for c in s.steps) for s in samples}
    rows = table[(table["decode_batch_size"] >= 1) & table["aggregate_interference_ms"].notna()
                 & table["total_interference_ms"].notna()]
    keys = list(zip(rows["chunk_size"], rows["decode_batch_size"], rows["new_prefill_tokens"]))
    engines = sorted(str(e) for e in table["engine"].dropna().unique()) if "engine" in table else []
    fitted = set(keys)
    return FitData(
        chunk_size=rows["chunk_size"].to_numpy(np.float64),
        decode=rows["decode_batch_size"].to_numpy(np.float64),
        prefill=rows["new_prefill_tokens"].to_numpy(np.float64),
        cost_ms=rows["aggregate_interference_ms"].to_numpy(np.float64),
        total_ms=rows["total_interference_ms"].to_numpy(np.float64),
        steps=tuple(steps_by_key.get((int(b), int(d), int(p)), ()) for b, d, p in keys),
        engine=_fit_engine(engines),
        baseline_ms=(rows["tpot_baseline_ms"].to_numpy(np.float64) if "tpot_baseline_ms" in rows else None),
        graph_sizes=_fit_graph_sizes([s for s in samples if s.key in fitted]),
    )


def _fit_graph_sizes(samples: Sequence[ConfigSamples]) -> tuple[int, ...] | None:
    """The CUDA-graph sizes of the engines the fitted records came from, where their command lines say (None: no
    record says; the engine's rule stands): the list with the largest graph (vLLM drops the sizes above B, and no
    chunk step exceeds B, so one list pads every chunk size's steps). A smaller largest graph where the chunk size
    capped it is the same engine; records of engines started with other capture sizes cannot share one model."""
    said = [s for s in samples if s.graph_sizes is not None]
    if not said:
        return None
    widest = max(said, key=lambda s: (s.graph_max_tokens or 0, len(s.graph_sizes or ())))
    largest = widest.graph_max_tokens or 0
    other = sorted({v for s in said if (v := s.graph_max_tokens or 0) < largest and v < s.chunk_size})
    if other:
        raise ValueError(f"records of engines with different CUDA-graph sizes (largest graph {largest} and "
                         f"{', '.join(map(str, other))} tokens): fit them apart")
    return widest.graph_sizes


def _fit_engine(engines: Sequence[str]) -> str:
    """The engine whose chunk rule the fit uses: the table's (records of several engines with
    different rules cannot share one model; synthetic/modelled engines follow vLLM's rule)."""
    from pdexporter.engines import registered

    known = [e for e in engines if e in registered()]
    rules = {adapter(e).chunk_rule for e in known}
    if len(rules) > 1:
        raise ValueError(f"records of engines with different chunk rules ({', '.join(known)}): fit them apart")
    return known[0] if known else DEFAULT_ENGINE


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
        """As JSON: an unmeasured coefficient (NaN) is null."""
        return {"name": self.name, "value": None if math.isnan(self.value) else self.value, "stderr": self.stderr,
                "unit": self.unit, "meaning": self.meaning}


class CostModel(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def formula(self) -> str: ...

    def predict(self, d: Any, p: Any, b: Any) -> np.ndarray:
        """Aggregate interference cost in ms for each (D, P, B)."""
        ...

    def coefficients(self) -> list[Coefficient]: ...

    def to_dict(self) -> dict[str, Any]: ...


CONTEXT_NAMES = ("alpha0_ms", "alpha1_ms_per_decode", "compute0_ms", "gamma_ms_per_token", "beta_ms_per_token_pair",
                 "kappa_graph_ms_per_token", "sigma0_ms", "sigma1_ms_per_token", "graph0_ms")
CONTEXT_UNITS = ("ms per eager mixed step", "ms per eager mixed step per decode stream", "ms per eager mixed step",
                 "ms per prefill token", "ms per query-context token pair", "ms per prefill token of a CUDA-graph step",
                 "ms per prefill per decode stream", "ms per prefill token per decode stream",
                 "ms per request admitted in a CUDA-graph step")
CONTEXT_MEANINGS = (
    "the host's launch floor of an eagerly launched step that carries a prefill chunk, over a decode step",
    "change of that launch floor per running decode",
    "fixed part of the GPU's extra work in such a step",
    "cost of one prefill token through the weights",
    "attention cost of one query token over one context token",
    "cost of one prefill token in a step small enough to replay a CUDA graph (no launch cost)",
    "the engine's stalls around a prefill (admission, retirement) outside its chunk steps: fixed part",
    "those stalls' growth with the prompt (hashing its blocks, freeing its KV)",
    "fixed extra of the CUDA-graph step that admits a request (its first chunk: a small prompt whole), over a "
    "decode step; a graph tail after eager chunks does not pay it",
)
CONTEXT_IF_NEGATIVE = (
    "a step carrying a prefill chunk would cost less than the decode step it replaces",
    "larger decode batches shorten the mixed step",
    "the GPU's work for a chunk would be less than for the decode step it replaces",
    "more prefill tokens would make a chunk cheaper",
    "a longer prefix would make attention cheaper",
    "a graph step would get cheaper with more tokens",
    "the engine's loop would run faster around a prefill than without one",
    "longer prompts would stall the engine's loop less",
    "admitting a request in a graph step would cost less than a decode step",
)
DELTA_NAME = "delta_ms_per_decode_token"
DELTA_TEXT = ("ms per chunk token per running decode in the step",
              "what each running decode adds to an eager chunk step per chunk token (its row of the chunk's "
              "attention batch pays the chunk's length: SGLang's mixed chunks with triton attention)",
              "more decodes beside a chunk would shorten its step")
LARGE_GRAPH_NAME = "kappa_graph_large_ms_per_token"
LARGE_GRAPH_TEXT = (f"ms per prefill token past {GRAPH_HINGE_TOKENS} of a CUDA-graph step",
                    f"cost of one prefill token past the first {GRAPH_HINGE_TOKENS} of a chunk step replayed as a "
                    "CUDA graph (an engine started with larger capture sizes: the experts all busy, cheaper a token)",
                    "a graph step would get cheaper with more tokens")
LARGE_GRAPH_FORMULA = (f"; a CUDA-graph step of more than {GRAPH_HINGE_TOKENS} tokens: kappa * {GRAPH_HINGE_TOKENS} + "
                       f"kappa_large * (c_k - {GRAPH_HINGE_TOKENS}) + beta * q_k")
DELTA_FORMULA = ("C = D * (sum over chunks of pi_k + sigma0 + sigma1 * clip(P - P_on, 0, P_sat - P_on)); "
                 "pi_k = max(alpha0 + alpha1 * D, compute0 + (gamma + delta * D) * c_k + beta * q_k) for an "
                 "eagerly launched step (delta: what each decode in the step pays per chunk token), kappa * c_k "
                 "for a CUDA-graph step (+ graph0 in the one that admits the request); chunks by the engine's rule "
                 "(chunk_rule)")
STALL_FORMULA = ("C = D * sum over chunks of (compute0 + gamma * c_k + beta * q_k): the decodes pause for the "
                 "prefill's chunk steps, run back to back, and lose each whole (its fixed part, tokens and attention "
                 "over the prefix added); chunks by the engine's rule (chunk_rule), which says the decodes pause")
UNMEASURED = "unmeasured"


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
    # A chunk step that replays a CUDA graph: per prefill token (None: no grid point had one)
    kappa_graph_ms_per_token: float | None = None
    kappa_stderr: float | None = None
    n_graph_rows: int = 0
    graph0_ms: float = 0.0  # the fixed extra of a graph step that admits the request (0: none measured)
    graph0_stderr: float | None = None
    # The GPU-bound side of an eager step: pi = max(launch floor, compute0 + gamma c + beta q)
    compute0_ms: float = 0.0
    compute0_stderr: float | None = None
    n_launch_bound_rows: int = 0
    n_eager_rows: int = 0
    # The decode-only step T(D) = decode0 + decode1 D (the baseline), and the catch-up after a
    # prefill that ran an eager step: the decodes get back `catchup_steps` x T(D) in the intervals
    # after it (the next step was ready when the long one ended: async scheduling)
    decode0_ms: float = 0.0
    decode1_ms_per_decode: float = 0.0
    catchup_steps: float = 0.0
    # The prompt length from which the stalls stop growing (sigma1 min(P, P_sat); None: linear in P)
    sigma_saturation_tokens: float | None = None
    # The prompt length from which they start to grow: sigma1 clip(P - P_on, 0, P_sat - P_on) (0: from the start)
    sigma_onset_tokens: float = 0.0
    # Each running decode's cost per chunk token in an eager chunk step (the GPU-bound side:
    # + delta D c_k), fitted where the engine's rule says its decodes pay it (None: not a term)
    delta_ms_per_decode_token: float | None = None
    delta_stderr: float | None = None
    # A CUDA-graph step's cost per prefill token past GRAPH_HINGE_TOKENS (`decision_eval.graph_chunk_ms`), fitted
    # where the records have graph steps that long (an engine started with larger capture sizes; None: none)
    kappa_graph_large_ms_per_token: float | None = None
    kappa_large_stderr: float | None = None
    rule: ChunkRule = BUDGET_RULE
    name: str = CONTEXT_MODEL
    formula: str = ("C = D * (sum over chunks of pi_k + sigma0 + sigma1 * clip(P - P_on, 0, P_sat - P_on)); "
                    "pi_k = max(alpha0 + alpha1 * D, compute0 + gamma * c_k + beta * q_k) for an eagerly launched "
                    "step, kappa * c_k for a CUDA-graph step (+ graph0 in the one that admits the request); "
                    "chunks by the engine's rule (chunk_rule)")

    @property
    def values(self) -> tuple[float, float, float, float]:
        return (self.alpha0_ms, self.alpha1_ms_per_decode, self.gamma_ms_per_token, self.beta_ms_per_token_pair)

    def chunk_penalty_ms(self, d: Any, chunk: Any, prefix: Any) -> np.ndarray:
        """One eager chunk step's extra per decode stream: the longer of the launch floor and the GPU's work."""
        return self.eager_penalty_ms(d, chunk, attention_pairs(chunk, prefix))

    def eager_penalty_ms(self, d: Any, chunk: Any, pairs: Any) -> np.ndarray:
        """`chunk_penalty_ms` given each chunk's attention pairs."""
        a0, a1, g, be = self.values
        d = np.asarray(d, np.float64)
        c = np.asarray(chunk, np.float64)
        launch = np.maximum(0.0, a0 + a1 * d)
        delta = self.delta_ms_per_decode_token or 0.0
        return np.maximum(launch, self.compute0_ms + (g + delta * d) * c + be * np.asarray(pairs, np.float64))

    def chunk_penalties_ms(self, d: int, chunks: Sequence[float]) -> np.ndarray:
        """Each chunk step's extra per decode stream, in chunk order: kappa c as a CUDA graph (+ graph0
        for the first chunk, which admits the request; by the engine's rule; the eager form where kappa
        was not measured), else the eager step's."""
        c = np.asarray(chunks, np.float64)
        prefix = np.concatenate([[0.0], np.cumsum(c)[:-1]])
        eager = self.chunk_penalty_ms(d, c, prefix)
        if self.kappa_graph_ms_per_token is None:
            return eager
        graph = np.array([self.rule.graph_step(int(x), d) for x in c], dtype=bool)
        first = np.zeros(c.size)
        first[:1] = self.graph0_ms
        k = {"kappa_graph_ms_per_token": self.kappa_graph_ms_per_token,
             "beta_ms_per_token_pair": self.beta_ms_per_token_pair,
             LARGE_GRAPH_NAME: self.kappa_graph_large_ms_per_token}
        pairs = attention_pairs(c, prefix)
        beside = d if self.rule.decodes_in_chunk_step else 0
        priced = [graph_step_tokens(self.rule.graph_sizes, int(x), beside) for x in c]  # padded past the hinge
        return np.where(graph, first + np.array([graph_chunk_ms(k, float(x), float(q)) for x, q in zip(priced, pairs)]),
                        eager)

    def document(self) -> dict[str, Any]:
        """What `decision_eval.colocated_cost` reads: this model and its chunk rule."""
        return {"model": self.to_dict(), "chunk_rule": self.rule.to_dict()}

    def per_stream_ms(self, d: Any, p: Any, b: Any) -> np.ndarray:
        """Per decode stream (D >= 1)."""
        return _per_point(self.document(), d, p, b, lambda doc, ctx: colocated_cost(doc, ctx)[0] / max(ctx["d"], 1.0))

    def predict(self, d: Any, p: Any, b: Any) -> np.ndarray:
        return _per_point(self.document(), d, p, b, lambda doc, ctx: colocated_cost(doc, ctx)[0])

    def mean_chunk_extra_ms(self, d: Any, p: Any, b: Any) -> np.ndarray:
        """The token-weighted mean extra of the prefill's chunk steps (the penalty it predicts)."""
        return _per_point(self.document(), d, p, b, lambda doc, ctx: colocated_cost(doc, ctx)[1])

    def coefficients(self) -> list[Coefficient]:
        a0, a1, g, be = self.values
        values = (
            a0,
            a1,
            self.compute0_ms,
            g,
            be,
            self.kappa_graph_ms_per_token,
            self.sigma0_ms,
            self.sigma1_ms_per_token,
            self.graph0_ms,
        )
        errors = (
            self.stderr[0],
            self.stderr[1],
            self.compute0_stderr,
            self.stderr[2],
            self.stderr[3],
            self.kappa_stderr,
            *self.sigma_stderr,
            self.graph0_stderr,
        )
        out = [Coefficient(n, math.nan if v is None else float(v), None if s is None else float(s), u, m, w)
               for n, v, s, u, m, w in zip(CONTEXT_NAMES, values, errors, CONTEXT_UNITS, CONTEXT_MEANINGS,
                                           CONTEXT_IF_NEGATIVE)]
        if self.delta_ms_per_decode_token is not None:  # a term only where the engine's decodes pay it
            out.append(Coefficient(DELTA_NAME, self.delta_ms_per_decode_token, self.delta_stderr, *DELTA_TEXT))
        if self.kappa_graph_large_ms_per_token is not None:  # only where graph steps ran past the hinge
            out.append(Coefficient(LARGE_GRAPH_NAME, self.kappa_graph_large_ms_per_token, self.kappa_large_stderr,
                                   *LARGE_GRAPH_TEXT))
        return out

    def to_dict(self) -> dict[str, Any]:
        k = {c.name: (None if math.isnan(c.value) else c.value) for c in self.coefficients()}
        k.update(decode0_ms=self.decode0_ms, decode1_ms_per_decode=self.decode1_ms_per_decode,
                 catchup_steps=self.catchup_steps)
        if self.sigma_saturation_tokens is not None:
            k["sigma_saturation_tokens"] = self.sigma_saturation_tokens
        if self.sigma_onset_tokens:
            k["sigma_onset_tokens"] = self.sigma_onset_tokens
        return {"name": self.name, "formula": self.formula, "coefficients": k,
                "graph_regime": "fitted" if self.kappa_graph_ms_per_token is not None else UNMEASURED}


def _per_point(doc: dict[str, Any], d: Any, p: Any, b: Any,
               value: Callable[[dict[str, Any], ChunkContext], float]) -> np.ndarray:
    """`value` (a decision_eval evaluation) at each (D, P, B), element-wise; NaN where no chunk fits."""
    d, p, b = np.broadcast_arrays(np.asarray(d, np.float64), np.asarray(p, np.float64), np.asarray(b, np.float64))
    out = np.full(d.shape, np.nan)
    cache: dict[tuple[int, int, int], float] = {}
    for index in np.ndindex(d.shape):
        key = (int(d[index]), int(p[index]), int(b[index]))
        if key not in cache:
            try:
                ctx = chunk_context(doc, key[0], key[1], key[2])
            except ValueError:
                cache[key] = math.nan
            else:
                cache[key] = value(doc, ctx)
        out[index] = cache[key]
    return out


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
    """Rows of the context-aware fit, kept per chunk step (`raw`, columns `RAW_COLUMNS`) with the
    observation each belongs to: a located chunk step is an observation of its own, a grid point
    whose steps were not located is one observation, the mean of its chunk rows (y = T / n).
    `point` says which grid point each observation comes from (cross-validation drops a point's
    rows), `group` which repetition (rows of one repetition share its noise: standard errors are
    clustered on it)."""

    raw: np.ndarray  # one row per chunk step: RAW_COLUMNS
    obs: np.ndarray  # the observation each raw row belongs to
    share: np.ndarray  # its weight in that observation (1, or 1/n for a point's mean)
    y: np.ndarray  # per observation
    point: np.ndarray
    group: np.ndarray
    is_step: np.ndarray
    d_range: tuple[float, float] = (1.0, 1.0)
    stall: bool = False  # the decodes pause for the chunk steps (`_point_observations`): no launch floor

    def rows_of(self, points: np.ndarray) -> Design:
        """The observations of these points (each as often as it is listed), renumbered as in
        `FitData.subset(points)`."""
        points = np.asarray(points, dtype=np.int64)
        obs_lists = [np.nonzero(self.point == p)[0] for p in points]
        keep = np.concatenate(obs_lists) if obs_lists else np.empty(0, np.int64)
        new_point = np.concatenate([np.full(o.size, i) for i, o in enumerate(obs_lists)]) if obs_lists else keep
        return self._take(keep, new_point)

    def _take(self, keep: np.ndarray, new_point: np.ndarray) -> Design:
        order = np.argsort(self.obs, kind="stable")
        starts = np.searchsorted(self.obs[order], np.arange(self.y.size))
        ends = np.searchsorted(self.obs[order], np.arange(self.y.size), side="right")
        rows = [order[starts[o]:ends[o]] for o in keep]
        raw_index = np.concatenate(rows) if rows else np.empty(0, np.int64)
        new_obs = np.concatenate([np.full(r.size, i) for i, r in enumerate(rows)]) if rows else raw_index
        return Design(self.raw[raw_index], new_obs, self.share[raw_index], self.y[keep], new_point,
                      self.group[keep], self.is_step[keep], self.d_range, self.stall)

    @property
    def x(self) -> np.ndarray:
        """The observations' design under each eager row's regime as last fitted (`_matrix`)."""
        return _aggregate(self, _matrix(self.raw, self.raw[:, _R_LAUNCH] > 0))


# Per chunk step: eager (launched kernel by kernel), D's place in the fitted D range (0..1), chunk
# tokens, attention pairs, CUDA-graph step, last step of the prefill, prompt tokens, and the regime
# an eager step was found in (1: bound by the host's launches, 0: by the GPU's work).
# decode_tokens: D x the chunk's tokens where each decode in the step pays per chunk token (the
# engine's rule says so, `ChunkRule.decodes_pay_chunk_tokens`), else 0 (a column the fit drops).
RAW_COLUMNS = ("eager", "d_weight", "tokens", "pairs", "graph", "last", "prompt_tokens", "launch_bound", "first",
               "decode_tokens")
_R_EAGER, _R_W, _R_C, _R_Q, _R_GRAPH, _R_LAST, _R_P, _R_LAUNCH, _R_FIRST, _R_DC = range(len(RAW_COLUMNS))
DESIGN_COLUMNS = ("launch_at_d_lo", "launch_at_d_hi", "compute_fixed", "compute_tokens", "compute_pairs",
                  "graph_tokens", "last_step", "last_step_prompt_tokens", "graph_admission", "compute_decode_tokens",
                  "graph_tokens_past_hinge")
_DELTA = DESIGN_COLUMNS.index("compute_decode_tokens")
_LARGE = DESIGN_COLUMNS.index("graph_tokens_past_hinge")


def _chunk_rows(rule: ChunkRule, d: int, chunks: np.ndarray, d_range: tuple[float, float],
                prompts: Sequence[int] | None = None) -> np.ndarray:
    """One raw row per chunk step (RAW_COLUMNS). The last step carries the prompt's retirement too
    (the request finishes with its first token: its KV blocks are freed, its prefix hashed), seen
    on the H200 as ~1 ms per 1K prompt tokens in whichever step ran the last chunk, a one-token tail
    as much as a full chunk: it is fitted as a term of its own, so it cannot pass for the cost of
    the chunk that happens to run there. `prompts`: the stream's prompts where it is several
    (`FitData.prompts`): each chunk's attention pairs are its prompts' own (`stream_pairs`)."""
    graph = np.array([rule.graph_step(int(c), d) for c in chunks], dtype=np.float64)
    beside = d if rule.decodes_in_chunk_step else 0
    # a graph step past the hinge computes the graph it is padded to (the tokens column, `graph_step_tokens`); its
    # attention stays the real tokens'
    tokens = np.array([graph_step_tokens(rule.graph_sizes, int(c), beside) if g else c
                       for c, g in zip(chunks, graph, strict=True)], dtype=np.float64)
    lo, hi = d_range
    w = 0.0 if hi <= lo else (d - lo) / (hi - lo)
    last = np.zeros(chunks.size)
    last[-1] = 1.0
    first = np.zeros(chunks.size)
    first[0] = 1.0
    decode_tokens = d * chunks if rule.decodes_pay_chunk_tokens else np.zeros(chunks.size)
    return np.column_stack([1.0 - graph, np.full(chunks.size, w), tokens, stream_pairs(chunks, prompts), graph,
                            last, np.full(chunks.size, float(chunks.sum())), np.zeros(chunks.size), first,
                            decode_tokens])


def _matrix(raw: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """DESIGN_COLUMNS per raw row, an eager row in its regime: launch-bound rows carry the launch
    floor at the two ends of the D range, compute-bound ones the GPU work's fixed part, tokens and
    attention pairs."""
    eager = raw[:, _R_EAGER]
    lb = eager * launch
    cb = eager * (~launch)
    w = raw[:, _R_W]
    graph, c = raw[:, _R_GRAPH], raw[:, _R_C]
    past = graph * (c > GRAPH_HINGE_TOKENS)  # a graph step past the hinge pays its attention (graph_chunk_ms)
    return np.column_stack([lb * (1.0 - w), lb * w, cb, cb * c, (cb + past) * raw[:, _R_Q],
                            graph * np.minimum(c, GRAPH_HINGE_TOKENS), raw[:, _R_LAST], raw[:, _R_LAST] * raw[:, _R_P],
                            graph * raw[:, _R_FIRST], cb * raw[:, _R_DC],
                            graph * np.maximum(c - GRAPH_HINGE_TOKENS, 0.0)])


def _aggregate(design: Design, matrix: np.ndarray) -> np.ndarray:
    out = np.zeros((design.y.size, matrix.shape[1]))
    np.add.at(out, design.obs, matrix * design.share[:, None])
    return out


_Obs = tuple[np.ndarray, np.ndarray, float]  # an observation: its raw rows, their shares in it, y


def _point_observations(rule: ChunkRule, chunks: np.ndarray, block: np.ndarray,
                        reps: tuple[tuple[float, tuple[float, ...]], ...], total_ms: float
                        ) -> tuple[list[list[_Obs]], bool]:
    """One grid point's observations, grouped by repetition (a repetition is a cluster of shared
    noise), and whether they are located steps (else one observation: the mean chunk penalty).

    Where the decodes pause for the chunks (the engine's rule: SGLang's default), the point is one
    observation, its per-stream total interference, made of every chunk step whole (share 1): the
    decodes wait for the chunks back to back, and lose all of the prefill's time, part of the first
    chunk's included before their stall begins (SGLang's overlap scheduler launches it before it
    hands out the previous step's tokens: 58-104 ms on the H200 at P >= 8192), so the stall alone
    would take a P = 8192 chunk for 160 ms of its ~240. A retirement in the last step is then the
    same thing to them as a fixed part of every step or a cost per prompt token: not a term of its own."""
    n = chunks.size
    if not rule.decodes_in_chunk_step:
        whole = block.copy()
        whole[:, _R_LAST] = 0.0
        return [[(whole, np.ones(n), total_ms)]], False
    # A repetition located every chunk step, or every one but a trailing tail that replayed a
    # graph (it ran like a decode step, so the slow steps alone do not show it).
    trailing = 0
    for is_graph in (block[:, _R_GRAPH] > 0)[::-1]:
        if not is_graph:
            break
        trailing += 1
    seen = n - trailing if trailing < n else n
    usable = [(base, times) for base, times in reps if len(times) in (n, seen)]
    if usable:
        return [[(block[k : k + 1], np.ones(1), float(t) - base) for k, t in enumerate(times)]
                for base, times in usable], True
    return [[(block, np.full(n, 1.0 / n), total_ms / n)]], False


def _design(data: FitData) -> Design:
    """Per mixed step where a repetition's slow steps line up with the chunk schedule as the
    decodes see it (one observation per step; one per stall where they pause for the chunks),
    else one observation per grid point with its mean chunk penalty."""
    raws: list[np.ndarray] = []
    obs: list[np.ndarray] = []
    shares: list[np.ndarray] = []
    ys: list[float] = []
    points: list[int] = []
    groups: list[int] = []
    steps: list[bool] = []
    cluster = 0
    rule = data.rule
    d_range = (float(data.decode.min()), float(data.decode.max())) if len(data) else (1.0, 1.0)
    for i in range(len(data)):
        b, d, p = int(data.chunk_size[i]), int(data.decode[i]), int(data.prefill[i])
        chunks = np.asarray(chunk_schedule(p, b, d, data.engine), np.float64)
        block = _chunk_rows(rule, d, chunks, d_range, data.prompts_of(i))
        per_rep, located = _point_observations(rule, chunks, block, data.steps[i], float(data.total_ms[i]))
        for observations in per_rep:
            for rows, share, y in observations:
                raws.append(rows)
                obs.append(np.full(rows.shape[0], len(ys)))
                shares.append(share)
                ys.append(y)
                points.append(i)
                groups.append(cluster)
                steps.append(located)
            cluster += 1
    if not raws:
        empty = np.empty(0, np.int64)
        return Design(np.empty((0, len(RAW_COLUMNS))), empty, np.empty(0), np.empty(0), empty, empty,
                      np.empty(0, dtype=bool), d_range)
    return Design(np.vstack(raws), np.concatenate(obs), np.concatenate(shares), np.asarray(ys, np.float64),
                  np.asarray(points, np.int64), np.asarray(groups, np.int64), np.asarray(steps, dtype=bool), d_range,
                  not rule.decodes_in_chunk_step)


def _active_columns(x: np.ndarray, d_range: tuple[float, float]) -> list[int]:
    """The design columns the data carry (no D spread: no second launch end; no graph step: no kappa)."""
    active = list(range(len(DESIGN_COLUMNS)))
    if d_range[1] <= d_range[0]:
        active.remove(1)
    return [c for c in active if np.any(x[:, c] != 0)]


def _fit_columns(x: np.ndarray, y: np.ndarray, d_range: tuple[float, float],
                 weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray]:
    """Bounded (>= 0) Huber fit: (coefficients by DESIGN_COLUMNS, Huber weights, active columns,
    the scaled active design). With `weights`, one weighted NNLS with them."""
    active = _active_columns(x, d_range)
    xa = x[:, active]
    scale = np.abs(xa).max(axis=0) if active else np.ones(0)
    scale[scale == 0] = 1.0
    xs = xa / scale
    if weights is None:
        coef_scaled, weights = huber_nnls(xs, y)
    else:
        root = np.sqrt(weights)
        coef_scaled = nnls(xs * root[:, None], y * root)
    coef = np.zeros(x.shape[1])
    coef[active] = coef_scaled / scale
    return coef, weights, active, xs


def _launch_bound(raw: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Each eager row's regime under these coefficients: the host's launches take longer than the
    GPU's work (the step time is the longer of the two)."""
    w = raw[:, _R_W]
    launch = coef[0] * (1.0 - w) + coef[1] * w
    compute = coef[2] + coef[3] * raw[:, _R_C] + coef[4] * raw[:, _R_Q] + coef[_DELTA] * raw[:, _R_DC]
    return (raw[:, _R_EAGER] > 0) & (launch >= compute)


def _solve(design: Design) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray, np.ndarray]:
    """The eager steps' regimes and the coefficients, alternated until the regimes hold still
    (each row in the regime whose time is the longer, as max(launch, compute) says); returns
    (coefficients, Huber weights, active columns, scaled design, launch-bound flag per raw row).
    Where the decodes pause for the chunks (`design.stall`) a step is lost whole, its fixed part,
    tokens and attention pairs added (compute0 + gamma c + beta q, no launch floor): a prompt of one
    chunk then tells the fixed part from the rest, where max(launch, compute) would leave the GPU's
    share to the prompt lengths that are compute-bound (on the H200, one: 8,192 of 512..8,192)."""
    raw = design.raw
    if design.stall:
        launch = np.zeros(raw.shape[0], dtype=bool)
        x = _aggregate(design, _matrix(raw, launch))
        coef, weights, active, xs = _fit_columns(x, design.y, design.d_range)
        return coef, weights, active, xs, launch
    launch = (raw[:, _R_EAGER] > 0) & (raw[:, _R_C] < 4096)  # a start: small chunks wait on launches
    best = None
    for _ in range(30):
        x = _aggregate(design, _matrix(raw, launch))
        coef, weights, active, xs = _fit_columns(x, design.y, design.d_range)
        loss = float(np.sum(weights * (design.y - x @ coef) ** 2))
        if best is None or loss < best[0] - 1e-12:
            best = (loss, coef, weights, active, xs, launch)
        new = _launch_bound(raw, coef)
        if np.array_equal(new, launch):
            break
        launch = new
    assert best is not None
    _, coef, weights, active, xs, launch = best
    return coef, weights, active, xs, launch


def _from_columns(coef: np.ndarray, d_range: tuple[float, float]) -> tuple[float, float]:
    """(alpha0, alpha1) of the launch floor from its values at the two ends of the D range."""
    lo, hi = d_range
    if hi <= lo:
        return float(coef[0]), 0.0
    alpha1 = (coef[1] - coef[0]) / (hi - lo)
    return float(coef[0] - alpha1 * lo), float(alpha1)


def fit_context_model(data: FitData) -> ContextAwareModel:
    design = data.design if data.design is not None else _design(data)
    if design.y.size == 0:
        raise ValueError("no grid point with D >= 1 and a measured cost to fit")
    coef, weights, active, xs, launch = _solve(design)
    n_steps, n_points = int(design.is_step.sum()), int((~design.is_step).sum())
    k = len(DESIGN_COLUMNS)
    se: list[float | None] = [None] * k
    alpha_se: tuple[float | None, float | None] = (None, None)
    x = _aggregate(design, _matrix(design.raw, launch))
    if design.y.size > len(active) and active:
        scale = np.abs(x[:, active]).max(axis=0)
        scale[scale == 0] = 1.0
        cov_scaled = _clustered_cov(xs, design.y - xs @ (coef[active] * scale), design.group, weights)
        cov = np.zeros((k, k))
        cov[np.ix_(active, active)] = cov_scaled / np.outer(scale, scale)
        for j in active:
            se[j] = math.sqrt(max(cov[j, j], 0.0))
        lo, hi = design.d_range
        if hi > lo:  # alpha1 = (c1 - c0) / (hi - lo), alpha0 = c0 - alpha1 lo
            t = np.array([[1 + lo / (hi - lo), -lo / (hi - lo)], [-1 / (hi - lo), 1 / (hi - lo)]])
            c2 = t @ cov[:2, :2] @ t.T
            alpha_se = (math.sqrt(max(c2[0, 0], 0.0)), math.sqrt(max(c2[1, 1], 0.0)))
        else:
            alpha_se = (se[0], None)
    alpha0, alpha1 = _from_columns(coef, design.d_range)
    graph_rows = int(np.sum(design.raw[:, _R_GRAPH] > 0))
    eager_rows = int(np.sum(design.raw[:, _R_EAGER] > 0))
    stage1 = ContextAwareModel(
        alpha0, alpha1, float(coef[3]), float(coef[4]), stderr=(alpha_se[0], alpha_se[1], se[3], se[4]),
        n_step_rows=n_steps, n_point_rows=n_points, n_downweighted=int(np.sum(weights < 0.5)),
        compute0_ms=float(coef[2]), compute0_stderr=se[2],
        kappa_graph_ms_per_token=float(coef[5]) if 5 in active else None, kappa_stderr=se[5],
        n_graph_rows=graph_rows, n_launch_bound_rows=int(np.sum(launch)), n_eager_rows=eager_rows,
        rule=data.rule, sigma0_ms=float(coef[6]), sigma1_ms_per_token=float(coef[7]),
        graph0_ms=float(coef[8]), graph0_stderr=se[8],
    )
    if data.rule.decodes_pay_chunk_tokens:
        stage1 = replace(stage1, delta_ms_per_decode_token=float(coef[_DELTA]), delta_stderr=se[_DELTA],
                         formula=DELTA_FORMULA)
    if _LARGE in active and stage1.kappa_graph_ms_per_token is not None:
        stage1 = replace(stage1, kappa_graph_large_ms_per_token=float(coef[_LARGE]), kappa_large_stderr=se[_LARGE],
                         formula=stage1.formula + LARGE_GRAPH_FORMULA)
    if design.stall:
        stage1 = replace(stage1, formula=STALL_FORMULA)
    decode0, decode1 = _decode_step(data)
    stage1 = replace(stage1, decode0_ms=decode0, decode1_ms_per_decode=decode1)
    return _with_stalls(stage1, data) if n_steps else stage1


def _decode_step(data: FitData) -> tuple[float, float]:
    """The decode-only step T(D) = decode0 + decode1 D (both >= 0) over the points' baselines."""
    if data.baseline_ms is None:
        return 0.0, 0.0
    ok = np.isfinite(data.baseline_ms)
    if not ok.any():
        return 0.0, 0.0
    x = np.column_stack([np.ones(int(ok.sum())), data.decode[ok]])
    coef = nnls(x, data.baseline_ms[ok])
    return float(coef[0]), float(coef[1])


STALL_WEIGHT_FLOOR_MS = 5.0  # the stall fit's relative weights: a total below this weighs as this
# Where the stalls may stop growing with the prompt (sigma1 min(P, P_sat)); None: linear in P. The
# stall fit takes the one whose fit leaves the smallest mean relative residual.
STALL_SATURATION_TOKENS: tuple[float | None, ...] = (2048.0, 4096.0, 8192.0, 16384.0, None)
# Where the stalls may start growing (sigma1 clip(P - P_on, 0, P_sat - P_on)), chosen with P_sat: flat up
# to ~2-3K tokens, then steep (the engine's step log: -2..-6 ms up to ~2,500 tokens, +8..+15 at 3-4K).
STALL_ONSET_TOKENS: tuple[float, ...] = (0.0, 1024.0, 2048.0, 3072.0)

# ((sigma0, sigma1, catchup), the sigmas' standard errors, the weights used, P_sat, P_on)
StallFit = tuple[tuple[float, float, float], tuple[float | None, float | None], np.ndarray | None, float | None,
                 float]


def _stall_fit(
    model: ContextAwareModel, data: FitData, weights: np.ndarray | None = None, *, choose: bool = True,
    form: tuple[float | None, float] | None = None,
) -> StallFit:
    """What the chunk steps leave unexplained of each point's per-stream total interference:
    sigma0 + sigma1 clip(P - P_on, 0, P_sat - P_on) - catchup x T(D) (all three >= 0; the catch-up
    only after an eager step): ((sigma0, sigma1, catchup), the sigmas' standard errors, the weights
    used, P_sat, P_on).

    Fitted on relative residuals (each point's row divided by the total its chunk steps predict, at
    least STALL_WEIGHT_FLOOR_MS; not by its measured total, which would give the points that happened
    to read low the most weight: a passive event is one noisy reading, and so weighted the stall fit
    sat 5-35 ms below the events' own median residual at P < 1.5K): the stall is tens of ms beside
    totals from 10 ms to 1.3 s, and in absolute terms the longest prompts set it. Weighted so, the
    colocated model's error on H200 campaigns it never saw fell from 20.3 % to 14.0 % MAPE (leave
    one campaign out over four campaigns; P = 512-2048 from +18..+20 % to -8..+2 % mean error, 32768
    from +1.6 to +7.4 %: docs/analysis.md, "Held-out campaigns").

    P_sat: the engine's step log puts what the H200's colocated windows lost outside their chunk
    steps at -2..-6 ms for one eager chunk of up to ~2,500 tokens (the catch-up), +8..+15 ms at
    3,072-4,096 and +30..+60 ms from 6,000 tokens on, no more at 32,768 than at 8,192: the stall
    saturates, and a term linear in P put ~180 ms at 32K. With `choose` the saturation is taken
    from `STALL_SATURATION_TOKENS` by the fit itself (smallest mean relative residual; where the
    data cannot tell, as with no prompt beyond a candidate, the larger, else linear), and with it the
    onset from `STALL_ONSET_TOKENS` (on a tie the earlier); else `form` (P_sat, P_on), or the model's own (a
    bootstrap replicate keeps the full fit's)."""
    bare = replace(model, catchup_steps=0.0)
    saving = _own_pairs_saving(bare, data)  # the chunk steps' alone: no stall term enters it
    residual = data.total_ms - bare.per_stream_ms(data.decode, data.prefill, data.chunk_size) + saving
    ok = np.isfinite(residual)
    if ok.sum() < 3 or np.ptp(data.prefill[ok]) == 0:
        return (0.0, 0.0, 0.0), (None, None), None, None, 0.0
    eager_any = np.array([_any_eager(model, int(d), int(p), int(b)) for d, p, b in
                          zip(data.decode[ok], data.prefill[ok], data.chunk_size[ok])], dtype=np.float64)
    step = model.decode0_ms + model.decode1_ms_per_decode * data.decode[ok]
    catchup = bool(np.any(eager_any * step > 0))
    # the weights' base: the chunk steps alone, whichever stage's stall terms `model` carries (the full fit passes
    # the first stage, a bootstrap the final model: the same weights either way)
    steps_only = replace(bare, sigma0_ms=0.0, sigma1_ms_per_token=0.0)
    predicted = steps_only.per_stream_ms(data.decode, data.prefill, data.chunk_size) - saving
    relative = 1.0 / np.maximum(np.abs(predicted[ok]), STALL_WEIGHT_FLOOR_MS)
    candidates = ([(s, on) for s in STALL_SATURATION_TOKENS for on in STALL_ONSET_TOKENS if s is None or on < s]
                  if choose else [form or (model.sigma_saturation_tokens, model.sigma_onset_tokens)])
    best: tuple[float, Any] | None = None
    for saturation, onset in candidates:
        capped = data.prefill[ok] if saturation is None else np.minimum(data.prefill[ok], saturation)
        prompt = np.maximum(capped - onset, 0.0)
        columns = [np.ones(int(ok.sum())), prompt] + ([-eager_any * step] if catchup else [])
        x = np.column_stack(columns)
        solved = _stall_solve(x, residual[ok], relative, None if weights is None else weights[ok])
        miss = float(np.mean(np.abs((residual[ok] - x @ solved[0]) * relative)))
        # a tie (no prompt beyond P_sat): the larger, or linear; of two onsets, the earlier
        if best is None or miss < best[0] * (1 - 1e-9) or (miss <= best[0] * (1 + 1e-9) and onset == best[1][1]):
            best = (miss, (saturation, onset, x, solved))
    assert best is not None
    saturation, onset, x, (coef, used, errors) = best[1]
    full_weights = np.ones(ok.size)
    full_weights[ok] = used
    return ((float(coef[0]), float(coef[1]), float(coef[2]) if catchup else 0.0), errors, full_weights,
            saturation, float(onset))


def _stall_solve(x: np.ndarray, residual: np.ndarray, relative: np.ndarray, weights: np.ndarray | None,
                 ) -> tuple[np.ndarray, np.ndarray, tuple[float | None, float | None]]:
    """One stall fit on its columns: (coefficients, the weights used, the sigmas' standard errors).
    Without `weights`, Huber on relative residuals; with them (a bootstrap replicate), one NNLS."""
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    if weights is None:
        coef_scaled, robust = huber_nnls(x / scale * relative[:, None], residual * relative)
        used = robust * relative * relative
    else:
        used = weights
        root = np.sqrt(used)
        coef_scaled = nnls(x / scale * root[:, None], residual * root)
    errors: tuple[float | None, float | None] = (None, None)
    if residual.size > x.shape[1]:
        cov = _clustered_cov(x / scale, residual - (x / scale) @ coef_scaled, np.arange(residual.size), used)
        raw = np.sqrt(np.maximum(np.diag(cov), 0.0)) / scale
        errors = (float(raw[0]), float(raw[1]))
    return coef_scaled / scale, used, errors


def _own_pairs_saving(model: ContextAwareModel, data: FitData) -> np.ndarray:
    """Per point, per stream: how much less its eager chunk steps cost with each chunk's attention
    pairs its prompts' own (`stream_pairs`) than as one prompt of the stream's P, which is what
    `per_stream_ms` prices (0 for a point of one prompt)."""
    out = np.zeros(len(data))
    if data.prompts is None:
        return out
    for i in range(len(data)):
        prompts = data.prompts_of(i)
        if prompts is None:
            continue
        b, d, p = int(data.chunk_size[i]), int(data.decode[i]), int(data.prefill[i])
        chunks = np.asarray(chunk_schedule(p, b, d, data.engine), np.float64)
        eager = np.array([model.kappa_graph_ms_per_token is None or not model.rule.graph_step(int(c), d)
                          for c in chunks], dtype=bool)
        out[i] = float(np.sum((model.eager_penalty_ms(d, chunks, stream_pairs(chunks))
                               - model.eager_penalty_ms(d, chunks, stream_pairs(chunks, prompts)))[eager]))
    return out


def predict_points(model: ContextAwareModel, data: FitData) -> np.ndarray:
    """Each point's aggregate interference (ms) as the fit priced it: a stream of several prompts
    (`FitData.prompts`: a passive joint event) with each chunk's attention pairs its prompts' own."""
    return model.predict(data.decode, data.prefill, data.chunk_size) - data.decode * _own_pairs_saving(model, data)


def _any_eager(model: ContextAwareModel, d: int, p: int, b: int) -> bool:
    ctx = chunk_context(model.document(), d, p, b)
    return ctx["eager_chunks"] > 0


def _with_stalls(model: ContextAwareModel, data: FitData) -> ContextAwareModel:
    """Second stage: the engine's stalls around the prefill outside its chunk steps (admission,
    seen on vLLM 0.22 as one to three slow steps beside the chunks), added to the last step's
    retirement the first stage found, as sigma0 + sigma1 * clip(P - P_on, 0, P_sat - P_on) per decode
    stream (both >= 0; P_sat: `sigma_saturation_tokens`, where the data say the stall stops growing, else
    none; P_on: `sigma_onset_tokens`, where it starts)."""
    (s0, s1, catchup), errors, _, saturation, onset = _stall_fit(model, data)
    return replace(model, sigma0_ms=model.sigma0_ms + s0, sigma1_ms_per_token=model.sigma1_ms_per_token + s1,
                   sigma_stderr=errors, catchup_steps=catchup, sigma_saturation_tokens=saturation,
                   sigma_onset_tokens=onset)


def bootstrap_context(data: FitData, model: ContextAwareModel, replicates: int = 200,
                      seed: int = 0) -> list[dict[str, float | None]]:
    """The context-aware model refitted on `replicates` resamples of the grid points (drawn with
    replacement; each resampled point brings all its rows, with the full fit's regimes and Huber
    weights): the coefficient sets decision.json carries, from which every verdict gets its interval.

    Both stages are the full fit's, its weights kept: the first stage's Huber weights, and the stall fit's on the
    residuals of the first stage as the full fit has it (its stall terms linear in P, the chosen saturation and
    onset then the stall's form), not of the final model. Fitted on the final model's residuals, every replicate
    of session 29's grid on graphs sat above the central fit, and 80-100 % of those of nine committed H200 grids:
    the central fit at the edge of its own interval. A replicate that draws every
    point once is the full fit (tests/unit/analysis/test_bootstrap_context.py)."""
    data = data.with_design()
    design = data.design
    assert design is not None
    _, weights, _, _, launch = _solve(design)
    matrix = _matrix(design.raw, launch)
    x_all = _aggregate(design, matrix)

    def first_stage(coef: np.ndarray) -> ContextAwareModel:
        alpha0, alpha1 = _from_columns(coef, design.d_range)
        return replace(
            model,
            alpha0_ms=alpha0,
            alpha1_ms_per_decode=alpha1,
            compute0_ms=float(coef[2]),
            gamma_ms_per_token=float(coef[3]),
            beta_ms_per_token_pair=float(coef[4]),
            kappa_graph_ms_per_token=(float(coef[5]) if model.kappa_graph_ms_per_token is not None else None),
            sigma0_ms=float(coef[6]),
            sigma1_ms_per_token=float(coef[7]),
            graph0_ms=float(coef[8]),
            delta_ms_per_decode_token=(float(coef[_DELTA]) if model.delta_ms_per_decode_token is not None else None),
            kappa_graph_large_ms_per_token=(float(coef[_LARGE]) if model.kappa_graph_large_ms_per_token is not None
                                            else None),
            catchup_steps=0.0,
            # as the full fit's first stage: its stall terms (the last step's retirement) linear in P
            sigma_saturation_tokens=None,
            sigma_onset_tokens=0.0,
        )

    form = (model.sigma_saturation_tokens, model.sigma_onset_tokens)
    plain = replace(data, design=None)
    stall_weights = None
    if model.n_step_rows:
        full_coef, _, _, _ = _fit_columns(x_all, design.y, design.d_range, weights)
        _, _, stall_weights, _, _ = _stall_fit(first_stage(full_coef), plain, choose=False, form=form)
    rng = np.random.default_rng(seed)
    rows_by_point = [np.nonzero(design.point == i)[0] for i in range(len(data))]
    out: list[dict[str, float | None]] = []
    for _ in range(replicates):
        drawn = rng.integers(0, len(data), len(data))
        rows = np.concatenate([rows_by_point[i] for i in drawn])
        coef, _, _, _ = _fit_columns(x_all[rows], design.y[rows], design.d_range, weights[rows])
        stage1 = first_stage(coef)
        if model.n_step_rows:
            (s0, s1, catchup), _, _, _, _ = _stall_fit(stage1, plain.subset(drawn),
                                                       None if stall_weights is None else stall_weights[drawn],
                                                       choose=False, form=form)
            stage1 = replace(
                stage1,
                sigma0_ms=stage1.sigma0_ms + s0,
                sigma1_ms_per_token=stage1.sigma1_ms_per_token + s1,
                catchup_steps=catchup,
            )
        stage1 = replace(stage1, sigma_saturation_tokens=form[0], sigma_onset_tokens=form[1])
        out.append(stage1.to_dict()["coefficients"])
    return out


HUBER_K = 1.345  # 95 % efficiency of least squares when the errors are normal


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (scipy's NNLS)."""
    from scipy.optimize import nnls as scipy_nnls

    coef, _ = scipy_nnls(x, y, maxiter=50 * max(x.shape[1], 1))
    return coef


def _median(a: np.ndarray) -> float:
    """np.median's value, without its overhead (huber_nnls takes two a round, thousands of rounds a
    passive fit): the middle element, or the mean of the two middle ones; NaN where any is NaN."""
    n = a.size
    if n == 0 or not np.isfinite(a).all():
        return float(np.median(a))
    half = n // 2
    if n % 2:
        return float(np.partition(a, half)[half])
    part = np.partition(a, (half - 1, half))
    return float((part[half - 1] + part[half]) / 2)


def huber_nnls(x: np.ndarray, y: np.ndarray, iterations: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Huber regression with non-negative coefficients, by iteratively reweighted NNLS from the
    NNLS solution; the scale is re-estimated each round as 1.4826 x the median absolute residual.
    Rows the linear form cannot describe (a stray hiccup, a launch-bound step at the host's slow
    speed) then weigh k*s/|r| instead of 1 and cannot bend the coefficients of the rows that carry
    the cost."""
    coef = nnls(x, y)
    weights = np.ones_like(y)
    floor = 1e-9 * max(float(np.mean(np.abs(y))), 1e-12)
    for _ in range(iterations):
        residuals = y - x @ coef
        sigma = 1.4826 * _median(np.abs(residuals - _median(residuals)))
        k = HUBER_K * max(sigma, floor)
        new_weights = np.where(np.abs(residuals) <= k, 1.0, k / np.maximum(np.abs(residuals), 1e-300))
        root = np.sqrt(new_weights)
        new_coef = nnls(x * root[:, None], y * root)
        # np.allclose(new_coef, coef, rtol=1e-10, atol=1e-12) for finite coefficients, without its overhead
        converged = bool(np.all(np.abs(new_coef - coef) <= 1e-12 + 1e-10 * np.abs(coef)))
        coef, weights = new_coef, new_weights
        if converged:
            break
    return coef, weights


def _clustered_cov(x: np.ndarray, residuals: np.ndarray, groups: np.ndarray,
                   weights: np.ndarray | None = None) -> np.ndarray:
    """Cluster-robust (sandwich) covariance of a (weighted) least-squares fit, with the usual
    small-sample factor."""
    w = np.ones_like(residuals) if weights is None else weights
    bread = np.linalg.pinv(x.T @ (x * w[:, None]))
    labels, index = np.unique(groups, return_inverse=True)
    scores = np.zeros((labels.size, x.shape[1]))
    np.add.at(scores, index, x * (w * residuals)[:, None])
    meat = scores.T @ scores
    m, n, k = labels.size, x.shape[0], x.shape[1]
    factor = (m / max(m - 1, 1)) * ((n - 1) / max(n - k, 1))
    return factor * bread @ meat @ bread


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

    def rank(name: str) -> float:
        r2 = scores[name]
        return -math.inf if r2 is None else r2

    chosen = max(scores, key=rank)
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
