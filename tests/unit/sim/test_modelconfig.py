"""A profile from a model's config.json: the shapes read from each architecture's fields, the GPU
from the datasheet table, what is projected and what carried over; errors in one line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pdexporter.errors import ConfigError
from pdexporter.sim.hardware import GPUS, gpu_datasheet
from pdexporter.sim.modelconfig import load_config, model_spec, profile_from_config, shipped_configs
from pdexporter.sim.profile import load_profile, parse_profile
from pdexporter.sim.steptime import StepComposition, StepTimeModel

H200 = "h200-qwen3-coder-30b-a3b"


def _config(name: str) -> dict:
    return load_config(name)[0]


@pytest.mark.parametrize(("name", "total_b", "active_b", "kv_bytes"), [
    # published sizes: Llama-3.1-8B 8.03 B, Qwen3-8B 8.2 B, Mixtral-8x7B 46.7 B (12.9 B active),
    # DeepSeek-V2-Lite 15.7 B (2.4 B active), Qwen3-Coder-30B-A3B 30.5 B (3.3 B active with embeddings)
    ("llama-3.1-8b-instruct", 8.03, 7.50, 32 * 2 * 8 * 128 * 2),
    ("qwen3-8b", 8.19, 7.57, 36 * 2 * 8 * 128 * 2),
    ("mixtral-8x7b-instruct", 46.70, 12.75, 32 * 2 * 8 * 128 * 2),
    ("deepseek-v2-lite-chat", 15.71, 2.45, 27 * (512 + 64) * 2),  # MLA: the latent and the rotary key
    ("qwen3-coder-30b-a3b", 30.53, 3.04, 48 * 2 * 4 * 128 * 2),
])
def test_shipped_configs_give_the_published_sizes(name: str, total_b: float, active_b: float, kv_bytes: int):
    model = model_spec(_config(name), name=name)
    assert model.total_params / 1e9 == pytest.approx(total_b, abs=0.01)
    assert model.active_params / 1e9 == pytest.approx(active_b, abs=0.01)
    assert model.kv_bytes_per_token == kv_bytes
    assert set(shipped_configs()) >= {name}


def test_architectures_read_their_own_fields():
    llama = model_spec(_config("llama-3.1-8b-instruct"))
    assert not llama.is_moe and llama.intermediate_size == 14336 and llama.head_dim == 128
    assert llama.num_kv_heads == 8 and llama.moe_layers == 0 and llama.dense_mlp_layers == 32
    mixtral = model_spec(_config("mixtral-8x7b-instruct"))  # every MLP is 8 experts of intermediate_size
    assert (mixtral.num_experts, mixtral.experts_per_token, mixtral.moe_intermediate_size) == (8, 2, 14336)
    assert mixtral.intermediate_size == 0 and mixtral.moe_layers == 32
    deepseek = model_spec(_config("deepseek-v2-lite-chat"))  # first layer dense, 2 shared experts
    assert deepseek.dense_layers == 1 and deepseek.moe_layers == 26 and deepseek.intermediate_size == 10944
    assert deepseek.shared_expert_intermediate_size == 2 * 1408 and deepseek.kv_lora_rank == 512
    assert deepseek.head_dim == 128 + 64 and deepseek.value_dim == 128
    qwen_moe = model_spec(_config("qwen3-coder-30b-a3b"))
    assert qwen_moe.intermediate_size == 0  # stated by Qwen3-MoE's config, used by no layer
    cfg = _config("qwen3-coder-30b-a3b") | {"mlp_only_layers": [0, 1]}
    assert model_spec(cfg).dense_layers == 2 and model_spec(cfg).intermediate_size == 6144
    sparse_step = _config("qwen3-coder-30b-a3b") | {"decoder_sparse_step": 2}
    assert model_spec(sparse_step).moe_layers == 24


def test_the_moe_config_reproduces_the_calibrated_profiles_model():
    shipped = load_profile(H200)
    spec = model_spec(_config("qwen3-coder-30b-a3b"), name="qwen3-coder-30b-a3b")
    assert spec == shipped.model
    projected = profile_from_config(_config("qwen3-coder-30b-a3b"), "H200", model_name="qwen3-coder-30b-a3b",
                                    dummy_weights=True, max_model_len=200_000, carry_from=H200)
    # the KV capacity from memory: within 0.1 % of the 44,597 blocks a real vLLM 0.22 gave this model
    assert projected.engine.kv_capacity_tokens == pytest.approx(shipped.engine.kv_capacity_tokens, rel=1e-3)
    assert projected.step_time.moe_expert_pool == pytest.approx(shipped.step_time.moe_expert_pool)
    # same shapes, same GPU, same layer count: the projection times steps as the calibration does (up to the
    # measured-GEMM matmul efficiency, 790/989 against the profile's rounded 0.8)
    a, b = StepTimeModel(projected), StepTimeModel(shipped)
    for comp in (StepComposition.decode_batch(6, 4200), StepComposition.of([(8180, 0)] + [(1, 4200)] * 12)):
        assert a.gpu_s(comp) == pytest.approx(b.gpu_s(comp), rel=0.01) and a.cpu_s(comp) == b.cpu_s(comp)


def test_a_projection_says_what_is_projected_and_what_carried_over():
    cfg, source = load_config("llama-3.1-8b-instruct")
    prof = profile_from_config(cfg, "H100", model_name="llama-3.1-8b-instruct", source=source, carry_from=H200)
    assert prof.calibration == "projected" and prof.calibration_note.startswith("PROJECTED, never measured")
    assert prof.name == "h100-llama-3.1-8b-instruct" and prof.model.name == "llama-3.1-8b-instruct"
    assert set(prof.provenance) == {"model", "gpu", "engine", "step_time", "engine_loop", "host", "kv_transfer",
                                    "checked"}
    assert prof.provenance["model"].startswith("config.json (pdexporter/sim/configs/llama-3.1-8b-instruct.json)")
    assert prof.provenance["gpu"].startswith("datasheet: NVIDIA H100") and "PROJECTED" in prof.provenance["engine"]
    assert prof.gpu.hbm_bandwidth_tb_s == 3.35 and prof.gpu.source.startswith("datasheet")
    ref = load_profile(H200)
    # host costs and efficiencies carried over; what grows with the kernels of a step scaled by layers
    assert prof.step_time.moe_efficiency == ref.step_time.moe_efficiency
    assert prof.step_time.launch_eager_ms == pytest.approx(ref.step_time.launch_eager_ms * 32 / 48)
    assert prof.step_time.fixed_ms == pytest.approx(ref.step_time.fixed_ms * 32 / 48)
    assert prof.engine_loop == ref.engine_loop and prof.host == ref.host
    assert prof.engine.max_model_len == 131072  # max_position_embeddings, below the KV capacity
    # capacity: (0.9 x 79.6 GiB - 15.0 GiB of weights - 4.2 GiB) / 128 KiB, in whole blocks
    kv_gib = 0.9 * 79.6 - prof.model.weights_bytes / 2**30 - 4.2
    assert prof.engine.kv_capacity_tokens == pytest.approx(kv_gib * 2**30 / 131072, abs=16)
    # it round-trips through YAML and runs: a decode step of an 8B dense model on an H100, GPU-bound
    back = parse_profile(json.loads(prof.model_dump_json()))
    assert back == prof
    model = StepTimeModel(prof)
    d1 = model.decode_step_s(1, 4096)
    assert 16e9 / 3.35e12 < d1 < 16e9 / 3.35e12 * 2  # about the weights' read at HBM speed


def test_fp8_weights_read_half_the_bytes_and_use_fp8_peaks_where_the_gpu_has_them():
    cfg = _config("qwen3-8b") | {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    bf16, fp8 = model_spec(_config("qwen3-8b")), model_spec(cfg)
    assert fp8.weight_dtype_bytes == 1.0 and bf16.weight_dtype_bytes == 2.0
    assert fp8.weights_bytes == pytest.approx(bf16.weights_bytes / 2)
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token  # the KV cache stays 16-bit
    h200_8, h200_16 = (StepTimeModel(profile_from_config(c, "H200")) for c in (cfg, _config("qwen3-8b")))
    chunk = StepComposition.of([(8192, 0)])
    assert h200_8.breakdown(chunk).weights_compute_s == pytest.approx(h200_16.breakdown(chunk).weights_compute_s / 2,
                                                                      rel=0.02)
    a100_8, a100_16 = (StepTimeModel(profile_from_config(c, "A100")) for c in (cfg, _config("qwen3-8b")))
    # no FP8 tensor cores: the same maths time, half the weight reads
    assert a100_8.breakdown(chunk).weights_compute_s == pytest.approx(a100_16.breakdown(chunk).weights_compute_s)
    assert a100_8.breakdown(StepComposition.decode_batch(1, 10)).weights_memory_s == pytest.approx(
        a100_16.breakdown(StepComposition.decode_batch(1, 10)).weights_memory_s / 2, rel=0.02)
    awq = _config("qwen3-8b") | {"quantization_config": {"quant_method": "awq", "bits": 4}}
    assert model_spec(awq).weight_dtype_bytes == 0.5


def test_a_multimodal_config_reads_its_text_config():
    wrapped = {"architectures": ["SomeVLForConditionalGeneration"], "text_config": _config("qwen3-8b"),
               "vision_config": {"hidden_size": 1152}}
    spec = model_spec(wrapped)
    assert spec.architecture == "SomeVLForConditionalGeneration" and spec.num_layers == 36


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda c: c.pop("num_hidden_layers"), "field 'num_hidden_layers' is missing"),
    (lambda c: c.update(hidden_size="4096"), "field 'hidden_size' = '4096': expected a non-negative integer"),
    (lambda c: c.pop("intermediate_size"), "field 'intermediate_size' is missing"),
    (lambda c: c.update(quantization_config={"quant_method": "mystery"}), "quant_method 'mystery'"),
    (lambda c: c.update(num_experts=8), "num_experts_per_tok"),
])
def test_a_bad_config_is_one_line_naming_the_file_and_field(mutate, expected: str):
    cfg = copy.deepcopy(_config("qwen3-8b"))
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        model_spec(cfg, source="my/config.json")
    assert str(err.value).startswith("my/config.json: ") and expected in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_gpu_unreadable_file_and_a_model_too_big_are_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="unknown GPU; known: H200, H100, H20, A100, L40S"):
        gpu_datasheet("B200")
    assert gpu_datasheet("nvidia h100-sxm") is GPUS["H100"] and gpu_datasheet("h200").fp8_tflops == 1979.0
    with pytest.raises(ConfigError, match="does not fit one H100"):
        profile_from_config(_config("mixtral-8x7b-instruct"), "H100")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not a JSON config"):
        load_config(tmp_path)  # a folder holding config.json
    with pytest.raises(ConfigError, match="no such config.json"):
        load_config(tmp_path / "missing.json")
    for sheet in GPUS.values():  # every figure is marked with where it comes from
        assert sheet.describe().startswith("datasheet: ") and sheet.bf16_tflops > 0 and sheet.hbm_tb_s > 0


# ---------------------------------------------------------------------------------------------
# vLLM's fused-MoE kernel: tuned on some GPUs for some shapes, a default configuration elsewhere


def test_tuned_moe_config_reads_the_shapes_vllm_ships_per_device() -> None:
    from pdexporter.engines.vllm import tuned_moe_config

    assert tuned_moe_config(128, 768, "H200") is True  # Qwen3-30B-A3B's shape: tuned on the H200 ...
    assert tuned_moe_config(128, 768, "h100") is False  # ... not on the H100 (the engine's log said so)
    assert tuned_moe_config(128, 768, "H20") is True
    assert tuned_moe_config(8, 14336, "H100") is False and tuned_moe_config(8, 14336, "H200") is True  # Mixtral
    assert tuned_moe_config(128, 768, "B300") is None  # a GPU vLLM's files do not name


def test_a_moe_projection_to_a_gpu_without_vllms_tuned_kernel_says_so() -> None:
    cfg = _config("qwen3-coder-30b-a3b")
    h100 = profile_from_config(cfg, "H100", carry_from="h200-qwen3-coder-30b-a3b", dummy_weights=True)
    line = h100.provenance["moe_kernel"]
    assert line.startswith("UNTUNED") and "E=128,N=768 on H100" in line and "where H200 has one" in line
    assert "WARNING: UNTUNED" in h100.calibration_note
    h200 = profile_from_config(cfg, "H200", carry_from="h200-qwen3-coder-30b-a3b", dummy_weights=True)
    assert "ships a tuned" in h200.provenance["moe_kernel"] and "WARNING" not in h200.calibration_note
    dense = profile_from_config(_config("llama-3.1-8b-instruct"), "H100", carry_from="h200-llama-3.1-8b-instruct")
    assert "moe_kernel" not in dense.provenance


def test_every_shipped_config_is_named_where_users_read_the_list() -> None:
    """`sim profile-from-config --help` and docs/sim.md list the shipped configs by name (the help by hand: building it
    from the folder would import numpy and pydantic into every `sim` command's start); a config added without
    them (as Llama-3.2-3B nearly was) fails here."""
    import inspect

    from pdexporter.cli import sim as sim_cli

    help_text = inspect.getsource(sim_cli.profile_from_config_cmd)
    docs = (Path(__file__).resolve().parents[3] / "docs" / "sim.md").read_text()
    for name in shipped_configs():
        assert f"{name}," in help_text or f"{name}." in help_text, name
        assert f"`{name}`" in docs, name
