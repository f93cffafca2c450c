"""A (GPU, model) profile of the embedded engine: what the scheduler and the step-time model need.

A profile is a YAML file (`pdexporter/sim/profiles/<name>.yaml`, or any path) validated by the
pydantic schemas below. Every number in it is either a fact about the hardware and the model
(datasheet, architecture config) or a parameter of the step-time model; `calibration` says where
the parameters came from:

- `projected`: from datasheet compute and bandwidth with efficiencies carried over from another
  GPU, not checked against any measurement;
- `projected-from-facts`: fitted by hand to a few step times measured on a real vLLM
  (docs/vllm-facts.md), not to a sweep;
- `calibrated`: fitted by `pdexporter sim calibrate` to measured records (`calibration_source`
  names them), and no worse than the profile it started from on the configurations held out;
- `calibrated-worse-than-base`: fitted the same way but worse than its starting profile on a held-out
  quantity, written only because `--force` (or its older name `--accept-worse`) was given (the note
  names the quantity and both errors).

A calibrated profile carries `calibration_check` (`CalibrationCheck`): the held-out MAPE of every
quantity with the fitted profile and with the profile it started from, which ones the fit predicts
worse, and whether it was written anyway (`forced`).

A wrong field is one line naming the file and the field (`ConfigError`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pdexporter._internal.finite import YamlProblem, load_yaml_strict
from pdexporter._internal.text import read_utf8
from pdexporter._internal.validation import format_validation_error
from pdexporter.engines import DEFAULT_CHUNK_SIZE, cudagraph_sizes  # vLLM's rule, in its adapter (re-exported)
from pdexporter.errors import ConfigError

__all__ = [
    "Calibration",
    "CalibrationCheck",
    "EngineLoopParams",
    "EngineSpec",
    "GpuSpec",
    "HostParams",
    "KvTransferParams",
    "ModelSpec",
    "PROFILES_DIR",
    "PROFILES_ENV",
    "Profile",
    "ProfileEntry",
    "StepTimeParams",
    "available_profiles",
    "cudagraph_sizes",
    "list_profiles",
    "load_profile",
    "parse_profile",
    "profile_path",
    "user_profile_dirs",
]

PROFILES_DIR = Path(__file__).with_name("profiles")

Calibration = Literal["projected", "projected-from-facts", "calibrated", "calibrated-worse-than-base"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Strict):
    name: str
    memory_gib: float = Field(gt=0)
    peak_dense_bf16_tflops: float = Field(gt=0, description="datasheet dense BF16 tensor-core peak")
    peak_dense_fp8_tflops: float | None = Field(
        None, gt=0, description="datasheet dense FP8 tensor-core peak (None: no FP8 tensor cores, e.g. A100: FP8 "
                                "weights then run as weight-only quantisation at the BF16 peak)")
    measured_matmul_tflops: float | None = Field(None, gt=0, description="a large GEMM measured on this GPU")
    hbm_bandwidth_tb_s: float = Field(gt=0)
    source: str = Field("", description="where the figures come from (e.g. the vendor's datasheet)")


class ModelSpec(_Strict):
    """The transformer's shapes, flattened from its Hugging Face config.json (`sim.modelconfig`).

    Dense (Llama, Qwen2, Qwen3: `num_experts` 0, the MLP `intermediate_size` wide) or mixture of
    experts (Qwen3-MoE, Mixtral, DeepSeek: `num_experts` of `moe_intermediate_size`, top
    `experts_per_token`, optionally `dense_layers` with a dense MLP and a shared expert always
    active); attention GQA (`num_kv_heads` <= `num_q_heads`) or DeepSeek's MLA (`kv_lora_rank` > 0:
    the cache holds the compressed latent and the rotary key, `kv_lora_rank + qk_rope_head_dim`
    values a token a layer). `weight_bytes` is 1 for FP8 weights; `dtype_bytes` is the activations'
    and the KV cache's."""

    name: str = Field(description="served model name, as in /v1/models")
    architecture: str = "Qwen3MoeForCausalLM"
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_q_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0, description="query/key head dimension (MLA: qk_nope_head_dim + qk_rope_head_dim)")
    num_experts: int = Field(0, ge=0, description="routed experts per MoE layer (0: a dense model)")
    experts_per_token: int = Field(0, ge=0)
    moe_intermediate_size: int = Field(0, ge=0, description="one routed expert's width")
    intermediate_size: int = Field(0, ge=0, description="the dense MLP's width (a dense model, or the dense layers "
                                                         "of an MoE model)")
    dense_layers: int = Field(0, ge=0, description="layers of an MoE model with a dense MLP instead of experts "
                                                   "(DeepSeek's first_k_dense_replace, Qwen's mlp_only_layers)")
    shared_expert_intermediate_size: int = Field(
        0, ge=0, description="width of the always-active shared expert(s) of each MoE layer, all of them together")
    vocab_size: int = Field(gt=0)
    dtype_bytes: int = Field(2, gt=0, description="bytes of an activation and of a KV-cache value")
    weight_bytes: float | None = Field(None, gt=0, description="bytes of a weight (None: dtype_bytes; FP8: 1)")
    tie_word_embeddings: bool = False
    v_head_dim: int | None = Field(None, gt=0, description="value head dimension (None: head_dim)")
    kv_lora_rank: int = Field(0, ge=0, description="MLA's compressed KV width (0: not MLA)")
    q_lora_rank: int = Field(0, ge=0, description="MLA's compressed query width (0: a full query projection)")
    qk_rope_head_dim: int = Field(0, ge=0, description="MLA's rotary part of head_dim")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.num_experts:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise ValueError(f"experts_per_token={self.experts_per_token} must be in 1..num_experts="
                                 f"{self.num_experts}")
            if self.moe_intermediate_size <= 0:
                raise ValueError("moe_intermediate_size must be > 0 for a model with experts")
            if self.dense_layers >= self.num_layers:
                raise ValueError(f"dense_layers={self.dense_layers} leaves no MoE layer of {self.num_layers}")
            if self.dense_layers and self.intermediate_size <= 0:
                raise ValueError("intermediate_size must be > 0 for the dense layers of an MoE model")
        else:
            if self.intermediate_size <= 0:
                raise ValueError("a dense model (num_experts 0) needs intermediate_size > 0")
            if self.experts_per_token:
                raise ValueError(f"experts_per_token={self.experts_per_token} without experts (num_experts 0)")
        if self.num_q_heads % self.num_kv_heads and not self.kv_lora_rank:
            raise ValueError(f"num_q_heads={self.num_q_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.kv_lora_rank and self.qk_rope_head_dim >= self.head_dim:
            raise ValueError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be below head_dim={self.head_dim}")
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.dense_layers if self.is_moe else 0

    @property
    def dense_mlp_layers(self) -> int:
        return self.num_layers - self.moe_layers

    @property
    def value_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def weight_dtype_bytes(self) -> float:
        return self.weight_bytes if self.weight_bytes is not None else float(self.dtype_bytes)

    @property
    def attention_params_per_layer(self) -> int:
        """q, k, v and o projections (MLA: the low-rank query, the KV latent and its up-projection)."""
        h, hq, d, v = self.hidden_size, self.num_q_heads, self.head_dim, self.value_dim
        if self.kv_lora_rank:
            q = h * self.q_lora_rank + self.q_lora_rank * hq * d if self.q_lora_rank else h * hq * d
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * hq * (
                d - self.qk_rope_head_dim + v)
            return q + kv + hq * v * h
        return h * hq * d + 2 * h * self.num_kv_heads * d + hq * v * h

    @property
    def dense_params(self) -> int:
        """Weights every step reads and every token goes through, over all layers: attention, the
        dense MLPs, the routers and the shared experts."""
        h = self.hidden_size
        per_moe_layer = h * self.num_experts + 3 * h * self.shared_expert_intermediate_size
        return (self.num_layers * self.attention_params_per_layer + self.moe_layers * per_moe_layer
                + self.dense_mlp_layers * 3 * h * self.intermediate_size)

    @property
    def dense_params_per_layer(self) -> float:
        return self.dense_params / self.num_layers

    @property
    def expert_params(self) -> int:
        """One routed expert's gate, up and down projections."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def kv_bytes_per_token(self) -> int:
        if self.kv_lora_rank:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.dtype_bytes
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all layers: QK^T and PV, 2 FLOPs per MAC."""
        return 2 * self.num_layers * self.num_q_heads * (self.head_dim + self.value_dim)

    @property
    def total_params(self) -> int:
        embeddings = self.lm_head_params * (1 if self.tie_word_embeddings else 2)
        return self.dense_params + self.moe_layers * self.num_experts * self.expert_params + embeddings

    @property
    def active_params(self) -> int:
        """Weights one token goes through: the dense part, its experts, the LM head."""
        return self.dense_params + self.moe_layers * self.experts_per_token * self.expert_params + self.lm_head_params

    @property
    def weights_bytes(self) -> float:
        return self.total_params * self.weight_dtype_bytes


class EngineSpec(_Strict):
    """vLLM's settings the engine reproduces (the seed's launch flags and vLLM 0.22 defaults)."""

    vllm_version: str = "0.22.0"
    max_model_len: int = Field(gt=0)
    block_size: int = Field(16, gt=0)
    kv_capacity_tokens: int = Field(gt=0, description="num_gpu_blocks x block_size at gpu_memory_utilization")
    max_num_seqs: int = Field(1024, gt=0)
    max_num_batched_tokens: int = Field(DEFAULT_CHUNK_SIZE, gt=0, description="default; `sim serve` overrides it")
    long_prefill_token_threshold: int = Field(0, ge=0)
    enable_prefix_caching: bool = True
    async_scheduling: bool = True
    cuda_graphs: bool = Field(True, description="CUDA graphs FULL_AND_PIECEWISE (vLLM 0.22's default); "
                                                "false: --enforce-eager")
    cudagraph_capture_sizes: tuple[int, ...] | None = Field(
        None, description="--compilation-config cudagraph_capture_sizes (None: vLLM 0.22's default list "
                          "[1, 2, 4] + 8..248 step 8 + 256..max step 16)")
    max_cudagraph_capture_size: int | None = Field(
        None, gt=0, description="--compilation-config max_cudagraph_capture_size (None: min(2 max_num_seqs, 512), "
                                "or the largest of cudagraph_capture_sizes)")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    @model_validator(mode="before")
    @classmethod
    def _legacy_names(cls, data: object) -> object:
        # profiles written before the capture sizes were modelled name the largest size cudagraph_max_tokens
        if isinstance(data, dict) and "cudagraph_max_tokens" in data:
            data = dict(data)
            legacy = data.pop("cudagraph_max_tokens")
            data.setdefault("max_cudagraph_capture_size", legacy)
        return data

    @model_validator(mode="after")
    def _check(self) -> EngineSpec:
        if self.kv_capacity_tokens < self.block_size:
            raise ValueError(f"kv_capacity_tokens={self.kv_capacity_tokens} is below one block of {self.block_size}")
        sizes = self.cudagraph_capture_sizes
        if sizes is not None:
            if not sizes or min(sizes) < 1:
                raise ValueError(f"cudagraph_capture_sizes={list(sizes)}: needs at least one size, every size >= 1")
            if self.max_cudagraph_capture_size is not None and self.max_cudagraph_capture_size != max(sizes):
                raise ValueError(f"max_cudagraph_capture_size={self.max_cudagraph_capture_size} differs from the "
                                 f"largest of cudagraph_capture_sizes ({max(sizes)}); vLLM refuses the pair")
        return self

    def capture_sizes(self, max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None
                      ) -> tuple[int, ...]:
        """The batch sizes vLLM captures CUDA graphs for, with this engine's token budget (`cudagraph_sizes`)."""
        if not self.cuda_graphs:
            return ()
        return cudagraph_sizes(max_num_batched_tokens or self.max_num_batched_tokens,
                               max_num_seqs or self.max_num_seqs,
                               self.cudagraph_capture_sizes, self.max_cudagraph_capture_size)


class StepTimeParams(_Strict):
    """Parameters of `pdexporter.sim.steptime` (see its module docstring for the formulas).

    GPU time of a step: `fixed_ms` + rooflines of the weights and the attention at the
    efficiencies below. CPU time of a step on the engine core's main thread (schedule, prepare
    inputs, launch the forward pass, process the outputs): `cpu_us_per_token` per scheduled token
    + the launch by CUDA-graph mode (a full-graph decode step's CPU hides under its GPU time and
    is not modelled). Under async scheduling the CPU of step N+1 overlaps the GPU of step N
    (`pdexporter.sim.engine`).
    """

    fixed_ms: float = Field(ge=0, description="GPU, every step: graph replay, sampling, small kernels (ms)")
    cpu_us_per_token: float = Field(
        0.0, ge=0, description="engine-core CPU per scheduled token: block allocation, prefix-cache "
                               "registration, model-runner input preparation (us/token)")
    launch_piecewise_ms: float = Field(
        ge=0, description="CPU launch of a piecewise-graph step (a multi-token request, T <= the largest capture "
                          "size): attention runs outside the graphs (ms)")
    launch_eager_ms: float = Field(
        ge=0, description="CPU launch of a step without CUDA graphs (T above the largest capture size): every "
                          "kernel launched from Python (ms)")
    matmul_efficiency: float = Field(gt=0, le=1, description="dense GEMMs, fraction of peak")
    moe_efficiency: float = Field(gt=0, le=1, description="fused-MoE grouped GEMMs, fraction of peak")
    attention_efficiency: float = Field(gt=0, le=1, description="flash-attention prefill, fraction of peak")
    prefix_attention_efficiency: float | None = Field(
        None, gt=0, le=1, description="a prompt chunk's attention to its cached prefix (the c s pairs of a chunk of c "
                                      "tokens at position s), fraction of peak (None: attention_efficiency; SGLang's "
                                      "triton extend kernel runs it apart from the causal part, and slower)")
    piecewise_gpu_ms: float = Field(
        0.0, ge=0, description="GPU time a piecewise-graph step adds to its rooflines (ms): the attention runs "
                               "between the graphs, launched from Python, and the GPU waits on those launches "
                               "(Qwen3-8B on an H100: ~1 ms beside a few decodes, where a FULL-graph decode step "
                               "pays none); 0 unless a calibration saw piecewise steps")
    mixed_decode_us_per_chunk_token: float = Field(
        0.0, ge=0, description="GPU time each decode of a step that also carries prompt tokens adds per prompt token "
                               "beyond mixed_decode_free_tokens (us); 0 for vLLM's FlashAttention, whose varlen kernel "
                               "schedules each row by its own length; SGLang's triton extend kernel with "
                               "--enable-mixed-chunk pays it")
    mixed_decode_free_tokens: float = Field(
        0.0, ge=0, description="prompt tokens of a mixed step that cost its decodes nothing (see "
                               "mixed_decode_us_per_chunk_token)")
    bandwidth_efficiency: float = Field(gt=0, le=1, description="weight and KV streaming, fraction of HBM peak")
    moe_expert_pool: float | None = Field(
        None, gt=0, description="experts routing effectively spreads over (None: all, uniform routing)"
    )
    roofline_sharpness: float = Field(4.0, ge=1, description="p of the p-norm joining compute and memory time")
    # The decode instance of a P/D pair (docs/disaggregation.md). Projected, not calibrated: no
    # DecodeBench or 1P1D step time has been fitted yet; `sim calibrate` leaves them alone.
    kv_fill_bandwidth_efficiency: float = Field(
        0.5, gt=0, le=1, description="DecodeBenchConnector writes the admitted request's P - 1 tokens of dummy KV "
                                     "in the admitting step, at this fraction of HBM bandwidth (GPU time)")
    kv_landing_contention: float = Field(
        0.5, ge=0, le=1, description="while a KV transfer lands in this GPU's memory, each step's GPU time grows by "
                                     "this x (achieved link bandwidth / HBM bandwidth): the copy engine shares HBM")


class EngineLoopParams(_Strict):
    """Per-request costs outside the steps (`pdexporter.sim.engine` says where each one is paid).

    - `request_overhead_ms`: front end in and out (HTTP, request validation, IPC to the engine
      core, the token's way back): a latency, it blocks nothing.
    - `admit_us_per_block`: the engine core's input thread turning the request into a scheduler
      request, its prompt's block hashes included (vLLM: `EngineCore.preprocess_add_request`),
      per full 16-token prompt block; it holds the GIL, so the busy loop waits behind it.
    - `retire_us_per_token`: delivering the output batch in which a request finishes, per prompt
      token of that request; the engine keeps stepping meanwhile, so the later outputs come out
      in a burst (measured on vLLM 0.22: 3 to 5 probe tokens at once after a 32K-token prefill).
    - `idle_start_ms`: the first step after the engine sat idle (no step in flight) starts this
      much later on the GPU (the H200 answered a lone prefill ~10 ms slower than one beside
      running decodes; candidates: the GPU leaving its idle clocks, the engine core waking from
      its blocking wait on the input queue).
    """

    request_overhead_ms: float = Field(0.0, ge=0, description="front-end latency of a request, in and out (ms)")
    admit_us_per_block: float = Field(0.0, ge=0, description="engine-core admission per prompt block (us/block)")
    retire_us_per_token: float = Field(0.0, ge=0, description="output-path stall when a request finishes (us/token)")
    idle_start_ms: float = Field(0.0, ge=0, description="extra start latency of a step on an idle engine (ms)")


class HostParams(_Strict):
    """How fast the engine core's host runs its CPU work: a distribution, not one number (MODELLED).

    On the H200 machine the same launch-bound step (a lone small prefill chunk, its ~50 ms of Python
    launching kernels) took ~47-50 ms in some stretches of a sweep and ~75-90 ms in others, in runs
    of consecutive repetitions, whatever the configuration: the (virtual) host's core changed speed
    (results/h200-vllm0.22-qwen3-coder-30b-a3b/experiments/EXPERIMENTS.md, section 2). No model of
    (B, D, P) can say which episode a measurement falls in, so the profile describes the two
    states: the step_time / engine_loop CPU figures are the nominal host's, and in a slow-host
    episode every CPU cost of the engine core (launches, per-token work, admission, retirement)
    runs `slow_factor` times slower; `slow_fraction` of the configurations of the calibration's
    sweep were measured in one. The embedded engine runs the nominal host unless asked
    (`Profile.on_slow_host`, `sim serve --host-speed slow`): the nominal prediction is the likelier one
    whenever `slow_fraction` < 0.5, and the slow one says how far an unlucky measurement lands. The
    nominal host is the faster level a calibration found; where most of its sweep ran at the slow one
    (the Qwen2.5-32B's: 0.83) the slow prediction was the likelier for that campaign, while which
    level another campaign's host runs at is the host's, not the model's (docs/analysis.md)."""

    slow_factor: float = Field(1.0, ge=1.0, le=5.0, description="CPU work runs this much slower in a slow-host "
                                                                  "episode (1: the host has no such episodes)")
    slow_fraction: float = Field(0.0, ge=0.0, le=1.0, description="share of the calibration's configurations "
                                                                   "measured in a slow-host episode")

    # the CPU figures a slow host stretches: step_time's and engine_loop's
    CPU_STEP: ClassVar[tuple[str, ...]] = ("launch_eager_ms", "launch_piecewise_ms", "cpu_us_per_token")
    CPU_LOOP: ClassVar[tuple[str, ...]] = ("admit_us_per_block", "retire_us_per_token")


class KvTransferParams(_Strict):
    """The KV transfer between the two instances of a P/D pair, as the embedded engine models it:

        transfer_s(P) = fixed_ms / 1e3 + kv_bytes_per_token x P / (link_bandwidth_gb_s x 1e9 x link_efficiency)

    kv_bytes_per_token comes from the model (`ModelSpec.kv_bytes_per_token`; Qwen3-Coder-30B-A3B:
    48 layers x 4 KV heads x 128 x 2 (K, V) x 2 bytes = 96 KiB). The link's bandwidth is a
    datasheet figure; what a NIXL read reaches of it and the fixed cost are projections until a
    pair has been measured (`pdexporter decide` fits both from measured transfers). MODELLED."""

    link: str = Field("NVLink 4, same host", description="what carries the KV between the two GPUs")
    link_bandwidth_gb_s: float = Field(
        450.0, gt=0, description="one direction, GB/s (H200 SXM datasheet: NVLink 900 GB/s, both directions)")
    link_efficiency: float = Field(0.5, gt=0, le=1, description="fraction of the link a transfer reaches (projected)")
    fixed_ms: float = Field(
        5.0, ge=0, description="per transfer: descriptor setup, completion notification, the engine noticing it "
                               "(projected)")

    def seconds(self, num_tokens: int, bytes_per_token: int) -> float:
        return self.fixed_ms * 1e-3 + self.bytes(num_tokens, bytes_per_token) / (
            self.link_bandwidth_gb_s * 1e9 * self.link_efficiency)

    @staticmethod
    def bytes(num_tokens: int, bytes_per_token: int) -> int:
        return max(0, int(num_tokens)) * int(bytes_per_token)


class CalibrationCheck(_Strict):
    """A calibrated profile against the profile it started from, on the configurations held out of its fit
    (`pdexporter sim calibrate`): MAPE per quantity of the held-out table (baseline TPOT, penalty mean and
    p50, prefill duration, TPOT during the prefill, aggregate interference, TPOT over the window)."""

    base_profile: str = Field(description="the profile the fit started from")
    held_out: int = Field(ge=0, description="configurations held out of the fit and predicted (0: nothing checked)")
    tolerance: float = Field(ge=0, description="points of MAPE a quantity may get worse before the fit is refused")
    mape_fitted: dict[str, float | None] = Field(default_factory=dict, description="held-out MAPE %, this profile")
    mape_base: dict[str, float | None] = Field(default_factory=dict, description="held-out MAPE %, the base profile")
    worse: list[str] = Field(default_factory=list, description="quantities this profile predicts worse than the base "
                                                              "by more than the tolerance")
    forced: bool = Field(False, description="written although `worse` is not empty (`sim calibrate --force`)")


class ArmVariation(_Strict):
    """One arm's campaign variation as `pdexporter validate` measured it (held_out.json's
    `variation.<arm>`): the log sd of held-out errors, pooled and per regime, and what it rests on."""

    log_sd: float = Field(ge=0, allow_inf_nan=False, description="root mean square of the held-out log errors, "
                                                                  "pooled")
    by_regime: dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(
        default_factory=dict, description="the same per regime (compute, graph, launch)")
    points: int = Field(ge=0)
    points_by_regime: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    campaigns: list[str] = Field(default_factory=list, description="the GPU campaigns it was measured over")


class CampaignVariation(_Strict):
    """What moves between GPU campaigns of the real engine this profile models (issue 30): a copy of
    the variation `pdexporter validate` measured (`source`, its held_out.json), which `export-table`
    carries into the intervals of a table the embedded engine made with this profile, as
    `--campaign-variation` does for a measured one. A projection or a calibration made from a profile
    that has one **borrows** it (`borrowed_from`): its own model or GPU was never measured across
    campaigns, and the measured one is the floor of what moves (on an H100 run and on a dense model
    it covered 93–100 % of the projections' errors: `scripts/projection_coverage.py`)."""

    source: str = Field(description="the held_out.json it was copied from")
    borrowed_from: str | None = Field(
        None, description="the profile it was measured for, where this one borrows it (another model or GPU)")
    colocated: ArmVariation | None = None
    offloaded: ArmVariation | None = None

    def arms(self) -> dict[str, dict[str, object]]:
        """The arms as held_out.json's `variation` has them (`analysis.campaigns.fold_variation`)."""
        return {arm: v.model_dump(mode="json") for arm in ("colocated", "offloaded")
                if (v := getattr(self, arm)) is not None}

    def lent_by(self, profile: str) -> CampaignVariation:
        """This variation as a profile made from `profile` carries it: borrowed (from whoever measured it)."""
        return self.model_copy(update={"borrowed_from": self.borrowed_from or profile})


class Profile(_Strict):
    name: str
    description: str = ""
    calibration: Calibration
    calibration_note: str = ""
    calibration_source: str | None = None
    calibration_check: CalibrationCheck | None = Field(
        None, description="held-out errors of a calibration against its starting profile (`CalibrationCheck`)")
    provenance: dict[str, str] = Field(
        default_factory=dict, description="where each part came from: config.json, a datasheet, a measurement, a "
                                          "calibration, or a projection (what `sim profile-from-config` writes)")
    gpu: GpuSpec
    model: ModelSpec
    engine: EngineSpec
    step_time: StepTimeParams
    engine_loop: EngineLoopParams = Field(default_factory=EngineLoopParams)
    host: HostParams = Field(default_factory=HostParams)
    kv_transfer: KvTransferParams = Field(default_factory=KvTransferParams)
    campaign_variation: CampaignVariation | None = Field(
        None, description="what moves between GPU campaigns of the engine it models, measured or borrowed "
        "(`CampaignVariation`)")

    def on_slow_host(self, factor: float | None = None) -> Profile:
        """This profile in a slow-host episode: every CPU figure of the engine core x `factor`
        (default `host.slow_factor`). The GPU, the model and the front end are unchanged."""
        f = self.host.slow_factor if factor is None else factor
        if f == 1.0:
            return self
        step = {n: getattr(self.step_time, n) * f for n in HostParams.CPU_STEP}
        loop = {n: getattr(self.engine_loop, n) * f for n in HostParams.CPU_LOOP}
        return self.model_copy(update={"step_time": self.step_time.model_copy(update=step),
                                       "engine_loop": self.engine_loop.model_copy(update=loop)})

    def with_step_time(self, params: StepTimeParams, *, calibration: Calibration, note: str,
                       source: str | None = None, engine_loop: EngineLoopParams | None = None) -> Profile:
        update: dict[str, object] = {
            "step_time": params, "calibration": calibration, "calibration_note": note, "calibration_source": source,
        }
        if engine_loop is not None:
            update["engine_loop"] = engine_loop
        return self.model_copy(update=update)

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json")
        if data.get("calibration_check") is None:
            data.pop("calibration_check", None)  # a profile never calibrated by `sim calibrate` has none
        if data.get("campaign_variation") is None:
            data.pop("campaign_variation", None)
        return yaml.safe_dump(data, sort_keys=False, width=110)


PROFILES_ENV = "PDEXPORTER_PROFILES"


def user_profile_dirs() -> list[Path]:
    """Where a user's own profiles live: the directories in $PDEXPORTER_PROFILES (os.pathsep-separated),
    else $XDG_CONFIG_HOME/pdexporter/profiles (~/.config/pdexporter/profiles)."""
    env = os.environ.get(PROFILES_ENV)
    if env:
        return [Path(part).expanduser() for part in env.split(os.pathsep) if part]
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return [Path(config) / "pdexporter" / "profiles"]


@dataclass(frozen=True)
class ProfileEntry:
    name: str
    path: Path
    origin: str  # "built-in" or "user"


def list_profiles() -> list[ProfileEntry]:
    """Every profile a name can refer to: the shipped ones, then the user's (a user file with a
    shipped name is listed, but the name loads the shipped one)."""
    out = [ProfileEntry(p.stem, p, "built-in") for p in sorted(PROFILES_DIR.glob("*.yaml"))]
    for directory in user_profile_dirs():
        if directory.is_dir():
            out += [ProfileEntry(p.stem, p, "user") for p in sorted(directory.glob("*.yaml"))]
    return out


def available_profiles() -> list[str]:
    return sorted({e.name for e in list_profiles()})


def profile_path(name_or_path: str | Path, flag: str = "--profile") -> Path:
    """A profile by name (shipped first, then the user's directories), or a YAML file by path;
    `flag` names the option it came from in an error."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise ConfigError(f"{flag} {name_or_path}: no such file")
        return candidate
    for entry in list_profiles():
        if entry.name == str(name_or_path):
            return entry.path
    entries = list_profiles()
    shipped = [e.name for e in entries if e.origin == "built-in"]
    yours = [e.name for e in entries if e.origin == "user"]
    raise ConfigError(f"{flag} {name_or_path!r}: unknown profile; shipped: {', '.join(shipped)}; yours "
                      f"({os.pathsep.join(map(str, user_profile_dirs()))}): {', '.join(yours) or 'none'}")


def load_profile(name_or_path: str | Path, flag: str = "--profile") -> Profile:
    path = profile_path(name_or_path, flag)
    text = read_utf8(path, ConfigError)
    try:
        data = load_yaml_strict(text)  # no key twice, no .nan, no 5000 digits
    except YamlProblem as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from exc
    return parse_profile(data, source=str(path))


def parse_profile(data: object, *, source: str = "profile") -> Profile:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {format_validation_error(exc, Profile)}") from exc
