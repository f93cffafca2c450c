"""How long one engine step takes, on the GPU and on the engine core's CPU. Pure: data in, seconds out.

A step's composition is, per scheduled request, its query length c (tokens computed this step)
and its context s (tokens already in its KV cache). From that and a profile, two times:

GPU time (the forward pass and the sampler on the device):

    gpu = fixed + roof(W_compute, W_memory) + roof(A_compute, A_memory) [+ piecewise, a piecewise-graph step]

Weights (tokens through the weights, T = sum of c):
- W_compute = 2 T L (P_dense + k P_expert) / (peak * eff) + 2 n_sampled P_lm_head / (peak * eff_mm),
  split into dense GEMMs (matmul_efficiency) and fused-MoE grouped GEMMs (moe_efficiency);
- W_memory = bytes of the dense weights + of the lm_head (when anything is sampled) + of the
  experts touched, / (HBM * bandwidth_efficiency). With top-k routing spread over E experts, T
  tokens touch E (1 - (1 - k/E)^T) distinct experts per layer in expectation (8 at T = 1, all
  of them from T ~ 100): why decode steps grow with D while big prefill chunks are compute-bound.
Attention:
- A_compute = 4 L H_q d * sum(c s + c (c + 1) / 2) / (peak * attention_efficiency): a chunk of c
  tokens at position s attends to the s earlier tokens and causally to itself, so a long prompt's
  late chunks cost more than its early ones (H200: 8188-token chunks at 8K, 16K, 24K took ~234,
  318, 422 ms);
- A_memory = sum(s + c) KV bytes per token / (HBM * bandwidth_efficiency): decodes read their KV.
  A profile may price a prompt chunk's pairs with its cached prefix (c s) at their own efficiency
  (`prefix_attention_efficiency`; SGLang's triton extend kernel runs them apart from the causal
  part, and on the H200 at ~0.12 of peak against ~0.4: its 32K prompt's 8K chunks took ~130, 540,
  880 and 1,210 ms, vLLM's FlashAttention 3 90, 235, 317, 421).
Mixed steps (a profile's `mixed_decode_us_per_chunk_token`, 0 unless set): every decode of a step
that also carries prompt tokens adds M x max(0, prompt tokens - mixed_decode_free_tokens). SGLang
with --enable-mixed-chunk and triton attention pays it (~0.019 ms per decode per chunk token on
the H200: a decode beside an 8K chunk ~150 ms, the same for every chunk of a 32K prompt); vLLM's
varlen FlashAttention schedules each row by its own length and does not.
Piecewise-graph steps (a profile's `piecewise_gpu_ms`, 0 unless a calibration saw such steps): the
attention between the graphs is launched from Python, and the GPU idles on those launches, so such a
step takes that much longer than its rooflines (Qwen3-8B on an H100, session 31: a 64-256-token prompt
beside 1-12 decodes lengthened its step by ~1 ms more than its tokens' work; a FULL-graph decode step
pays nothing).
`roof(x, y) = (x^p + y^p)^(1/p)` is a smooth roofline (p = roofline_sharpness; p -> inf is max).
KV fill (the decode instance of a P/D pair with DecodeBenchConnector, docs/disaggregation.md):
- F = kv_fill_tokens x KV bytes per token / (HBM * kv_fill_bandwidth_efficiency): the connector
  writes the admitted request's P - 1 tokens of dummy KV into its blocks before the step's forward
  pass, on the same GPU, so it adds to the step: gpu = fixed + roof(W) + roof(A) + F. The admitted
  request's own token attends to its P - 1 tokens of context like any decode (A above).

CPU time (the engine core's main thread: schedule the step, prepare its inputs, launch the
forward pass, later process its outputs):

    cpu = cpu_per_token * T + launch(graph mode)

CUDA graphs, as vLLM 0.22 runs them (cudagraph_mode FULL_AND_PIECEWISE, the default). vLLM captures
graphs for a list of batch sizes (`profile.cudagraph_sizes`: [1, 2, 4] + 8..248 step 8 + 256..512
step 16 by default) and runs a batch of T tokens as the graph of the smallest captured size >= T,
the extra tokens being padding (`CompilationConfig.bs_to_padded_graph_size`): a decode batch of 10
runs as 16, a 300-token mixed batch as 304. So a padded step costs what its padded size costs: the
weights (dense and expert GEMMs, the experts the tokens route to) and the per-token CPU work see
the padded T; attention and the KV read see the real requests (the padded slots have sequence
length 0), and only real requests sample. By graph mode:
- a uniform decode batch (every request one token) whose padded size has a FULL graph (sizes up to
  max_num_seqs) replays it: its launch's CPU time hides under its GPU time (not modelled);
- another batch of at most the largest captured size runs piecewise graphs with the attention
  launched outside them (`launch_piecewise_ms`);
- a batch above the largest size (512 tokens by default) runs without graphs, every kernel
  launched from Python, unpadded (`launch_eager_ms`; ~50 ms for this 48-layer MoE on the H200, the
  "enforce-eager is ten times slower" regime); so does every step when `cuda_graphs` is false.
Launches are asynchronous: the GPU executes the kernels as they come, so a step's GPU work overlaps
its own launch and the previous step's output processing. How the two times combine into what a
client sees is the engine's business (`pdexporter.sim.engine`: the batch queue of async
scheduling); `StepTimeModel.__call__` gives the steady-state answer, the period of a run of
identical steps: max(cpu, gpu). A decode step is GPU-bound (4-10 ms on the H200); a small prefill
chunk without graphs is CPU-bound (~50 ms for any chunk up to ~2K tokens); a big chunk is GPU-bound
again.

`StepArrays` holds many compositions as arrays, padding resolved, for the calibration's fits
(`gpu_s_array`, `cpu_s_array`: the same formulas, vectorised).

The output is a model. Its parameters live in the profile and say whether they were projected or
calibrated (`pdexporter.sim.profile`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pdexporter.errors import ConfigError
from pdexporter.sim.profile import Profile, StepTimeParams

__all__ = [
    "StepArrays", "StepComposition", "StepTimeBreakdown", "StepTimeModel", "landing_factor", "padded_size",
]

FULL, PIECEWISE, EAGER = "full", "piecewise", "eager"
_MODE_CODE = {FULL: 0, PIECEWISE: 1, EAGER: 2}


def padded_size(num_tokens: int, sizes: Sequence[int]) -> int | None:
    """The captured size a batch of `num_tokens` runs as: the smallest size >= it (None: above them all)."""
    i = bisect_left(sizes, num_tokens)
    return sizes[i] if i < len(sizes) else None


@dataclass(frozen=True, slots=True)
class StepComposition:
    """What one step computes, reduced to the sums the model needs."""

    num_tokens: int
    num_requests: int
    num_sampled: int
    max_query_len: int
    attention_pairs: float
    kv_read_tokens: int
    kv_fill_tokens: int = 0  # tokens of KV a connector writes into the cache in this step (DecodeBench)
    num_decode_tokens: int | None = None  # tokens of one-token requests (decodes); None: every token if uniform
    prefix_pairs: float = 0.0  # of attention_pairs: multi-token queries' pairs with their cached prefix (sum c s)

    @classmethod
    def of(cls, chunks: Iterable[tuple[int, int]], num_sampled: int | None = None,
           kv_fill_tokens: int = 0) -> StepComposition:
        """From (query_len, context_before) per request; every request samples unless told."""
        tokens = requests = max_q = kv = decodes = 0
        pairs = prefix = 0.0
        for c, s in chunks:
            tokens += c
            requests += 1
            if c > max_q:
                max_q = c
            if c == 1:
                decodes += 1
            else:
                prefix += c * s
            pairs += c * s + c * (c + 1) / 2
            kv += s + c
        return cls(tokens, requests, requests if num_sampled is None else num_sampled, max_q, pairs, kv,
                   kv_fill_tokens, decodes, prefix)

    @property
    def decode_tokens(self) -> int:
        """Tokens the model generated itself (one-token requests): they route like each other."""
        if self.num_decode_tokens is not None:
            return self.num_decode_tokens
        return self.num_tokens if self.max_query_len <= 1 else 0

    @classmethod
    def decode_batch(cls, d: int, context: int) -> StepComposition:
        """D decodes, each with `context` tokens already cached."""
        return cls.of([(1, context)] * d)

    @property
    def uniform_decode(self) -> bool:
        return self.max_query_len <= 1


@dataclass(frozen=True, slots=True)
class StepTimeBreakdown:
    fixed_s: float
    weights_compute_s: float
    weights_memory_s: float
    attention_compute_s: float
    attention_memory_s: float
    experts_touched: float
    gpu_s: float
    cpu_s: float
    launch_s: float  # the graph-mode part of cpu_s
    graph_mode: str  # "full", "piecewise" or "eager"
    padded_tokens: int = 0  # the tokens the step runs as (the captured size it is padded to; T when eager)
    kv_fill_s: float = 0.0  # the connector's KV fill (part of gpu_s)

    @property
    def total_s(self) -> float:
        """The steady-state period: max(cpu, gpu)."""
        return max(self.cpu_s, self.gpu_s)

    @property
    def total_ms(self) -> float:
        return self.total_s * 1e3


def landing_factor(profile: Profile, params: StepTimeParams | None = None) -> float:
    """How much longer a step runs on the GPU while a KV transfer lands in its memory:
    1 + kv_landing_contention x achieved link bandwidth / HBM bandwidth (MODELLED)."""
    p = params or profile.step_time
    link = profile.kv_transfer
    return 1.0 + p.kv_landing_contention * (link.link_bandwidth_gb_s * 1e9 * link.link_efficiency) / (
        profile.gpu.hbm_bandwidth_tb_s * 1e12)


def _roof(x: float, y: float, p: float) -> float:
    if x <= 0.0:
        return y
    if y <= 0.0:
        return x
    if p >= 64:
        return max(x, y)
    hi = max(x, y)
    return hi * ((x / hi) ** p + (y / hi) ** p) ** (1.0 / p)


@dataclass(frozen=True, slots=True)
class StepArrays:
    """Many step compositions as arrays, graph mode and padding resolved (`StepTimeModel.arrays`)."""

    tokens: np.ndarray  # T as run: padded to its captured size
    decode_tokens: np.ndarray  # real one-token requests among them (the rest: prompt tokens and padding)
    sampled: np.ndarray
    pairs: np.ndarray
    kv_tokens: np.ndarray
    mode: np.ndarray  # 0 full, 1 piecewise, 2 eager
    prefix_pairs: np.ndarray | None = None  # of pairs: multi-token queries' with their cached prefix (None: 0)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class StepTimeModel:
    """The step-time functions of one profile, with their constants precomputed.

    `max_num_batched_tokens` and `max_num_seqs` are the engine's (they bound the captured sizes); by
    default the profile's."""

    def __init__(self, profile: Profile, params: StepTimeParams | None = None, *,
                 max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None) -> None:
        self.profile = profile
        self.params = params or profile.step_time
        m, g, e, p = profile.model, profile.gpu, profile.engine, self.params
        peak = g.peak_dense_bf16_tflops * 1e12
        # FP8 weights run FP8 GEMMs where the GPU has FP8 tensor cores (W8A8), else weight-only (BF16 maths)
        gemm_peak = (g.peak_dense_fp8_tflops * 1e12 if m.weight_dtype_bytes <= 1 and g.peak_dense_fp8_tflops
                     else peak)
        bw = g.hbm_bandwidth_tb_s * 1e12 * p.bandwidth_efficiency
        wb = m.weight_dtype_bytes
        self._fixed = p.fixed_ms * 1e-3
        self._cpu_token = p.cpu_us_per_token * 1e-6
        self._piecewise = p.launch_piecewise_ms * 1e-3
        self._eager = p.launch_eager_ms * 1e-3
        self._launch = (0.0, self._piecewise, self._eager)
        self._piecewise_gpu = p.piecewise_gpu_ms * 1e-3
        self.max_num_seqs = max_num_seqs or e.max_num_seqs
        try:
            self.capture_sizes: tuple[int, ...] = e.capture_sizes(max_num_batched_tokens, self.max_num_seqs)
        except ValueError as exc:
            raise ConfigError(f"profile {profile.name}: engine.{exc}") from None
        largest = self.capture_sizes[-1] if self.capture_sizes else 0
        # vLLM's bs_to_padded_graph_size: the captured size every T up to the largest runs as
        self._pad = [padded_size(n, self.capture_sizes) or 0 for n in range(largest + 1)]
        self.max_capture_size = largest
        # FULL graphs of a uniform decode batch exist for the captured sizes up to max_num_seqs
        self._full_max = max((x for x in self.capture_sizes if x <= self.max_num_seqs), default=0)
        self._p = p.roofline_sharpness
        # seconds per token through the dense and the expert weights, per sampled logit row
        self._dense_s_per_tok = 2.0 * m.dense_params / (gemm_peak * p.matmul_efficiency)
        self._moe_s_per_tok = (
            2.0 * m.moe_layers * m.experts_per_token * m.expert_params / (gemm_peak * p.moe_efficiency)
        )
        self._lm_s_per_row = 2.0 * m.lm_head_params / (peak * p.matmul_efficiency)
        self._dense_bytes_s = m.dense_params * wb / bw
        self._lm_bytes_s = m.lm_head_params * wb / bw
        self._expert_bytes_s = m.moe_layers * m.expert_params * wb / bw
        # Routing: prompt tokens and CUDA-graph padding spread over all E experts (top-k each); the
        # tokens the model generated itself (decodes) over `moe_expert_pool` of them (all: real weights;
        # far fewer on dummy weights, whose greedy tokens are alike)
        self._experts = float(m.num_experts)
        self._pool = float(min(p.moe_expert_pool or m.num_experts, m.num_experts)) if m.is_moe else 0.0
        self._k = float(min(m.experts_per_token, self._pool)) if m.is_moe else 0.0
        self._miss = 1.0 - self._k / self._pool if m.is_moe else 1.0  # a pool expert a decode token misses
        self._miss_all = 1.0 - m.experts_per_token / m.num_experts if m.is_moe else 1.0
        self._attn_s_per_pair = m.attention_flops_per_pair / (peak * p.attention_efficiency)
        self._prefix_s_per_pair = m.attention_flops_per_pair / (
            peak * (p.prefix_attention_efficiency or p.attention_efficiency))
        self._mixed_s = p.mixed_decode_us_per_chunk_token * 1e-6
        self._mixed_free = p.mixed_decode_free_tokens
        self._kv_s_per_token = m.kv_bytes_per_token / bw
        self._fill_s_per_token = m.kv_bytes_per_token / (g.hbm_bandwidth_tb_s * 1e12 * p.kv_fill_bandwidth_efficiency)
        self.landing_factor = landing_factor(profile, p)

    def experts_touched(self, num_tokens: int, decode_tokens: int | None = None) -> float:
        """Expected distinct experts per layer that `num_tokens` tokens route to, `decode_tokens` of them
        (default: all) generated tokens routing within `moe_expert_pool`, the others over all experts:

            pool (1 - m_pool^n_dec m_all^n_other) + (E - pool) (1 - m_all^n_other)

        with m = 1 - k / (experts routed over) the chance that one token misses a given expert."""
        if num_tokens <= 0 or not self._pool:
            return 0.0
        n_dec = num_tokens if decode_tokens is None else min(decode_tokens, num_tokens)
        other = self._miss_all ** (num_tokens - n_dec)
        return self._pool * (1.0 - self._miss**n_dec * other) + (self._experts - self._pool) * (1.0 - other)

    def graph(self, comp: StepComposition) -> tuple[str, int]:
        """(graph mode, tokens the step runs as): vLLM 0.22's FULL_AND_PIECEWISE dispatch with padding."""
        t = comp.num_tokens
        if t > self.max_capture_size or t <= 0:
            return EAGER, t
        padded = self._pad[t]
        if comp.uniform_decode and padded <= self._full_max:
            return FULL, padded
        return PIECEWISE, padded

    def graph_mode(self, comp: StepComposition) -> str:
        return self.graph(comp)[0]

    def padded_tokens(self, comp: StepComposition) -> int:
        return self.graph(comp)[1]

    def launch_s(self, comp: StepComposition) -> float:
        """The graph-mode part of the step's CPU time."""
        return self._launch[_MODE_CODE[self.graph(comp)[0]]]

    def _terms(self, comp: StepComposition, tokens: int) -> tuple[float, float, float, float, float]:
        experts = self.experts_touched(tokens, comp.decode_tokens)
        w_compute = tokens * (self._dense_s_per_tok + self._moe_s_per_tok) + comp.num_sampled * self._lm_s_per_row
        w_memory = (
            self._dense_bytes_s + experts * self._expert_bytes_s + (self._lm_bytes_s if comp.num_sampled else 0.0)
        )
        a_compute = ((comp.attention_pairs - comp.prefix_pairs) * self._attn_s_per_pair
                     + comp.prefix_pairs * self._prefix_s_per_pair)
        a_memory = comp.kv_read_tokens * self._kv_s_per_token
        return w_compute, w_memory, a_compute, a_memory, experts

    def mixed_s(self, comp: StepComposition, tokens: int | None = None) -> float:
        """GPU time the decodes of a mixed step add for the prompt tokens beside them (a profile's
        `mixed_decode_us_per_chunk_token`; 0 unless the engine's attention kernel pays it)."""
        if not self._mixed_s:
            return 0.0
        decodes = comp.decode_tokens
        prompt = (comp.num_tokens if tokens is None else tokens) - decodes
        return self._mixed_s * decodes * max(0.0, prompt - self._mixed_free) if decodes and prompt > 0 else 0.0

    def gpu_s(self, comp: StepComposition) -> float:
        """Seconds the step keeps the GPU busy."""
        if comp.num_tokens <= 0:
            return 0.0
        mode, tokens = self.graph(comp)
        w_compute, w_memory, a_compute, a_memory, _ = self._terms(comp, tokens)
        return (self._fixed + _roof(w_compute, w_memory, self._p) + _roof(a_compute, a_memory, self._p)
                + comp.kv_fill_tokens * self._fill_s_per_token + self.mixed_s(comp, tokens)
                + (self._piecewise_gpu if mode == PIECEWISE else 0.0))

    def kv_fill_s(self, comp: StepComposition) -> float:
        """The connector's KV fill inside the step (DecodeBenchConnector), seconds of GPU time."""
        return comp.kv_fill_tokens * self._fill_s_per_token

    def cpu_s(self, comp: StepComposition) -> float:
        """Seconds of the engine core's main thread the step takes (schedule, prepare, launch, outputs)."""
        if comp.num_tokens <= 0:
            return 0.0
        mode, tokens = self.graph(comp)
        return self._cpu_token * tokens + self._launch[_MODE_CODE[mode]]

    def breakdown(self, comp: StepComposition) -> StepTimeBreakdown:
        if comp.num_tokens <= 0:
            return StepTimeBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, FULL, 0)
        mode, tokens = self.graph(comp)
        w_compute, w_memory, a_compute, a_memory, experts = self._terms(comp, tokens)
        return StepTimeBreakdown(self._fixed, w_compute, w_memory, a_compute, a_memory, experts, self.gpu_s(comp),
                                 self.cpu_s(comp), self.launch_s(comp), mode, tokens, self.kv_fill_s(comp))

    def __call__(self, comp: StepComposition) -> float:
        """The step's period when steps like it run back to back: max(cpu, gpu), in seconds."""
        return max(self.cpu_s(comp), self.gpu_s(comp))

    def decode_step_s(self, d: int, context: int) -> float:
        return self(StepComposition.decode_batch(d, context))

    # -- many steps at once (fitting) ------------------------------------------------------

    def arrays(self, comps: Sequence[StepComposition]) -> StepArrays:
        """The compositions as arrays, padded and classified by this model's captured sizes."""
        graphs = [self.graph(c) for c in comps]
        return StepArrays(
            tokens=np.array([t for _, t in graphs], dtype=float),
            decode_tokens=np.array([c.decode_tokens for c in comps], dtype=float),
            sampled=np.array([c.num_sampled for c in comps], dtype=float),
            pairs=np.array([c.attention_pairs for c in comps], dtype=float),
            kv_tokens=np.array([c.kv_read_tokens for c in comps], dtype=float),
            mode=np.array([_MODE_CODE[m] for m, _ in graphs], dtype=int),
            prefix_pairs=np.array([c.prefix_pairs for c in comps], dtype=float),
        )

    def gpu_s_array(self, a: StepArrays) -> np.ndarray:
        """`gpu_s` of every composition in `a` (an empty step, T = 0, takes 0)."""
        other = self._miss_all ** (a.tokens - np.minimum(a.decode_tokens, a.tokens))
        experts = (self._pool * (1.0 - self._miss ** np.minimum(a.decode_tokens, a.tokens) * other)
                   + (self._experts - self._pool) * (1.0 - other))
        w_compute = a.tokens * (self._dense_s_per_tok + self._moe_s_per_tok) + a.sampled * self._lm_s_per_row
        w_memory = self._dense_bytes_s + experts * self._expert_bytes_s + np.where(a.sampled > 0, self._lm_bytes_s, 0.0)
        prefix = a.prefix_pairs if a.prefix_pairs is not None else np.zeros_like(a.pairs)
        a_compute = (a.pairs - prefix) * self._attn_s_per_pair + prefix * self._prefix_s_per_pair
        a_memory = a.kv_tokens * self._kv_s_per_token
        gpu = self._fixed + _roof_array(w_compute, w_memory, self._p) + _roof_array(a_compute, a_memory, self._p)
        if self._piecewise_gpu:
            gpu = gpu + np.where(a.mode == _MODE_CODE[PIECEWISE], self._piecewise_gpu, 0.0)
        if self._mixed_s:
            decodes = np.minimum(a.decode_tokens, a.tokens)
            prompt = a.tokens - decodes
            gpu = gpu + np.where(prompt > 0, self._mixed_s * decodes * np.maximum(0.0, prompt - self._mixed_free), 0.0)
        return np.where(a.tokens > 0, gpu, 0.0)

    def cpu_s_array(self, a: StepArrays) -> np.ndarray:
        """`cpu_s` of every composition in `a`."""
        cpu = self._cpu_token * a.tokens + np.asarray(self._launch)[a.mode]
        return np.where(a.tokens > 0, cpu, 0.0)


def _roof_array(x: np.ndarray, y: np.ndarray, p: float) -> np.ndarray:
    hi = np.maximum(x, y)
    if p >= 64:
        return hi
    safe = np.where(hi > 0, hi, 1.0)
    return np.where(hi > 0, safe * ((x / safe) ** p + (y / safe) ** p) ** (1.0 / p), 0.0)
