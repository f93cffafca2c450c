"""How long one engine step takes, on the GPU and on the engine core's CPU. Pure: data in, seconds out.

A step's composition is, per scheduled request, its query length c (tokens computed this step)
and its context s (tokens already in its KV cache). From that and a profile, two times:

GPU time (the forward pass and the sampler on the device):

    gpu = fixed + roof(W_compute, W_memory) + roof(A_compute, A_memory)

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
`roof(x, y) = (x^p + y^p)^(1/p)` is a smooth roofline (p = roofline_sharpness; p -> inf is max).

CPU time (the engine core's main thread: schedule the step, prepare its inputs, launch the
forward pass, later process its outputs):

    cpu = cpu_per_token * T + launch(graph mode)

vLLM 0.22 runs a uniform decode batch (every request one token) as one full CUDA graph: its launch
is a graph replay whose CPU time hides under its GPU time (not modelled). A step with a
multi-token request runs piecewise graphs with the attention launched outside them
(`launch_piecewise_ms`), and a step above the largest captured size (max_cudagraph_capture_size =
512 tokens) runs without graphs, every kernel launched from Python (`launch_eager_ms`; ~50 ms for
this 48-layer MoE on the H200, the "enforce-eager is ten times slower" regime). Launches are
asynchronous: the GPU executes the kernels as they come, so a step's GPU work overlaps its own
launch and the previous step's output processing. How the two times combine into what a client
sees is the engine's business (`pdexporter.sim.engine`: the batch queue of async scheduling);
`StepTimeModel.__call__` gives the steady-state answer, the period of a run of identical steps:
max(cpu, gpu). A decode step is GPU-bound (4-10 ms on the H200); a small prefill chunk without
graphs is CPU-bound (~50 ms for any chunk up to ~2K tokens); a big chunk is GPU-bound again.

The output is a model. Its parameters live in the profile and say whether they were projected or
calibrated (`pdexporter.sim.profile`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdexporter.sim.profile import Profile, StepTimeParams


@dataclass(frozen=True, slots=True)
class StepComposition:
    """What one step computes, reduced to the sums the model needs."""

    num_tokens: int
    num_requests: int
    num_sampled: int
    max_query_len: int
    attention_pairs: float
    kv_read_tokens: int

    @classmethod
    def of(cls, chunks: Iterable[tuple[int, int]], num_sampled: int | None = None) -> StepComposition:
        """From (query_len, context_before) per request; every request samples unless told."""
        tokens = requests = max_q = kv = 0
        pairs = 0.0
        for c, s in chunks:
            tokens += c
            requests += 1
            if c > max_q:
                max_q = c
            pairs += c * s + c * (c + 1) / 2
            kv += s + c
        return cls(tokens, requests, requests if num_sampled is None else num_sampled, max_q, pairs, kv)

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

    @property
    def total_s(self) -> float:
        """The steady-state period: max(cpu, gpu)."""
        return max(self.cpu_s, self.gpu_s)

    @property
    def total_ms(self) -> float:
        return self.total_s * 1e3


def _roof(x: float, y: float, p: float) -> float:
    if x <= 0.0:
        return y
    if y <= 0.0:
        return x
    if p >= 64:
        return max(x, y)
    hi = max(x, y)
    return hi * ((x / hi) ** p + (y / hi) ** p) ** (1.0 / p)


class StepTimeModel:
    """The step-time functions of one profile, with their constants precomputed."""

    def __init__(self, profile: Profile, params: StepTimeParams | None = None) -> None:
        self.profile = profile
        self.params = params or profile.step_time
        m, g, e, p = profile.model, profile.gpu, profile.engine, self.params
        peak = g.peak_dense_bf16_tflops * 1e12
        bw = g.hbm_bandwidth_tb_s * 1e12 * p.bandwidth_efficiency
        self._fixed = p.fixed_ms * 1e-3
        self._cpu_token = p.cpu_us_per_token * 1e-6
        self._piecewise = p.launch_piecewise_ms * 1e-3
        self._eager = p.launch_eager_ms * 1e-3
        self._graphs = e.cuda_graphs
        self._graph_max = e.cudagraph_max_tokens
        self._p = p.roofline_sharpness
        # seconds per token through the dense and the expert weights, per sampled logit row
        self._dense_s_per_tok = 2.0 * m.num_layers * m.dense_params_per_layer / (peak * p.matmul_efficiency)
        self._moe_s_per_tok = (
            2.0 * m.num_layers * m.experts_per_token * m.expert_params / (peak * p.moe_efficiency)
        )
        self._lm_s_per_row = 2.0 * m.lm_head_params / (peak * p.matmul_efficiency)
        self._dense_bytes_s = m.num_layers * m.dense_params_per_layer * m.dtype_bytes / bw
        self._lm_bytes_s = m.lm_head_params * m.dtype_bytes / bw
        self._expert_bytes_s = m.num_layers * m.expert_params * m.dtype_bytes / bw
        self._pool = float(p.moe_expert_pool or m.num_experts)
        self._k = float(min(m.experts_per_token, self._pool))
        self._miss = 1.0 - self._k / self._pool
        self._attn_s_per_pair = m.attention_flops_per_pair / (peak * p.attention_efficiency)
        self._kv_s_per_token = m.kv_bytes_per_token / bw

    def experts_touched(self, num_tokens: int) -> float:
        """Expected distinct experts per layer that `num_tokens` tokens route to."""
        if num_tokens <= 0:
            return 0.0
        return self._pool * (1.0 - self._miss**num_tokens)

    def graph_mode(self, comp: StepComposition) -> str:
        if not self._graphs or comp.num_tokens > self._graph_max:
            return "eager"
        return "full" if comp.uniform_decode else "piecewise"

    def launch_s(self, comp: StepComposition) -> float:
        """The graph-mode part of the step's CPU time."""
        mode = self.graph_mode(comp)
        return self._eager if mode == "eager" else self._piecewise if mode == "piecewise" else 0.0

    def _terms(self, comp: StepComposition) -> tuple[float, float, float, float, float]:
        t = comp.num_tokens
        experts = self.experts_touched(t)
        w_compute = t * (self._dense_s_per_tok + self._moe_s_per_tok) + comp.num_sampled * self._lm_s_per_row
        w_memory = self._dense_bytes_s + experts * self._expert_bytes_s + (self._lm_bytes_s if comp.num_sampled else 0.0)
        a_compute = comp.attention_pairs * self._attn_s_per_pair
        a_memory = comp.kv_read_tokens * self._kv_s_per_token
        return w_compute, w_memory, a_compute, a_memory, experts

    def gpu_s(self, comp: StepComposition) -> float:
        """Seconds the step keeps the GPU busy."""
        if comp.num_tokens <= 0:
            return 0.0
        w_compute, w_memory, a_compute, a_memory, _ = self._terms(comp)
        return self._fixed + _roof(w_compute, w_memory, self._p) + _roof(a_compute, a_memory, self._p)

    def cpu_s(self, comp: StepComposition) -> float:
        """Seconds of the engine core's main thread the step takes (schedule, prepare, launch, outputs)."""
        if comp.num_tokens <= 0:
            return 0.0
        return self._cpu_token * comp.num_tokens + self.launch_s(comp)

    def breakdown(self, comp: StepComposition) -> StepTimeBreakdown:
        if comp.num_tokens <= 0:
            return StepTimeBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, "full")
        w_compute, w_memory, a_compute, a_memory, experts = self._terms(comp)
        return StepTimeBreakdown(self._fixed, w_compute, w_memory, a_compute, a_memory, experts, self.gpu_s(comp),
                                 self.cpu_s(comp), self.launch_s(comp), self.graph_mode(comp))

    def __call__(self, comp: StepComposition) -> float:
        """The step's period when steps like it run back to back: max(cpu, gpu), in seconds."""
        return max(self.cpu_s(comp), self.gpu_s(comp))

    def decode_step_s(self, d: int, context: int) -> float:
        return self(StepComposition.decode_batch(d, context))
