"""The offload verdict from `decision.json`, in plain Python: this module imports nothing beyond
the standard library (`math`, `typing`), so a router can copy it whole (a test holds it to that).
The document's shape is `decision_schema.DecisionDocument` (pydantic, and the JSON Schema shipped
from it); here it is read as the plain dict it is in JSON (`Document`), and what comes back is
typed: `ChunkContext`, `ArmNumbers`, `Verdict`.

Everything the verdict needs is in the document (schema `pdexporter.decision/v2`, docs/analysis.md
and docs/disaggregation.md): the engine's chunk rule (`chunk_rule`: how a prompt is cut beside D
running decodes, and up to how many tokens a step runs as a CUDA graph), the colocated cost model
(`model`), and with both arms measured the terms of the two-arm verdict (`two_arm.terms`), each
with the range it was fitted on, its held-out R^2, and bootstrap replicates of its coefficients
(`replicates`) from which every answer gets an interval.

Physics, term by term (every term is a sum of non-negative coefficients times non-negative
features, so no time it gives can be negative, and each grows where the physics says it grows):

- **Chunks.** A P-token prompt runs in steps of `budget` prompt tokens: B - D when the running
  decodes take one token each of the step budget first (vLLM; SGLang's mixed chunks), B when they
  pause for the chunk's step (SGLang's default). A step of at most `graph_max_tokens` tokens (the
  chunk, plus the decodes when they share the step) replays a CUDA graph; a longer one runs
  eagerly, launch by launch (vLLM 0.22 captures up to 512 tokens by default: a one-chunk prefill of
  1,024 tokens cost the decodes ~45 ms per step on the H200, one that fits a graph a few ms).
- **Colocated decodes' loss** (the seed's aggregate interference), per decode stream: each chunk
  step costs pi_k = max(alpha0 + alpha1 D, compute0 + gamma c_k + beta q_k) run eagerly (the
  host's kernel launches or the GPU's work, whichever takes longer), or kappa c_k as a graph, plus
  graph0 in the step that admits the request (q_k: the chunk's query x context pairs, attention
  over the prefix), plus the engine's stalls around the prefill sigma0 + sigma1 clip(P - P_on, 0,
  P_sat - P_on) (`sigma_saturation_tokens`: from there on the stall no longer grows, absent: never;
  `sigma_onset_tokens`: from there on it grows, absent: from the start); times D for
  the batch. Where each decode in a chunk's step pays per chunk token (the model has
  `delta_ms_per_decode_token`: SGLang's mixed chunks) the work gains delta D c_k; where the decodes
  pause for the chunks (SGLang's default) the fit leaves the launch floor and the stalls at 0, so
  each step is its work whole.
- **Colocated TTFT**: the chunk steps and the request's own overheads, a linear model in
  non-negative features (`colocated_ttft`).
- **Offloaded TTFT** = the prefill alone on its own instance (the colocated TTFT at D = 0, plus
  the producer's overhead a pair measured, `prefill_offset`) + the KV transfer (latency + bytes /
  bandwidth, `transfer`) + the decode side (the router's hop, admission and first step on the
  decode instance, `decode_side`).
- **Offloaded decodes' loss**: what admitting the request stalls the running decodes on the decode
  instance (`offloaded_loss`, per stream, times D).

    saved_ms     = colocated decodes' loss - offloaded decodes' loss      (decode time, all D)
    ttft_cost_ms = offloaded TTFT - colocated TTFT                        (the request's)
    offload iff saved_ms > ttft_cost_ms, unless SLOs (`tpot_slo_ms`, `ttft_slo_ms`) are given and
    only one arm holds them all.

Uncertainty. Each number comes with a 90 % interval: the 5th and 95th percentiles over the
bootstrap replicates, each replicate's arm cost multiplied by exp(s z_r) where the document carries
the campaign variation (`campaign_variation`: s, the root mean square of the log errors on GPU
campaigns the models were not fitted on, per arm and `cost_regime`; z_r: `replicates.campaign`,
fixed standard normal draws), each interval widened by how far its own terms lie outside the range they were fitted
on (`extrapolation`, `INTERVAL_TERMS`); the verdict is "decided" when at least 90 % of the
replicates, widened alike (`_widened`: their saving and TTFT cost, or the seed's cost, moved from
the central values by the same factors), agree with it, else "undecided". A threshold
(`offload_thresholds`) judges each replicate at every P by those widened numbers too, so its
interval widens where the terms are extrapolated; the central threshold is the central numbers'. A term
whose held-out R^2 is below 0.5 (it explains less than half of what varies between the
configurations it was not fitted on) is named in the verdict as a weak fit.

The seed's rule (mode "seed") stays: offload iff the colocated aggregate interference exceeds a
transfer time (the seed's constant 50 ms unless a transfer model was measured or a time is given).
"""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Required, TypedDict

__all__ = [
    "ArmNumbers",
    "ChunkContext",
    "Document",
    "Finding",
    "Verdict",
    "CAMPAIGN_ARMS",
    "DECIDED_SHARE",
    "INTERVAL_TERMS",
    "SCHEMA",
    "SEED_RULE",
    "TWO_ARM_RULE",
    "WEAK_R2",
    "campaign_log_sd",
    "chunk_context",
    "colocated_cost",
    "cost_regime",
    "decode_step",
    "evaluate_arms",
    "evaluate_decision",
    "extrapolation",
    "feature",
    "held_out_errors",
    "held_out_text",
    "linear",
    "offload_threshold",
    "offload_thresholds",
    "replicate_costs",
    "transfer_time",
    "widening_by_interval",
]

SCHEMA = "pdexporter.decision/v2"
SEED_RULE = "the seed's rule: offload iff the prefill's aggregate interference exceeds the transfer time"
TWO_ARM_RULE = ("offload iff the decode time it saves (colocated - offloaded decodes' loss) exceeds what the request "
                "pays in TTFT (offloaded - colocated TTFT); an arm that alone holds every SLO given wins")
WEAK_R2 = 0.5  # held-out R^2 below this: the term is named as a weak fit
DECIDED_SHARE = 0.9  # share of bootstrap replicates that must agree for a decided verdict
CAMPAIGN_ARMS = ("colocated", "offloaded")  # the arms whose cost carries the campaign variation
_VLLM_RULE = {"decodes_take_budget": True, "decodes_in_chunk_step": True, "graph_max_tokens": 0}

# decision.json as parsed JSON (its fields: `decision_schema.DecisionDocument`)
Document = Mapping[str, Any]
# where a configuration lies outside a model's fitted range: (model, "P=... (fitted ...)", distance)
Finding = tuple[str, str, float]


# The models below run on floats, and on arrays holding one value per bootstrap replicate where
# `offload_thresholds` or `replicate_costs` is handed a `stack` (numpy.asarray): every replicate at one P in one
# pass, the same arithmetic element by element. This module imports no array library: an array brings its own namespace
# (the Python array API's `__array_namespace__`, numpy >= 2), and plain floats take Python's own functions.
# No augmented assignment (`x += y`) to a value read from the coefficients: an array would change in place.
_PLAIN = (float, int)  # the scalar path's types: no namespace to look for (decide's 200 replicates one by one)


def _xp(*values: Any) -> Any:
    """The array namespace of the first of `values` that is an array, else None."""
    for v in values:
        if type(v) in _PLAIN:
            continue
        namespace = getattr(v, "__array_namespace__", None)
        if namespace is not None:
            return namespace()
    return None


def _max(a: Any, b: Any) -> Any:
    if type(a) in _PLAIN and type(b) in _PLAIN:
        return max(a, b)
    xp = _xp(a, b)
    return max(a, b) if xp is None else xp.maximum(a, b)


def _or0(x: Any) -> Any:
    """`x or 0.0` for a coefficient a document may leave out (None) or set to 0, on an array too."""
    if x is None:
        return 0.0
    return (x or 0.0) if type(x) in _PLAIN or _xp(x) is None else x


def _every(flags: Any) -> Any:
    """`all(flags)` of bools, or element by element of arrays of them."""
    out = True
    for flag in flags:
        out = out & flag
    return out


class ChunkContext(TypedDict):
    """A prompt's chunks beside D decodes at chunk size B (`chunk_context`), and the linear models'
    features at that point (`f`: token counts in thousands, query x context pairs in millions)."""

    d: float
    p_tokens: int
    b: int
    budget: int
    n: int
    full: int
    tail: int
    full_graph: bool
    tail_graph: bool
    q_full: float
    q_tail: float
    eager_chunks: int
    eager_tokens: int
    eager_q: float
    graph_tokens: int
    full_graph_tokens: int
    tail_graph_tokens: int
    f: dict[str, float]


class ArmNumbers(TypedDict, total=False):
    """Both arms' numbers at one point (`evaluate_arms`), ms; the colocated ones always, the rest
    where the document has both arms (`two_arm`)."""

    colocated_cost_ms: Required[float]
    chunks: Required[int]
    chunk_tokens: Required[int]
    graph_chunks: Required[int]
    offloaded_cost_ms: float
    saved_ms: float
    colocated_ttft_ms: float
    offloaded_ttft_ms: float
    ttft_cost_ms: float
    transfer_ms: float
    offloaded_ttft_split_ms: dict[str, float]
    colocated_tpot_ms: float | None
    offloaded_tpot_ms: float | None


class Verdict(TypedDict, total=False):
    """`evaluate_decision`'s answer: the verdict (`offload`, `decided`, `agreement`, `rule`,
    `verdict`) and the seed's numbers always; both arms' numbers, the SLOs and the weak fits in
    two-arm mode. `intervals`: 90 % interval per number (None: no replicates)."""

    offload: bool
    decided: bool
    agreement: float | None
    rule: str
    verdict: str
    mode: Required[str]
    cost_ms: Required[float]
    transfer_ms: Required[float]
    transfer_source: Required[str]
    margin_ms: Required[float]
    chunks: Required[int]
    model: Required[str]
    in_fitted_range: Required[bool]
    extrapolated: Required[list[str]]
    interval_widening: Required[float]
    regime: Required[str]
    interval_widening_by: dict[str, float]
    held_out: dict[str, Any] | None
    intervals: dict[str, list[float] | None]
    reason: str
    weak_fits: list[str]
    saved_ms: float
    ttft_cost_ms: float
    colocated_cost_ms: float
    offloaded_cost_ms: float
    colocated_ttft_ms: float
    offloaded_ttft_ms: float
    offloaded_ttft_split_ms: dict[str, float]
    colocated_tpot_ms: float | None
    offloaded_tpot_ms: float | None
    slos: dict[str, dict[str, bool]]
    degraded_regime: dict[str, Any]  # `decide`'s: the verdict were the transfer degraded


def padded_graph_tokens(sizes: Sequence[int], tokens: int, beside: int) -> int:
    """The prefill tokens a CUDA-graph step of `tokens` chunk tokens beside `beside` decodes computes: vLLM pads the
    step to the smallest captured size that holds it (`CompilationConfig.bs_to_padded_graph_size`) and replays that
    graph, so the step costs what its padded size costs (`chunk_rule.graph_sizes`, ascending; empty: unknown, no
    padding). A 1,310-token step beside 3 decodes runs the 2,064-token graph where 1,040 and 2,064 are the sizes
    (GPU session 30's validation points on graphs: P = 640 and 1,300 read 12-20 % above the unpadded model)."""
    for size in sizes:
        if size >= tokens + beside:
            return size - beside
    return tokens


def graph_step_tokens(sizes: Sequence[int], tokens: int, beside: int) -> int:
    """The prefill tokens a CUDA-graph step is priced at: its padded size (`padded_graph_tokens`) where that graph is
    past the hinge (`GRAPH_HINGE_TOKENS`), the step compute-bound and every padded token computed at kappa_large;
    below it the chunk's own tokens. Up to 512 tokens a step reads the weights whatever its size, and vLLM's default
    sizes pad it by at most 15 tokens, which cost nothing there; priced at kappa, a few-token tail after full
    chunks padded to 16 would be priced 2-3x its own tokens (tried: the small-prompt campaign's held-out graph
    points 37.8 -> 46.3 % off, the tails' kappa read from the fit campaigns' tails)."""
    padded = padded_graph_tokens(sizes, tokens, beside)
    return padded if padded + beside > GRAPH_HINGE_TOKENS else tokens


def chunk_context(doc: Document, d: int, p: int, b: int) -> ChunkContext:
    """The prompt's chunks beside D decodes at chunk size B, as the features the models read."""
    rule = dict(_VLLM_RULE, **(doc.get("chunk_rule") or {}))
    budget = b - d if rule["decodes_take_budget"] else b
    if budget <= 0:
        raise ValueError(f"chunk size {b} leaves no room for a prefill chunk beside {d} decodes")
    if p < 1 or d < 0:
        raise ValueError(f"need P >= 1 and D >= 0 (got P={p}, D={d})")
    n = -(-p // budget)
    full = n - 1
    tail = p - budget * full
    graph_max = rule.get("graph_max_tokens") or 0
    beside = d if rule["decodes_in_chunk_step"] else 0
    full_graph = graph_max > 0 and budget + beside <= graph_max
    tail_graph = graph_max > 0 and tail + beside <= graph_max
    sizes = rule.get("graph_sizes") or ()
    q_all = p * (p + 1) / 2.0
    q_tail = tail * (p - tail) + tail * (tail + 1) / 2.0
    q_full = q_all - q_tail
    eager_chunks = (0 if full_graph else full) + (0 if tail_graph else 1)
    eager_tokens = (0 if full_graph else budget * full) + (0 if tail_graph else tail)
    eager_q = (0.0 if full_graph else q_full) + (0.0 if tail_graph else q_tail)
    largest = budget if n > 1 else tail
    kp = p / 1000.0
    return {
        "d": float(d), "p_tokens": p, "b": b, "budget": budget, "n": n, "full": full, "tail": tail,
        "full_graph": full_graph, "tail_graph": tail_graph, "q_full": q_full, "q_tail": q_tail,
        "eager_chunks": eager_chunks, "eager_tokens": eager_tokens, "eager_q": eager_q,
        "graph_tokens": p - eager_tokens,
        "full_graph_tokens": graph_step_tokens(sizes, budget, beside) if full_graph else budget,
        "tail_graph_tokens": graph_step_tokens(sizes, tail, beside) if tail_graph else tail,
        # the linear models' features (token counts in thousands, pairs in millions)
        "f": {
            "1": 1.0, "d": float(d), "p": kp, "p2": kp * kp, "d_p": d * kp, "chunks": float(n),
            "d_chunks": float(d * n), "chunk": largest / 1000.0, "chunk_p": largest / 1000.0 * kp,
            "eager_chunks": float(eager_chunks), "d_eager_chunks": float(d * eager_chunks),
            "eager_p": eager_tokens / 1000.0, "graph_p": (p - eager_tokens) / 1000.0, "q": q_all / 1e6,
            "eager_q": eager_q / 1e6,
        },
    }


def feature(name: str, d: int, p: int, b: int, doc: Document | None = None) -> float:
    """One regressor of the linear models at (D, P, B) (`doc`'s chunk rule; vLLM's without one)."""
    features = chunk_context(doc or {}, d, p, b)["f"]
    if name not in features:
        raise ValueError(f"unknown feature {name!r} in decision document")
    return features[name]


def linear(model: dict[str, Any], d: int, p: int, b: int, doc: Document | None = None) -> float:
    """A `{"features": [...], "coefficients": {...}}` model at (D, P, B)."""
    return _dot(model, chunk_context(doc or {}, d, p, b), None)


def _dot(term: dict[str, Any], ctx: ChunkContext, coefficients: dict[str, float] | None) -> float:
    k = coefficients if coefficients is not None else term["coefficients"]
    f = ctx["f"]
    total = 0.0
    for name in term["features"]:
        if name not in f:
            raise ValueError(f"unknown feature {name!r} in decision document")
        total += k[name] * f[name]
    return total


def transfer_time(transfer: dict[str, Any], p: int) -> float:
    """KV transfer of a P-token prompt: latency + P x bytes per token / bandwidth (ms)."""
    if "gb_per_s" in transfer:
        return transfer["latency_ms"] + p * transfer["bytes_per_token"] / (transfer["gb_per_s"] * 1e9) * 1e3
    return transfer["fixed_ms"] + transfer["ms_per_token"] * p  # a v1 document's form


def _eager_sum(launch: float, compute0: float, gamma: float, beta: float, budget: int, count: int) -> float:
    """Sum over `count` full chunks of `budget` tokens (chunk k's prefix: k x budget) of their
    eager step's extra, max(launch floor, compute0 + gamma c + beta q_k): q_k grows with k, so the
    first chunks may wait on the launches and the later ones on the GPU (`gamma`: per chunk token,
    the running decodes' delta x D included)."""
    if count <= 0:
        return 0.0
    base = compute0 + gamma * budget + beta * budget * (budget + 1) / 2.0  # chunk 0's GPU-bound extra
    slope = beta * budget * budget  # what each later chunk's prefix adds
    xp = _xp(launch, base, slope)
    if xp is not None:  # per replicate: the branches below, element by element
        rising = slope > 0
        bound = xp.minimum(count, xp.maximum(0, xp.ceil((launch - base) / xp.where(rising, slope, 1.0))))
        launch_bound = xp.where(rising, bound, xp.where(launch > base, count, 0))
    elif slope > 0:
        launch_bound = min(count, max(0, math.ceil((launch - base) / slope)))
    else:
        launch_bound = count if launch > base else 0
    rest = count - launch_bound
    # sum of base + slope k for k = launch_bound .. count - 1
    return launch_bound * launch + rest * base + slope * (rest * (launch_bound + count - 1) / 2.0)


# A CUDA-graph chunk step of more than this many tokens costs less a token and pays its attention (GPU session 29's
# seed grid with graphs captured up to 2,064 tokens, results/h100-vllm0.22-qwen3-coder-30b-a3b-1gpu-graphs: one-chunk
# graph steps of 512 / 1024 / 2048 tokens ~14 / ~19 / ~29 ms over a decode step on an H100, 0.025 ms a token to 512
# and ~0.009 after, the experts all busy; B = 2048's middle chunks, 2,048-token graph steps over a 4K-30K prefix,
# 59-65 ms: a piecewise graph runs attention eagerly, as the eager step's kernel). 512 is vLLM 0.22's default largest
# graph: a fit on default flags has no graph step past it, and neither term; below it a step's attention stays in
# kappa and the last step's term, as fitted before (charging it there put the small-prompt campaign's held-out
# graph points 38 -> 49 % off).
GRAPH_HINGE_TOKENS = 512


def graph_chunk_ms(k: Mapping[str, Any], tokens: float, pairs: float) -> float:
    """A CUDA-graph chunk step of `tokens` prefill tokens and `pairs` attention pairs over a decode step, ms: kappa c
    up to the hinge (`GRAPH_HINGE_TOKENS`); past it kappa * hinge + kappa_large * (c - hinge) + beta q
    (kappa_large absent: kappa, as in every document written before it was a term)."""
    kappa = k["kappa_graph_ms_per_token"]
    if tokens <= GRAPH_HINGE_TOKENS:
        return kappa * tokens
    large = k.get("kappa_graph_large_ms_per_token")
    return (kappa * GRAPH_HINGE_TOKENS + (kappa if large is None else large) * (tokens - GRAPH_HINGE_TOKENS)
            + k["beta_ms_per_token_pair"] * pairs)


def colocated_cost(doc: Document, ctx: ChunkContext, coefficients: dict[str, Any] | None = None
                   ) -> tuple[float, float]:
    """(aggregate interference over the D decodes, token-weighted mean extra of a chunk step), ms.
    A chunk step launched eagerly costs each decode max(alpha0 + alpha1 D, compute0 + gamma c +
    beta q): the host's launches or the GPU's work, whichever takes longer; one replayed as a CUDA
    graph `graph_chunk_ms` (kappa c; past the hinge kappa_large and its attention, beta q, which a piecewise
    graph runs eagerly), plus graph0 in the step that admits the request (taken as an eager one
    where the document has no measured kappa; graph0 is 0 in documents written before it was a term), and
    delta D per chunk token where the decodes in the step pay it (absent: 0)."""
    model = doc["model"]
    d = ctx["d"]
    if model["name"] == "seed_per_chunk":
        pi = _seed_penalty(model, d, ctx["b"])
        return d * ctx["n"] * pi, pi
    if model["name"] != "context_aware":
        raise ValueError(f"unknown model {model['name']!r} in decision document")
    k = coefficients if coefficients is not None else model["coefficients"]
    launch = _max(0.0, k["alpha0_ms"] + k["alpha1_ms_per_decode"] * d)
    compute0, gamma, beta = k.get("compute0_ms", 0.0), k["gamma_ms_per_token"], k["beta_ms_per_token_pair"]
    gamma = gamma + _or0(k.get("delta_ms_per_decode_token")) * d  # each decode in the step, per chunk token
    kappa = k.get("kappa_graph_ms_per_token")
    graph0 = _or0(k.get("graph0_ms"))
    budget, full, tail = ctx["budget"], ctx["full"], ctx["tail"]
    if ctx["full_graph"] and kappa is not None:  # graph0: the step that admits the request
        full_sum = (graph0 + graph_chunk_ms(k, ctx["full_graph_tokens"], ctx["q_full"] / full) * full) if full else 0.0
    else:
        full_sum = _eager_sum(launch, compute0, gamma, beta, budget, full)
    if ctx["tail_graph"] and kappa is not None:
        tail_pi = graph_chunk_ms(k, ctx["tail_graph_tokens"], ctx["q_tail"]) + (graph0 if full == 0 else 0.0)
    else:
        tail_pi = _max(launch, compute0 + gamma * tail + beta * ctx["q_tail"])
    saturation = _or0(k.get("sigma_saturation_tokens"))  # the stall stops growing with P there (absent: never)
    xp = _xp(saturation)
    if xp is not None:
        stall_p = xp.where(saturation != 0, xp.minimum(ctx["p_tokens"], saturation), ctx["p_tokens"])
    else:
        stall_p = min(ctx["p_tokens"], saturation) if saturation else ctx["p_tokens"]
    stall_p = _max(0.0, stall_p - _or0(k.get("sigma_onset_tokens")))  # it grows from P_on (absent: 0)
    per_stream = full_sum + tail_pi + k.get("sigma0_ms", 0.0) + k.get("sigma1_ms_per_token", 0.0) * stall_p
    if ctx["eager_chunks"] or kappa is None:  # after a long step the next was ready: the decodes catch up
        per_stream = per_stream - k.get("catchup_steps", 0.0) * decode_step(k, d)
    mean_extra = (full_sum * budget + tail_pi * tail) / ctx["p_tokens"]
    return d * _max(0.0, per_stream), _max(0.0, mean_extra)


def decode_step(k: dict[str, Any], d: float) -> float:
    """The decode-only step at D decodes (the colocated model's decode0 + decode1 D), ms."""
    return k.get("decode0_ms", 0.0) + k.get("decode1_ms_per_decode", 0.0) * d


def cost_regime(doc: Document, ctx: ChunkContext) -> str:
    """Which step sets the prompt's cost beside the decodes: "graph" (every chunk replays a CUDA
    graph), "launch" (one eager chunk bound by the host's kernel launches: what moves most between
    hosts and days), "compute" (eager chunks bound by the GPU's work), "all" for the seed's model."""
    model = doc.get("model") or {}
    if model.get("name") != "context_aware":
        return "all"
    k = model["coefficients"]
    if ctx["eager_chunks"] == 0 and k.get("kappa_graph_ms_per_token") is not None:
        return "graph"
    if ctx["n"] == 1:
        launch = k["alpha0_ms"] + k["alpha1_ms_per_decode"] * ctx["d"]
        work = k.get("compute0_ms", 0.0) + k["gamma_ms_per_token"] * ctx["tail"] \
            + k["beta_ms_per_token_pair"] * ctx["q_tail"]
        if launch >= work:
            return "launch"
    return "compute"


def _campaign_factors(doc: Document, ctx: ChunkContext, replicate: int | None) -> dict[str, float]:
    """exp(s z_r) per arm for replicate r (1.0 without campaign variation in the document)."""
    variation = doc.get("campaign_variation") or {}
    draws = (doc.get("replicates") or {}).get("campaign") or []
    if replicate is None or not variation or replicate >= len(draws):
        return {arm: 1.0 for arm in CAMPAIGN_ARMS}
    regime = cost_regime(doc, ctx)
    return {arm: math.exp(campaign_log_sd(variation, arm, regime) * draws[replicate][arm]) for arm in CAMPAIGN_ARMS}


def campaign_log_sd(variation: Mapping[str, Any] | None, arm: str, regime: str) -> float:
    """The campaign variation s of an arm's cost in a regime (`cost_regime`): the arm's s for that
    regime, else its pooled s, else 0 (`variation`: decision.json's `campaign_variation`, or the
    `variation` of the held_out.json `pdexporter validate` writes)."""
    v = (variation or {}).get(arm) or {}
    return float((v.get("by_regime") or {}).get(regime, v.get("log_sd", 0.0)))


def _seed_penalty(model: dict[str, Any], d: float, b: int) -> float:
    table = model["penalty_per_chunk_ms"]
    sizes = sorted(int(s) for s in table)
    chosen = b if b in sizes else min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(b)), s))
    ds, pis = table[str(chosen)]["decode_batch_size"], table[str(chosen)]["penalty_ms"]
    if d <= ds[0]:
        return pis[0]
    if d >= ds[-1]:
        return pis[-1]
    i = max(j for j in range(len(ds)) if ds[j] <= d)
    return pis[i] + (pis[i + 1] - pis[i]) * (d - ds[i]) / (ds[i + 1] - ds[i])


def _transfer_model(doc: Document, regime: str) -> dict[str, Any]:
    transfer = ((doc.get("two_arm") or {}).get("terms") or {}).get("transfer") or {}
    if regime == "degraded" and transfer.get("degraded"):
        return dict(transfer, **transfer["degraded"])
    return transfer


def evaluate_arms(doc: Document, d: int, p: int, b: int, *, replicate: int | None = None,
                  transfer_ms: float | None = None, regime: str = "nominal",
                  contexts: tuple[ChunkContext, ChunkContext] | None = None, campaign: bool = True) -> ArmNumbers:
    """Both arms' numbers at (D, P, B) from the central coefficients, or from bootstrap replicate
    `replicate` (an index into `doc["replicates"]`), its arm costs times its campaign factor
    (`campaign=False`: the bootstrap alone). Every time is >= 0 by construction.
    `contexts`: the (D, P, B) and (0, P, B) chunk contexts, when the caller has them already."""
    reps = doc.get("replicates") or {}
    model_k = None if replicate is None else reps["model"][replicate]
    arm_k = None if replicate is None or not doc.get("two_arm") else reps["two_arm"][replicate]
    ctx = contexts[0] if contexts else chunk_context(doc, d, p, b)
    ctx0 = contexts[1] if contexts else None
    return _arm_numbers(doc, d, p, b, (ctx, ctx0), (model_k, arm_k),
                        _campaign_factors(doc, ctx, replicate if campaign else None), transfer_ms, regime)


def _arm_numbers(doc: Document, d: int, p: int, b: int, contexts: tuple[ChunkContext, ChunkContext | None],
                 coefficients: tuple[dict[str, Any] | None, dict[str, Any] | None], factor: Mapping[str, Any],
                 transfer_ms: float | None, regime: str) -> ArmNumbers:
    """`evaluate_arms` from the coefficients it resolved: the colocated model's and the two-arm terms' (None: the
    central ones), each arm's campaign factor; floats, or arrays of replicates (`_ReplicateArrays`)."""
    model_k, k = coefficients
    ctx = contexts[0]
    col_cost, mean_extra = colocated_cost(doc, ctx, model_k)
    col_cost = col_cost * factor["colocated"]
    out: ArmNumbers = {"colocated_cost_ms": col_cost, "chunks": ctx["n"], "chunk_tokens": ctx["budget"],
           "graph_chunks": ctx["n"] - ctx["eager_chunks"]}
    arms = doc.get("two_arm")
    if not arms:
        return out
    terms = arms["terms"]

    def term(name: str, context: ChunkContext) -> Any:
        t = terms.get(name)
        if not t:
            return 0.0
        return _max(0.0, _dot(t, context, None if k is None else k.get(name)))

    ctx0 = contexts[1] or chunk_context(doc, 0, p, b)
    transfer = _transfer_model(doc, regime)
    if transfer_ms is not None:
        t_ms = float(transfer_ms)
    elif transfer.get("source") in ("measured", "given"):
        tk = transfer if k is None or not k.get("transfer") else dict(transfer, **k["transfer"])
        if regime == "degraded" and transfer.get("degraded"):
            tk = dict(tk, **transfer["degraded"])
        t_ms = _max(0.0, transfer_time(tk, p))
    else:
        t_ms = float(doc.get("transfer_ms_default", 50.0))
    off_loss = d * term("offloaded_loss", ctx) * factor["offloaded"]
    if regime == "degraded" and transfer.get("degraded"):
        # the loop waits on the slow transfer
        off_loss = off_loss + d * transfer["degraded"].get("stall_share", 0.0) * t_ms
    col_ttft = term("colocated_ttft", ctx)
    prefill = term("colocated_ttft", ctx0) + term("prefill_offset", ctx0)
    decode_side = term("decode_side", ctx)
    off_ttft = prefill + t_ms + decode_side
    model_k = model_k if model_k is not None else doc["model"].get("coefficients", {})
    step = decode_step(model_k, d) if "decode0_ms" in model_k else None
    out.update({
        "offloaded_cost_ms": off_loss, "saved_ms": col_cost - off_loss, "colocated_ttft_ms": col_ttft,
        "offloaded_ttft_ms": off_ttft, "ttft_cost_ms": off_ttft - col_ttft, "transfer_ms": t_ms,
        "offloaded_ttft_split_ms": {"prefill": prefill, "transfer": t_ms, "decode_side": decode_side},
        "colocated_tpot_ms": (step + mean_extra) if step is not None and d > 0 else None,
        "offloaded_tpot_ms": term("offloaded_tpot", ctx) if terms.get("offloaded_tpot") and d > 0 else None,
    })
    return out


def extrapolation(doc: Document, d: int, p: int, b: int) -> tuple[list[Finding], float]:
    """Where (D, P, B) lies outside the ranges the models were fitted on: a list of
    (model, "P=...", distance) and the factor the intervals are widened by (1 + the largest
    distance: log2 of how far P lies beyond its range, D's relative distance, 1 for an unmeasured
    chunk size or graph regime)."""
    found: list[Finding] = []
    ranges: list[tuple[str, dict[str, Any]]] = [("colocated cost model", doc.get("valid_range") or {})]
    for name, t in ((doc.get("two_arm") or {}).get("terms") or {}).items():
        if t and t.get("range"):
            ranges.append((name.replace("_", " "), t["range"]))
    for name, rng in ranges:
        p_rng, d_rng, b_set = (rng.get("new_prefill_tokens"), rng.get("decode_batch_size"), rng.get("chunk_sizes"))
        b_rng = rng.get("chunk_size")
        if name == "colocated cost model":  # physical in B: any chunk size between the measured ones
            b_set = None
            if b_rng and not b_rng[0] <= b <= b_rng[1]:
                found.append((name, f"B={b} (fitted {b_rng[0]}..{b_rng[1]})", 1.0))
        if p_rng and not p_rng[0] <= p <= p_rng[1]:
            edge = p_rng[0] if p < p_rng[0] else p_rng[1]
            found.append((name, f"P={p} (fitted {p_rng[0]}..{p_rng[1]})", abs(math.log2(p / edge))))
        if d_rng and name != "colocated ttft" and d >= 1 and not d_rng[0] <= d <= d_rng[1]:
            edge = d_rng[0] if d < d_rng[0] else d_rng[1]
            found.append((name, f"D={d} (fitted {d_rng[0]}..{d_rng[1]})", abs(d - edge) / max(edge, 1)))
        if b_set and b not in b_set:
            found.append((name, f"B={b} (measured {', '.join(map(str, b_set))})", 1.0))
    model = doc.get("model") or {}
    if model.get("name") == "context_aware" and model["coefficients"].get("kappa_graph_ms_per_token") is None:
        ctx = chunk_context(doc, d, p, b)
        if ctx["n"] > ctx["eager_chunks"]:
            found.append(("colocated cost model", (f"a CUDA-graph step of <= {doc['chunk_rule']['graph_max_tokens']} "
                                                   "tokens (never measured: taken as an eager step)"), 1.0))
    factor = 1.0 + max((x[2] for x in found), default=0.0)
    return found, factor


# The models each interval's number is made of (the names `extrapolation` reports): an interval is
# widened only by how far its own terms lie beyond what they were fitted on. A colocated loss the
# small-P run measured keeps its bootstrap interval though the pair's arm was measured from 2048.
INTERVAL_TERMS = {
    "colocated_cost_ms": ("colocated cost model",),
    "offloaded_cost_ms": ("offloaded loss",),
    "saved_ms": ("colocated cost model", "offloaded loss"),
    "colocated_ttft_ms": ("colocated ttft",),
    "offloaded_ttft_ms": ("colocated ttft", "prefill offset", "transfer", "decode side"),
    "ttft_cost_ms": ("colocated ttft", "prefill offset", "transfer", "decode side"),
    "transfer_ms": ("transfer",),
}


def widening_by_interval(outside: list[Finding]) -> dict[str, float]:
    """Per interval key (`INTERVAL_TERMS`): 1 + the largest distance among `extrapolation`'s findings
    for the models that number is made of."""
    return {key: 1.0 + max((dist for name, _, dist in outside if name in names), default=0.0)
            for key, names in INTERVAL_TERMS.items()}


def _widen(value: float, central: float, factor: float) -> float:
    """`value` moved away from `central` by `factor` (extrapolation's widening: intervals and replicates alike)."""
    return central + (value - central) * factor


def _widened(r: ArmNumbers, central: ArmNumbers, widening: Mapping[str, float]) -> ArmNumbers:
    """A replicate's numbers with the ones a verdict compares (the seed's cost; the saving and the TTFT
    cost) moved from the central values by their intervals' widening (`widening_by_interval`): a
    verdict, or a threshold, resting on terms used beyond their fitted range is decided only if it
    holds across the widened spread too. The central numbers (`central`) are not moved."""
    out = r.copy()
    out["colocated_cost_ms"] = _widen(r["colocated_cost_ms"], central["colocated_cost_ms"],
                                      widening["colocated_cost_ms"])
    if "saved_ms" in r and "saved_ms" in central and "ttft_cost_ms" in r and "ttft_cost_ms" in central:
        out["saved_ms"] = _widen(r["saved_ms"], central["saved_ms"], widening["saved_ms"])
        out["ttft_cost_ms"] = _widen(r["ttft_cost_ms"], central["ttft_cost_ms"], widening["ttft_cost_ms"])
    return out


def _slo_flags(numbers: ArmNumbers, tpot_slo_ms: float | None, ttft_slo_ms: float | None
               ) -> dict[str, tuple[bool, bool]]:
    """Per SLO given: (colocated holds it, offloaded holds it); TPOT only where both arms have one
    (none at D = 0)."""
    slos: dict[str, tuple[bool, bool]] = {}
    col_tpot, off_tpot = numbers.get("colocated_tpot_ms"), numbers.get("offloaded_tpot_ms")
    if tpot_slo_ms is not None and col_tpot is not None and off_tpot is not None:
        slos["TPOT"] = (col_tpot <= tpot_slo_ms, off_tpot <= tpot_slo_ms)
    if ttft_slo_ms is not None:
        slos["TTFT"] = (numbers["colocated_ttft_ms"] <= ttft_slo_ms, numbers["offloaded_ttft_ms"] <= ttft_slo_ms)
    return slos


def _choose(numbers: ArmNumbers, held: Mapping[str, tuple[bool, bool]]) -> tuple[bool, str]:
    """The two-arm rule: an arm that alone holds every SLO in `held` wins, else offload iff the
    saving exceeds the TTFT cost; (offload, why). On arrays of replicates (`_ReplicateArrays`) the
    same rule element by element, and no why."""
    held_col = _every(v[0] for v in held.values())
    held_off = _every(v[1] for v in held.values())
    margin = numbers["saved_ms"] > numbers["ttft_cost_ms"]
    xp = _xp(held_col, held_off, margin)
    if xp is not None:
        if not held:
            return margin, ""
        held_col, held_off = xp.asarray(held_col, dtype=xp.bool), xp.asarray(held_off, dtype=xp.bool)
        return xp.where(held_off & ~held_col, True, xp.where(held_col & ~held_off, False, margin)), ""
    if held and held_off and not held_col:
        return True, "only offloading holds the SLOs"
    if held and held_col and not held_off:
        return False, "only keeping it local holds the SLOs"
    return margin, "decode time saved vs TTFT paid"


def _interval(values: list[float], central: float, factor: float, duration: bool = True) -> list[float] | None:
    """5th..95th percentile of the replicates' values, widened by `factor` around `central`; a
    duration's interval stops at 0 (a time cannot be negative, a difference can)."""
    if not values:
        return None
    ordered = sorted(values)

    def pct(q: float) -> float:
        x = q / 100.0 * (len(ordered) - 1)
        i = math.floor(x)
        j = min(i + 1, len(ordered) - 1)
        return ordered[i] + (ordered[j] - ordered[i]) * (x - i)

    lo, hi = min(pct(5), central), max(pct(95), central)
    lo, hi = _widen(lo, central, factor), _widen(hi, central, factor)
    return [max(lo, 0.0) if duration else lo, hi]


def _ms(x: float) -> str:
    """1234.5 -> '1.2 s', 40.2 -> '40 ms'; never signed (the caller says which way)."""
    x = abs(x)
    if x >= 1000:
        return f"{x / 1000:.1f} s"
    return f"{x:.0f} ms" if x >= 10 else f"{x:.1f} ms"


def _range_text(iv: list[float]) -> str:
    return f" [{_ms(iv[0]) if iv[0] >= 0 else '-' + _ms(iv[0])}..{_ms(iv[1]) if iv[1] >= 0 else '-' + _ms(iv[1])}]"


def evaluate_decision(doc: Document, d: int, p: int, b: int, transfer_ms: float | None = None, *,
                      tpot_slo_ms: float | None = None, ttft_slo_ms: float | None = None, mode: str | None = None,
                      regime: str = "nominal", intervals: bool = True) -> Verdict:
    """Offload or not for D running decodes, a P-token prefill and chunk size B, from decision.json.

    Returns a `Verdict` (a dict): `offload`, `verdict` (one line), `mode`, `decided` (share of replicates that
    agree >= DECIDED_SHARE, widened as the intervals are), the seed's numbers (`cost_ms`, `transfer_ms`,
    `margin_ms`, `chunks`, `model`, `in_fitted_range`, `extrapolated`), and in two-arm mode both arms'
    numbers with their 90 % intervals (`intervals`), the SLOs and the weak fits."""
    arms = doc.get("two_arm")
    mode = mode or ("two-arm" if arms else "seed")
    if mode not in ("two-arm", "seed"):
        raise ValueError(f"mode {mode!r}: expected two-arm or seed")
    if mode == "two-arm" and not arms:
        raise ValueError("two-arm mode needs a decision document with both arms (export-table --offloaded)")
    central = evaluate_arms(doc, d, p, b, transfer_ms=transfer_ms, regime=regime)
    outside, factor = extrapolation(doc, d, p, b)
    n_reps = len((doc.get("replicates") or {}).get("model") or ()) if intervals else 0
    replicates = [evaluate_arms(doc, d, p, b, replicate=i, transfer_ms=transfer_ms, regime=regime)
                  for i in range(n_reps)]
    cost = central["colocated_cost_ms"]
    transfer_model = _transfer_model(doc, regime)
    if transfer_ms is not None:
        transfer, transfer_source = float(transfer_ms), "given"
    elif transfer_model.get("source") in ("measured", "given"):
        transfer, transfer_source = (
            central.get("transfer_ms", transfer_time(transfer_model, p)),
            transfer_model["source"],
        )
    else:
        transfer, transfer_source = float(doc.get("transfer_ms_default", 50.0)), "seed-constant"
    out: Verdict = {
        "mode": mode, "cost_ms": cost, "transfer_ms": transfer, "transfer_source": transfer_source,
        "margin_ms": cost - transfer, "chunks": central["chunks"], "model": doc["model"]["name"],
        "in_fitted_range": not outside, "extrapolated": [f"{name}: {what}" for name, what, _ in outside],
        "interval_widening": factor, "regime": regime,
    }
    widening = widening_by_interval(outside)
    out["interval_widening_by"] = widening
    out["held_out"] = held_out_errors(doc)
    ivs: dict[str, list[float] | None] = {}
    keys = ("colocated_cost_ms",) if mode == "seed" else tuple(INTERVAL_TERMS)
    numbers: list[Mapping[str, Any]] = [central, *replicates]  # read by key name
    for key in keys:
        ivs[key] = _interval([r[key] for r in numbers[1:]], numbers[0][key], widening[key],
                             duration=key not in ("saved_ms", "ttft_cost_ms"))
    out["intervals"] = ivs
    if mode == "seed":
        offload = cost > transfer
        agree = [_widened(r, central, widening)["colocated_cost_ms"] > transfer for r in replicates]
        share = (sum(a == offload for a in agree) / len(agree)) if agree else None
        iv = ivs["colocated_cost_ms"]
        straddles = iv is not None and iv[0] <= transfer < iv[1]  # the interval holds the budget: either way
        decided = (share is None or share >= DECIDED_SHARE) and not straddles
        relation = ">" if offload else "<="
        text = f"interference {_ms(cost)}{_range_text(iv) if iv else ''} {relation} transfer {_ms(transfer)} " \
               f"({transfer_source})"
        head = (f"{'offload' if offload else 'keep local'} (the seed's rule)" if decided else
                f"undecided (the seed's rule, leaning {'offload' if offload else 'keep local'}: the interval holds "
                "the transfer)" if straddles else
                f"undecided (the seed's rule, leaning {'offload' if offload else 'keep local'}, {share:.0%} of "
                "resamples agree)")
        out.update({"offload": offload, "rule": SEED_RULE, "agreement": share, "decided": decided,
                    "verdict": f"{head}: {text}"})
        return out

    saved, ttft_cost = central["saved_ms"], central["ttft_cost_ms"]
    slos = _slo_flags(central, tpot_slo_ms, ttft_slo_ms)
    offload, reason = _choose(central, slos)
    # each replicate widened as the intervals are, judged against the central SLO flags
    agree = [_choose(_widened(r, central, widening), slos)[0] == offload for r in replicates]
    share = sum(agree) / len(agree) if agree else None
    decided = share is None or share >= DECIDED_SHARE
    weak = []
    for name, t in sorted(((arms or {}).get("terms") or {}).items()):
        r2 = (t or {}).get("held_out_r2")
        if not any((t or {}).get("coefficients", {}).values()):
            continue  # a term fitted to zero (e.g. no producer overhead): nothing for R^2 to explain
        if r2 is not None and r2 < WEAK_R2:
            weak.append(f"{name.replace('_', ' ')} (held-out R^2 {r2:.2f})")
    fit_r2 = (doc.get("fit") or {}).get("held_out_r2")
    if fit_r2 is not None and fit_r2 < WEAK_R2:
        weak.append(f"colocated cost model (held-out R^2 {fit_r2:.2f})")
    arm = 1 if offload else 0
    if not slos:
        slo_text = ""
    else:
        held = [name for name, v in slos.items() if v[arm]]
        missed = [name for name, v in slos.items() if not v[arm]]
        if not missed:
            slo_text = ", both SLOs held" if len(held) == 2 else f", {held[0]} SLO held"
        else:
            slo_text = f", no arm holds every SLO ({' and '.join(missed)} missed this way)"
    decodes = f"the {d} running decode{'s' if d != 1 else ''}"
    save_text = (f"saves {decodes} {_ms(saved)}" if saved >= 0 else f"costs {decodes} {_ms(saved)} more")
    pay_text = (f"costs this request {_ms(ttft_cost)} of TTFT" if ttft_cost >= 0
                else f"also saves this request {_ms(ttft_cost)} of TTFT")
    save_iv = _range_text(iv) if (iv := ivs.get("saved_ms")) else ""
    pay_iv = _range_text(iv) if (iv := ivs.get("ttft_cost_ms")) else ""
    if not decided:
        head = (f"undecided (leaning {'offload' if offload else 'keep local'}, {share:.0%} of resamples agree): "
                f"offloading {save_text}{save_iv} and {pay_text}{pay_iv}")
    elif offload:
        head = f"offload: {save_text}{save_iv}, {pay_text}{pay_iv}"
    else:
        head = f"keep local: offloading {save_text}{save_iv} but {pay_text}{pay_iv}"
    out.update({
        "offload": offload, "decided": decided, "agreement": share, "rule": TWO_ARM_RULE, "reason": reason,
        "verdict": head + slo_text, "weak_fits": weak,
        "saved_ms": saved, "ttft_cost_ms": ttft_cost, "colocated_cost_ms": cost,
        "offloaded_cost_ms": central["offloaded_cost_ms"],
        "colocated_ttft_ms": central["colocated_ttft_ms"], "offloaded_ttft_ms": central["offloaded_ttft_ms"],
        "offloaded_ttft_split_ms": central["offloaded_ttft_split_ms"],
        "colocated_tpot_ms": central["colocated_tpot_ms"], "offloaded_tpot_ms": central["offloaded_tpot_ms"],
        "slos": {name: {"colocated": v[0], "offloaded": v[1]} for name, v in slos.items()},
    })
    return out


def held_out_errors(doc: Document) -> dict[str, Any] | None:
    """What the document says of its models' errors on campaigns they were not fitted on
    (`campaign_variation`): per arm the leave-one-campaign-out MAPE and interval coverage and each
    validation campaign's, and whether the intervals carry the campaign variation (None: the
    document was written without `export-table --campaign-variation`)."""
    variation = doc.get("campaign_variation")
    if not variation:
        return None
    return {"intervals_carry_campaign_variation": bool((doc.get("replicates") or {}).get("campaign")),
            "log_sd": {arm: (variation.get(arm) or {}).get("by_regime") for arm in CAMPAIGN_ARMS if arm in variation},
            **({"source": variation["source"]} if variation.get("source") else {}),
            **(variation.get("held_out") or {})}


def held_out_text(doc: Document) -> str:
    """One line for a person: the held-out errors and the campaigns they were measured on."""
    h = held_out_errors(doc)
    if h is None:
        return ("intervals: this campaign's repetitions only (no campaign variation carried: export-table "
                "--campaign-variation)")
    parts = []
    for arm in CAMPAIGN_ARMS:
        entry = h.get(arm)
        if not entry:
            continue
        loco = entry.get("leave_one_campaign_out") or {}
        if loco.get("mape_pct") is not None:
            parts.append(f"{arm} {loco['mape_pct']:.0f} % MAPE, {loco['coverage']:.0%} inside the 90 % intervals "
                         f"(leave one campaign out: {', '.join(loco.get('campaigns') or [])})")
        for cid, v in (entry.get("validation") or {}).items():
            parts.append(f"{arm} on validation campaign {cid}: {v['mape_pct']:.0f} % MAPE, {v['coverage']:.0%} inside")
    source = f" of {h['source']}" if h.get("source") else ""
    return "held-out error: " + ("; ".join(parts) if parts else "none measured") + \
        f"; intervals carry the campaign-to-campaign variation{source}"


def _threshold_transfer(doc: Document, kw: Mapping[str, Any]) -> tuple[str, float | None]:
    """(regime, transfer_ms) a threshold's verdict reads its numbers at: the seed's rule charges the
    nominal transfer whatever the regime, the two-arm verdict the regime's (or the given transfer)."""
    if _seed_mode(doc, kw):
        return "nominal", None
    return kw.get("regime", "nominal"), kw.get("transfer_ms")


class _Ragged(ValueError):
    """Replicates whose coefficients do not line up (a key in some, a value None in some): judged one by one."""


def _stacked(rows: Sequence[Any], stack: Callable[[list[float]], Any]) -> Any:
    """Replicates' coefficients (dicts alike in shape) as one dict whose values are `stack`ed arrays, one element
    per replicate; a value every replicate shares stays the plain value (the fit's fixed hinges, None)."""
    first = rows[0]
    if isinstance(first, Mapping):
        if any(not isinstance(r, Mapping) or r.keys() != first.keys() for r in rows):
            raise _Ragged("replicates differ in their coefficients")
        return {key: _stacked([r[key] for r in rows], stack) for key in first}
    if all(r == first for r in rows):
        return first
    if any(isinstance(r, bool) or not isinstance(r, (int, float)) for r in rows):
        raise _Ragged("a coefficient is not a number in every replicate")
    return stack([float(r) for r in rows])


class _ReplicateArrays:
    """Bootstrap replicates `indices` of a document as arrays (`_stacked`), for `_arm_numbers` to judge all of them
    at one P in one pass; each arm's campaign factor per cost regime computed as `_campaign_factors` does, once."""

    def __init__(self, doc: Document, indices: Sequence[int], stack: Callable[[list[float]], Any]) -> None:
        reps = doc.get("replicates") or {}
        self.doc, self.indices, self.stack = doc, list(indices), stack
        self.model = _stacked([reps["model"][i] for i in indices], stack)
        self.arms = _stacked([reps["two_arm"][i] for i in indices], stack) if doc.get("two_arm") else None
        self._factors: dict[str, Any] = {}

    def factor(self, ctx: ChunkContext) -> Any:
        regime = cost_regime(self.doc, ctx)
        if regime not in self._factors:
            self._factors[regime] = _stacked([_campaign_factors(self.doc, ctx, i) for i in self.indices], self.stack)
        return self._factors[regime]


def _seed_mode(doc: Document, kw: Mapping[str, Any]) -> bool:
    return kw.get("mode") == "seed" or not doc.get("two_arm")


def _wins(doc: Document, p: int, numbers: ArmNumbers, kw: Mapping[str, Any]) -> bool:
    """Whether offloading wins at P from `numbers` (a replicate's widened as `evaluate_decision`'s
    agreement widens them): the seed's rule, or the two-arm rule with the SLOs these numbers hold."""
    if _seed_mode(doc, kw):
        transfer = kw.get("transfer_ms")
        if transfer is None:
            t = _transfer_model(doc, "nominal")
            transfer = transfer_time(t, p) if t.get("source") in ("measured", "given") \
                else float(doc.get("transfer_ms_default", 50.0))
        return numbers["colocated_cost_ms"] > transfer
    return _choose(numbers, _slo_flags(numbers, kw.get("tpot_slo_ms"), kw.get("ttft_slo_ms")))[0]


def _p_grid(step: int, p_max: int) -> list[int]:
    """The thresholds' scan: multiples of `step` in 10 % steps from `step`, and `p_max`."""
    grid = []
    x = float(step)
    while x < p_max:
        grid.append(round(x / step) * step)
        x *= 1.1
    return [*sorted({g for g in grid if step <= g < p_max}), p_max]


def _verdicts_at(doc: Document, d: int, b: int, kw: Mapping[str, Any]
                ) -> Callable[[int, int | None | _ReplicateArrays], Any]:
    """wins(P, replicate): whether offloading wins at P for the central numbers (replicate None) or
    for a replicate's widened as `evaluate_decision`'s agreement widens them at P (`_widened`), the
    chunk contexts, central numbers and widening computed once per P."""
    cache: dict[int, tuple[ChunkContext, ChunkContext]] = {}
    centrals: dict[int, tuple[ArmNumbers, dict[str, float]]] = {}
    regime, transfer_ms = _threshold_transfer(doc, kw)

    def contexts(p: int) -> tuple[ChunkContext, ChunkContext]:
        if p not in cache:
            cache[p] = (chunk_context(doc, d, p, b), chunk_context(doc, 0, p, b))
        return cache[p]

    def central(p: int) -> tuple[ArmNumbers, dict[str, float]]:
        if p not in centrals:
            centrals[p] = (evaluate_arms(doc, d, p, b, regime=regime, transfer_ms=transfer_ms, contexts=contexts(p)),
                           widening_by_interval(extrapolation(doc, d, p, b)[0]))
        return centrals[p]

    def wins(p: int, replicate: int | None | _ReplicateArrays) -> Any:
        if isinstance(replicate, _ReplicateArrays):  # all of them at once: an array of verdicts
            ctx = contexts(p)
            numbers = _arm_numbers(doc, d, p, b, ctx, (replicate.model, replicate.arms), replicate.factor(ctx[0]),
                                   transfer_ms, regime)
            return _wins(doc, p, _widened(numbers, *central(p)), kw)
        numbers = evaluate_arms(doc, d, p, b, replicate=replicate, regime=regime, transfer_ms=transfer_ms,
                                contexts=contexts(p))
        if replicate is not None:
            numbers = _widened(numbers, *central(p))
        return _wins(doc, p, numbers, kw)

    return wins


def offload_thresholds(doc: Document, d: int, b: int, replicates: tuple[int | None, ...] | list[int | None] = (None,),
                       *, tpot_slo_ms: float | None = None, ttft_slo_ms: float | None = None,
                       mode: str | None = None, p_max: int = 131072, step: int = 64, regime: str = "nominal",
                       transfer_ms: float | None = None,
                       stack: Callable[[list[float]], Any] | None = None) -> list[int | None]:
    """`offload_threshold` for several replicates at once (None: the central coefficients),
    sharing the chunk arithmetic: one threshold (or None) per replicate, in order. A replicate's
    verdict at each P reads its numbers widened as `evaluate_decision`'s agreement does at that P
    (`_widened`: by how far the terms lie beyond their fitted range), so its threshold, and the
    interval over the replicates' thresholds, widens where the terms are extrapolated; the central
    threshold reads the central numbers. `stack` (numpy.asarray; an array library with the Python array
    API): the replicates' verdicts on the scan's grid in one pass per P, the same arithmetic element by
    element, so the same thresholds (`_ReplicateArrays`); without it, or where the replicates do not
    line up, one by one."""
    budget_rule = dict(_VLLM_RULE, **(doc.get("chunk_rule") or {}))
    if d < 0 or (budget_rule["decodes_take_budget"] and b - d <= 0):
        return [None for _ in replicates]
    kw = {"tpot_slo_ms": tpot_slo_ms, "ttft_slo_ms": ttft_slo_ms, "mode": mode, "regime": regime,
          "transfer_ms": transfer_ms}
    grid = _p_grid(step, p_max)
    wins = _verdicts_at(doc, d, b, kw)
    batch = _replicate_arrays(doc, [r for r in replicates if r is not None], stack)
    at = {r: j for j, r in enumerate(batch.indices)} if batch else {}
    last_no = {}
    open_ = list(range(len(replicates)))
    for p in reversed(grid):
        many = wins(p, batch) if batch and any(replicates[i] is not None for i in open_) else None
        still = []
        for i in open_:
            rep = replicates[i]
            if bool(wins(p, rep) if many is None or rep is None else _element(many, at[rep])):
                still.append(i)
            else:
                last_no[i] = p
        open_ = still
        if not open_:
            break
    out: list[int | None] = []
    for i, rep in enumerate(replicates):
        if i not in last_no:
            out.append(step)
            continue
        no = last_no[i]
        if no == p_max:
            out.append(None)
            continue
        yes = grid[grid.index(no) + 1]  # offloads from here up; find the first offload above `no`
        lo, hi = no // step, yes // step  # multiples of step: lo does not offload, hi does
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if wins(mid * step, rep):
                hi = mid
            else:
                lo = mid
        out.append(hi * step)
    return out


def replicate_costs(doc: Document, key: str,
                    points: Sequence[tuple[int, int, int, tuple[ChunkContext, ChunkContext] | None]], *,
                    stack: Callable[[list[float]], Any] | None = None) -> list[list[float]]:
    """`key` of `evaluate_arms` (e.g. "colocated_cost_ms") for every bootstrap replicate, in order, at each of
    `points` ((D, P, B, their (D, P, B) and (0, P, B) chunk contexts or None)), the bootstrap alone (`campaign=False`:
    `pdexporter validate` widens them by the variation it measures itself). `stack` (numpy.asarray): all replicates
    at a point in one pass (`_ReplicateArrays`, stacked once for all the points), the same arithmetic element by
    element; without it, or where the replicates do not line up, one by one."""
    n = len((doc.get("replicates") or {}).get("model") or ())
    batch = _replicate_arrays(doc, list(range(n)), stack)
    out = []
    for d, p, b, contexts in points:
        ctx = contexts or (chunk_context(doc, d, p, b), chunk_context(doc, 0, p, b))
        if batch is None:
            rows: list[Mapping[str, Any]] = [evaluate_arms(doc, d, p, b, replicate=i, campaign=False, contexts=ctx)
                                             for i in range(n)]
            out.append([float(r[key]) for r in rows])
            continue
        numbers: Mapping[str, Any] = _arm_numbers(doc, d, p, b, ctx, (batch.model, batch.arms),
                                                  _campaign_factors(doc, ctx[0], None), None, "nominal")
        values = numbers[key]
        out.append([float(values)] * n if _xp(values) is None else [float(v) for v in values.tolist()])
    return out


def _replicate_arrays(doc: Document, indices: list[int], stack: Callable[[list[float]], Any] | None
                      ) -> _ReplicateArrays | None:
    if stack is None or len(indices) < 2:
        return None
    try:
        return _ReplicateArrays(doc, indices, stack)
    except _Ragged:
        return None


def _element(values: Any, j: int) -> Any:
    """Element j of a replicates' array of verdicts, or the one verdict every replicate shares (no term varied)."""
    return values if _xp(values) is None else values[j]


def offload_threshold(doc: Document, d: int, b: int, *, tpot_slo_ms: float | None = None,
                      ttft_slo_ms: float | None = None, mode: str | None = None, p_max: int = 131072, step: int = 64,
                      replicate: int | None = None, regime: str = "nominal",
                      transfer_ms: float | None = None) -> int | None:
    """The prompt length from which offloading wins at D decodes and chunk size B, up to `p_max`:
    the smallest P (a multiple of `step`) from which every P' up to `p_max` is an offload, on a
    geometric grid (10 % steps) refined by bisection at `step` resolution below the last P that
    does not offload (None: P = p_max does not; `step` when every P does)."""
    return offload_thresholds(doc, d, b, (replicate,), tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms, mode=mode,
                              p_max=p_max, step=step, regime=regime, transfer_ms=transfer_ms)[0]
