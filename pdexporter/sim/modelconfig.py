"""A profile for any model from its Hugging Face `config.json`, on any GPU the step model knows.

`model_spec(config)` reads the shapes the step-time model needs (`ModelSpec`) from the fields the
common architectures use:

| what | fields read |
|---|---|
| layers, width, vocabulary | `num_hidden_layers`, `hidden_size`, `vocab_size`, `tie_word_embeddings` |
| attention (GQA) | `num_attention_heads`, `num_key_value_heads` (default: the heads), `head_dim` (default: hidden / heads) |
| attention (MLA, DeepSeek) | `kv_lora_rank`, `q_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim` |
| dense MLP (Llama, Qwen2, Qwen3) | `intermediate_size` |
| experts (Qwen3-MoE, Qwen2-MoE) | `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `shared_expert_intermediate_size`, `mlp_only_layers`, `decoder_sparse_step` |
| experts (Mixtral) | `num_local_experts`, `num_experts_per_tok`, `intermediate_size` (an expert's width) |
| experts (DeepSeek V2/V3) | `n_routed_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `n_shared_experts`, `first_k_dense_replace`, `moe_layer_freq` |
| weights | `torch_dtype` / `dtype` (activations and KV cache: 2 bytes, as vLLM serves float32 checkpoints in 16 bits), `quantization_config` (FP8: 1 byte a weight; 4-bit AWQ/GPTQ: 0.5) |

A multimodal config's `text_config` is read in its place. A field that is missing or of the wrong
type is one line naming the file and the field (`ConfigError`).

`profile_from_config(config, gpu)` builds a whole profile: the model from the config, the GPU from
the datasheet table (`sim.hardware`), the step-time efficiencies, CPU costs, engine-loop costs and
host distribution carried over from a calibrated profile (the H200's by default), with the costs
that scale with the number of layers (the per-step fixed GPU time, the kernel launches) scaled by
layer count, and the KV capacity from memory. Its `calibration` is `projected` and its
`provenance` says, part by part, what came from config.json, what from a datasheet and what from
a calibration elsewhere: a projection until `pdexporter sim calibrate` fits it to a sweep of the
model on the GPU.
"""  # noqa: E501 (verbatim data)

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pdexporter.engines import DEFAULT_CHUNK_SIZE, DEFAULT_MOE_CONFIG_LOG, tuned_moe_config
from pdexporter.errors import ConfigError
from pdexporter.sim.hardware import gpu_datasheet
from pdexporter.sim.profile import (
    PROFILES_DIR,
    CampaignVariation,
    EngineSpec,
    KvTransferParams,
    ModelSpec,
    Profile,
    StepTimeParams,
    load_profile,
)
from pdexporter.sim.projection import REFERENCES, calibrated, project_step_time
from pdexporter.sim.projection_checks import checked_line

__all__ = [
    "ACTIVATION_GIB",
    "CARRY_FROM",
    "CONFIGS_DIR",
    "load_config",
    "model_spec",
    "profile_from_config",
    "references",
    "shipped_configs",
]

CONFIGS_DIR = Path(__file__).with_name("configs")
CARRY_FROM = "h200-qwen3-coder-30b-a3b"  # the calibrated profile whose efficiencies a projection carries over
# activations, CUDA graphs and the sampler's buffers at gpu_memory_utilization, on top of the weights
# (the H200 profile: 0.9 x 140.4 GiB - 56.9 GiB of weights - 4.2 GiB = the 68.1 GiB vLLM gave the KV cache)
ACTIVATION_GIB = 4.2
_QUANT_BYTES = {
    "fp8": 1.0,
    "fbgemm_fp8": 1.0,
    "modelopt": 1.0,
    "compressed-tensors": 1.0,
    "awq": 0.5,
    "gptq": 0.5,
    "awq_marlin": 0.5,
    "gptq_marlin": 0.5,
    "bitsandbytes": 0.5,
}


def _short(source: str) -> str:
    """A shipped config by its path inside the package, another by the path given."""
    path = Path(source)
    if path.parent.resolve() == CONFIGS_DIR.resolve():
        return f"pdexporter/sim/configs/{path.name}"
    return source


def shipped_configs() -> dict[str, Path]:
    """config.json files of models teams serve, written from their published shapes (no weights)."""
    return {p.stem: p for p in sorted(CONFIGS_DIR.glob("*.json"))}


def load_config(path_or_name: str | Path) -> tuple[dict[str, Any], str]:
    """(config, source): a config.json by path, or a shipped one by name (`shipped_configs`)."""
    path = Path(path_or_name)
    if not path.exists() and str(path_or_name) in shipped_configs():
        path = shipped_configs()[str(path_or_name)]
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        known = ", ".join(shipped_configs())
        raise ConfigError(f"{path_or_name}: no such config.json (shipped: {known})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a JSON config ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    return data, str(path)


def _int(cfg: Mapping[str, Any], name: str, source: str, default: int | None = None) -> int:
    value = cfg.get(name, default)
    if value is None:
        raise ConfigError(f"{source}: field {name!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{source}: field {name!r} = {value!r}: expected a non-negative integer")
    return value


def _weight_bytes(cfg: Mapping[str, Any], source: str) -> float | None:
    quant = cfg.get("quantization_config")
    if not quant:
        return None
    if not isinstance(quant, Mapping):
        raise ConfigError(f"{source}: field 'quantization_config' = {quant!r}: expected an object")
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits") or quant.get("w_bit")
    if isinstance(bits, int) and bits in (4, 8):
        return bits / 8
    if method in _QUANT_BYTES:
        return _QUANT_BYTES[method]
    raise ConfigError(
        f"{source}: quantization_config.quant_method {method!r} is not known to the step model "
        f"(known: {', '.join(sorted(_QUANT_BYTES))}, or a `bits` of 4 or 8)"
    )


def model_spec(
    config: Mapping[str, Any], *, name: str | None = None, source: str = "config.json"
) -> ModelSpec:
    """The step model's shapes of a Hugging Face config (module docs for the fields read)."""
    cfg: Mapping[str, Any] = config
    if isinstance(config.get("text_config"), Mapping):
        cfg = {**config["text_config"], "architectures": config.get("architectures")}
    archs = cfg.get("architectures") or [cfg.get("model_type") or "unknown"]
    arch = str(archs[0]) if isinstance(archs, list) and archs else str(archs)
    layers = _int(cfg, "num_hidden_layers", source)
    hidden = _int(cfg, "hidden_size", source)
    heads = _int(cfg, "num_attention_heads", source)
    kv_heads = _int(cfg, "num_key_value_heads", source, heads)
    vocab = _int(cfg, "vocab_size", source)
    if min(layers, hidden, heads, kv_heads, vocab) == 0:
        raise ConfigError(f"{source}: layers, hidden_size, heads and vocab_size must all be > 0")
    kv_lora = _int(cfg, "kv_lora_rank", source, 0) if cfg.get("kv_lora_rank") is not None else 0
    rope = nope = v_dim = q_lora = 0
    if kv_lora:
        rope = _int(cfg, "qk_rope_head_dim", source)
        nope = _int(cfg, "qk_nope_head_dim", source)
        v_dim = _int(cfg, "v_head_dim", source)
        q_lora = _int(cfg, "q_lora_rank", source, 0) if cfg.get("q_lora_rank") is not None else 0
        head_dim = nope + rope
    else:
        head_dim = (
            _int(cfg, "head_dim", source, hidden // heads)
            if cfg.get("head_dim") is not None
            else hidden // heads
        )
    experts = 0
    for field in ("num_experts", "num_local_experts", "n_routed_experts"):
        if cfg.get(field):
            experts = _int(cfg, field, source)
            break
    intermediate = (
        _int(cfg, "intermediate_size", source, 0) if cfg.get("intermediate_size") is not None else 0
    )
    top_k = moe_width = shared = dense_layers = 0
    if experts:
        top_k = _int(cfg, "num_experts_per_tok", source)
        if cfg.get("moe_intermediate_size"):
            moe_width = _int(cfg, "moe_intermediate_size", source)
        else:  # Mixtral: every MLP is the experts, intermediate_size wide each
            moe_width, intermediate = intermediate, 0
        if not moe_width:
            raise ConfigError(f"{source}: field 'moe_intermediate_size' (or 'intermediate_size') is missing")
        if cfg.get("shared_expert_intermediate_size"):
            shared = _int(cfg, "shared_expert_intermediate_size", source)
        elif cfg.get("n_shared_experts"):
            shared = _int(cfg, "n_shared_experts", source) * moe_width
        first_dense = _int(cfg, "first_k_dense_replace", source, 0) if cfg.get("first_k_dense_replace") else 0
        mlp_only = cfg.get("mlp_only_layers") or []
        if not isinstance(mlp_only, list):
            raise ConfigError(
                f"{source}: field 'mlp_only_layers' = {mlp_only!r}: expected a list of layer indices"
            )
        step = int(cfg.get("decoder_sparse_step") or cfg.get("moe_layer_freq") or 1)
        sparse = [i for i in range(layers) if i >= first_dense and i not in mlp_only and (i + 1) % step == 0]
        dense_layers = layers - len(sparse)
        if dense_layers and not intermediate:
            raise ConfigError(f"{source}: {dense_layers} dense layer(s) but no 'intermediate_size'")
        if not dense_layers:
            intermediate = 0  # Qwen3-MoE states one, for no layer
    elif not intermediate:
        raise ConfigError(f"{source}: field 'intermediate_size' is missing (a dense model's MLP width)")
    return ModelSpec(
        name=name or str(cfg.get("_name_or_path") or arch).rsplit("/", 1)[-1].lower(),
        architecture=arch,
        num_layers=layers,
        hidden_size=hidden,
        num_q_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        num_experts=experts,
        experts_per_token=top_k,
        moe_intermediate_size=moe_width,
        intermediate_size=intermediate,
        dense_layers=dense_layers,
        shared_expert_intermediate_size=shared,
        vocab_size=vocab,
        dtype_bytes=2,
        weight_bytes=_weight_bytes(cfg, source),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        v_head_dim=v_dim or None,
        kv_lora_rank=kv_lora,
        q_lora_rank=q_lora,
        qk_rope_head_dim=rope,
    )


def references(carry_from: Profile | str | Sequence[Profile | str] | None = None) -> list[Profile]:
    """The reference profiles of a projection: those given, else the shipped calibrated ones
    (`projection.REFERENCES`, those still projected skipped)."""
    if carry_from is None:
        refs = [load_profile(CARRY_FROM)]
        for name in REFERENCES:
            if name != CARRY_FROM and (PROFILES_DIR / f"{name}.yaml").is_file():
                prof = load_profile(PROFILES_DIR / f"{name}.yaml")
                if calibrated(prof):
                    refs.append(prof)
        return refs
    items = [carry_from] if isinstance(carry_from, (str, Profile)) else list(carry_from)
    if not items:
        raise ConfigError("a projection needs at least one reference profile")
    return [load_profile(p, "--from") if isinstance(p, str) else p for p in items]


def lent_variation(refs: Sequence[Profile]) -> CampaignVariation | None:
    """The campaign variation a projection borrows: the first reference's that has one
    (`CampaignVariation.lent_by`); None where no reference has one."""
    return next((r.campaign_variation.lent_by(r.name) for r in refs if r.campaign_variation is not None), None)


def moe_kernel_line(model: ModelSpec, gpu: str, ref: Profile) -> str:
    """What a MoE projection assumes of vLLM's fused-MoE kernel on `gpu` ("" for a dense model): a tuned
    configuration where vLLM 0.22 ships one for the model's (experts, width) on that GPU, else the default
    Triton configuration, whose expert GEMMs the carried `moe_efficiency` (of `ref`'s GPU) overstates."""
    if not model.is_moe:
        return ""
    shape = f"E={model.num_experts},N={model.moe_intermediate_size}"
    here = tuned_moe_config(model.num_experts, model.moe_intermediate_size, gpu)
    there = tuned_moe_config(model.num_experts, model.moe_intermediate_size, ref.gpu.name)
    if here is None:
        return f"vLLM 0.22 names no tuned fused-MoE configuration file for {gpu}: whether {shape} is tuned is unknown"
    if here:
        return f"vLLM 0.22 ships a tuned bf16 fused-MoE configuration for {shape} on {gpu}"
    return (f"UNTUNED: vLLM 0.22 ships no bf16 fused-MoE configuration for {shape} on {gpu} (its log: "
            f"\"{DEFAULT_MOE_CONFIG_LOG}\"){'' if not there else f', where {ref.gpu.name} has one'}: the expert "
            "GEMMs run a default Triton configuration and moe_efficiency, carried, is optimistic (Qwen3-Coder-30B-A3B "
            "measured on an H100: prefill durations 14 % and aggregate interference 24 % above such a projection, "
            "median; results/h100-vllm0.22-qwen3-coder-30b-a3b-passive-spread)")


def profile_from_config(
    config: Mapping[str, Any],
    gpu: str,
    *,
    name: str | None = None,
    model_name: str | None = None,
    source: str = "config.json",
    carry_from: Profile | str | Sequence[Profile | str] | None = None,
    max_model_len: int | None = None,
    max_num_batched_tokens: int = DEFAULT_CHUNK_SIZE,
    gpu_memory_utilization: float = 0.9,
    dummy_weights: bool = False,
    rule: str = "learned",
) -> Profile:
    """A projected profile: the model of `config` on `gpu` (module docs). `carry_from`: the calibrated
    reference profile(s) (default: the shipped calibrated ones, `projection.REFERENCES`); the first
    one's host, engine settings and engine loop are carried (under the learned rule the engine loop's
    two latencies from the references of the model's kind). `rule` "learned" takes each step-time
    parameter by what it prices (`pdexporter.sim.projection`); "carry" is the rule before issue 36
    (the first reference's efficiencies and engine loop, layer costs scaled by layers). `dummy_weights` keeps the
    calibrated profile's routing of generated tokens (a fraction of the experts, as vLLM's
    `--load-format dummy` weights route); else generated tokens route over all experts as real
    weights do."""
    if rule not in ("learned", "carry"):
        raise ConfigError(f"--rule {rule!r}: must be learned or carry")
    model = model_spec(config, name=model_name, source=source)
    sheet = gpu_datasheet(gpu)
    refs = references(carry_from)
    ref = refs[0]
    layers = model.num_layers / ref.model.num_layers
    weights_gib = model.weights_bytes / 2**30
    kv_gib = gpu_memory_utilization * sheet.memory_gib - weights_gib - ACTIVATION_GIB
    if kv_gib <= 0:
        raise ConfigError(
            f"{source}: {model.name} does not fit one {sheet.name}: {weights_gib:.1f} GiB of weights + "
            f"{ACTIVATION_GIB} GiB of activations > {gpu_memory_utilization} x {sheet.memory_gib} GiB "
            "(tensor parallelism is not modelled)"
        )
    block = ref.engine.block_size
    capacity = int(kv_gib * 2**30 / model.kv_bytes_per_token) // block * block
    position_limit = config.get("max_position_embeddings") or (config.get("text_config") or {}).get(
        "max_position_embeddings"
    )
    max_len = max_model_len or min(int(position_limit or capacity), capacity)
    pool = None
    if model.is_moe and dummy_weights and ref.step_time.moe_expert_pool and ref.model.num_experts:
        pool = max(
            float(model.experts_per_token),
            ref.step_time.moe_expert_pool / ref.model.num_experts * model.num_experts,
        )
    st = ref.step_time
    step_time = StepTimeParams(
        **{
            **st.model_dump(),
            "fixed_ms": st.fixed_ms * layers,
            "launch_eager_ms": st.launch_eager_ms * layers,
            "launch_piecewise_ms": st.launch_piecewise_ms * layers,
            "matmul_efficiency": (
                min(1.0, sheet.matmul_tflops / sheet.bf16_tflops)
                if sheet.matmul_tflops
                else st.matmul_efficiency
            ),
            "moe_expert_pool": pool,
        }
    )
    learned = None
    if rule == "learned":
        learned = project_step_time(model, refs, measured_gemm_efficiency=(
            min(1.0, sheet.matmul_tflops / sheet.bf16_tflops) if sheet.matmul_tflops else None))
        step_time = step_time.model_copy(update=learned.values)
    engine = EngineSpec(
        **{
            **ref.engine.model_dump(),
            "max_model_len": max_len,
            "kv_capacity_tokens": capacity,
            "max_num_batched_tokens": max_num_batched_tokens,
            "gpu_memory_utilization": gpu_memory_utilization,
        }
    )
    kv_transfer = KvTransferParams(
        **{
            **ref.kv_transfer.model_dump(),
            "link": f"{sheet.link} ({sheet.name})",
            "link_bandwidth_gb_s": sheet.link_gb_s,
        }
    )
    carried = f"carried over from {ref.name} (calibration: {ref.calibration})"
    provenance = {
        "model": f"config.json ({_short(source)}): {model.architecture}, {model.num_layers} layers, "
        f"{model.total_params / 1e9:.2f} B parameters ({model.active_params / 1e9:.2f} B active), "
        f"{model.weight_dtype_bytes:g} byte(s) a weight, KV {model.kv_bytes_per_token / 1024:g} KiB a token",
        "gpu": sheet.describe(),
        "engine": f"vLLM 0.22 defaults as in {ref.name}; kv_capacity_tokens PROJECTED: ({gpu_memory_utilization} x "
        f"{sheet.memory_gib} GiB - {weights_gib:.1f} GiB weights - {ACTIVATION_GIB} GiB activations) / "
        f"KV bytes per token; max_model_len min(max_position_embeddings, capacity)",
        "step_time": f"efficiencies (moe, attention, bandwidth, roofline) and cpu_us_per_token {carried}; "
        f"fixed_ms, launch_eager_ms, launch_piecewise_ms x {model.num_layers}/{ref.model.num_layers} "
        "layers (kernels per step) PROJECTED; matmul_efficiency "
        + ("from the measured GEMM" if sheet.matmul_tflops else carried)
        + "; moe_expert_pool "
        + (
            f"{pool:.1f}: the dummy weights' fraction of experts, {carried}"
            if pool
            else "all experts (real weights' routing)"
        ),
        **({"step_time": f"PROJECTED, {learned.provenance}; cpu_us_per_token, roofline and the P/D figures "
                          f"{carried}; moe_expert_pool "
                          + (f"{pool:.1f}: the dummy weights' fraction of experts" if pool else "all experts")}
           if learned is not None else {}),
        "engine_loop": (f"{carried}: host and vLLM costs (front end, admission, retirement, idle start), PROJECTED"
                        if learned is None else
                        f"PROJECTED, {learned.engine_loop_provenance}; admit_us_per_block, "
                        f"retire_us_per_token {carried}"),
        "host": f"{carried}: the slow-host episodes of that machine, PROJECTED",
        "kv_transfer": f"link bandwidth from the datasheet; efficiency and fixed cost {carried}, PROJECTED",
    }
    kernel = moe_kernel_line(model, sheet.name, ref)
    if kernel:
        provenance["moe_kernel"] = kernel
    provenance["checked"] = checked_line(sheet.name, besides=model.name) + ("" if learned is not None else
                                                         "; this profile used the carry rule, which they did not score")
    note = (
        f"PROJECTED, never measured: {model.name} ({model.architecture}) on one {sheet.name}, from its "
        f"config.json (shapes) and the {sheet.name} datasheet (peaks, bandwidth, memory), with the fractions of "
        f"peak, the host's CPU costs and the engine-loop costs {carried}. The hypothesis: vLLM's kernels reach "
        f"the same fraction of this GPU's peaks for this model's shapes, and the host's Python costs scale with "
        f"the kernels a step launches (layers). `pdexporter sim calibrate` on a sweep of this model on this GPU "
        f"replaces the projection with a calibration."
    ) + (f" WARNING: {kernel}" if kernel.startswith("UNTUNED") else "") + f" Checked: {provenance['checked']}."
    return Profile(
        name=name or f"{sheet.name.lower()}-{model.name}",
        description=f"One NVIDIA {sheet.name} serving {model.name} ({model.architecture}) with vLLM "
        f"{engine.vllm_version}: TP=1, prefix caching, chunked prefill, async scheduling, CUDA graphs "
        f"FULL_AND_PIECEWISE, max_num_batched_tokens {max_num_batched_tokens}.",
        calibration="projected",
        calibration_note=note,
        calibration_source=None,
        provenance=provenance,
        gpu=sheet.spec(),
        model=model,
        engine=engine,
        step_time=step_time,
        engine_loop=ref.engine_loop if learned is None else ref.engine_loop.model_copy(update=learned.engine_loop),
        host=ref.host,
        kv_transfer=kv_transfer,
        campaign_variation=lent_variation(refs),
    )
