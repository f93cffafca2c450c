from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdexporter.errors import ConfigError
from pdexporter.sim.profile import available_profiles, load_profile


def test_shipped_profiles_load_and_say_how_they_were_obtained():
    assert {"h20-qwen3-coder-30b-a3b", "h200-qwen3-coder-30b-a3b"} <= set(available_profiles())
    h20 = load_profile("h20-qwen3-coder-30b-a3b")
    h200 = load_profile("h200-qwen3-coder-30b-a3b")
    assert h20.calibration == "projected"
    assert h200.calibration == "calibrated"
    assert h200.calibration_source == "results/h200-vllm0.22-qwen3-coder-30b-a3b"
    assert (Path(__file__).resolve().parents[3] / h200.calibration_source / "CALIBRATION.md").is_file()
    # the H20 projection carries the H200's calibrated efficiencies and host-side costs, not its routing
    for name in ("fixed_ms", "moe_efficiency", "attention_efficiency", "bandwidth_efficiency", "launch_eager_ms",
                 "launch_piecewise_ms", "cpu_us_per_token"):
        assert getattr(h20.step_time, name) == getattr(h200.step_time, name), name
    assert h20.engine_loop == h200.engine_loop
    assert h20.step_time.moe_expert_pool is None and h200.step_time.moe_expert_pool < 128
    for p in (h20, h200):
        assert p.engine.max_model_len == 200_000 and p.engine.block_size == 16
        assert p.model.num_layers == 48 and p.model.num_experts == 128 and p.model.experts_per_token == 8
        assert 30.0e9 < p.model.total_params < 31.0e9  # Qwen3-30B-A3B
        assert p.model.kv_bytes_per_token == 48 * 2 * 4 * 128 * 2
    assert h200.engine.num_gpu_blocks == 44_597  # vllm:cache_config_info of the real H200 run
    assert h20.gpu.peak_dense_bf16_tflops == 148 and h20.gpu.hbm_bandwidth_tb_s == 4.0


def _write(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load(load_profile("h200-qwen3-coder-30b-a3b").to_yaml())
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_wrong_field_is_one_line_naming_file_and_field(tmp_path: Path):
    path = _write(tmp_path, lambda d: d["step_time"].update(fixed_ms=-1))
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    text = str(err.value)
    assert str(path) in text and "step_time.fixed_ms: must be >= 0.0 (got -1)" in text and "\n" not in text


def test_an_unknown_field_is_refused(tmp_path: Path):
    path = _write(tmp_path, lambda d: d["engine"].update(max_num_batch_tokens=8192))
    with pytest.raises(ConfigError, match=r"engine\.max_num_batch_tokens: unknown field \(did you mean "
                                          r"max_num_batched_tokens\?\)$"):
        load_profile(path)
    # nothing close: the allowed names
    path = _write(tmp_path, lambda d: d["engine"].update(zzz=1))
    with pytest.raises(ConfigError, match=r"engine\.zzz: unknown field \(expected one of: .*max_num_batched_tokens"):
        load_profile(path)


def test_unknown_profile_name_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="h20-qwen3-coder-30b-a3b"):
        load_profile("a100-nonexistent")


def test_roundtrip_yaml(tmp_path: Path):
    p = load_profile("h20-qwen3-coder-30b-a3b")
    path = tmp_path / "copy.yaml"
    path.write_text(p.to_yaml())
    assert load_profile(path) == p


def test_user_profiles_are_listed_and_found_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from pdexporter.sim.profile import PROFILES_ENV, list_profiles, user_profile_dirs

    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    monkeypatch.setenv(PROFILES_ENV, f"{mine}:{theirs}")
    assert user_profile_dirs() == [mine, theirs]
    p = load_profile("h20-qwen3-coder-30b-a3b")
    (mine / "my-h20.yaml").write_text(p.model_copy(update={"name": "my-h20"}).to_yaml())
    # a user file with a shipped name is listed, but the name keeps loading the shipped one
    (theirs / "h200-qwen3-coder-30b-a3b.yaml").write_text(p.to_yaml())
    entries = [(e.name, e.origin) for e in list_profiles()]
    assert ("my-h20", "user") in entries and ("h200-qwen3-coder-30b-a3b", "user") in entries
    assert entries.index(("h200-qwen3-coder-30b-a3b", "built-in")) < entries.index(("h200-qwen3-coder-30b-a3b", "user"))
    assert load_profile("my-h20").name == "my-h20"
    assert load_profile("h200-qwen3-coder-30b-a3b").calibration == "calibrated"
    with pytest.raises(
        ConfigError, match=r"unknown profile; shipped: .*h20-qwen3-coder-30b-a3b.*; yours \(.*\): .*my-h20"
    ):
        load_profile("nobody")
    monkeypatch.delenv(PROFILES_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert user_profile_dirs() == [tmp_path / "xdg" / "pdexporter" / "profiles"]


def test_a_slow_host_stretches_every_cpu_cost_of_the_engine_core_and_nothing_else():
    p = load_profile("h200-qwen3-coder-30b-a3b")
    assert p.host.slow_factor > 1.0 and 0 < p.host.slow_fraction < 0.5  # the H200 machine's episodes
    slow = p.on_slow_host()
    f = p.host.slow_factor
    for name in ("launch_eager_ms", "launch_piecewise_ms", "cpu_us_per_token"):
        assert getattr(slow.step_time, name) == pytest.approx(getattr(p.step_time, name) * f)
    for name in ("admit_us_per_block", "retire_us_per_token"):
        assert getattr(slow.engine_loop, name) == pytest.approx(getattr(p.engine_loop, name) * f)
    # the GPU, the front end and the idle start are not the engine core's CPU
    assert (
        slow.step_time.fixed_ms == p.step_time.fixed_ms and slow.step_time.moe_efficiency == p.step_time.moe_efficiency
    )
    assert slow.engine_loop.request_overhead_ms == p.engine_loop.request_overhead_ms
    assert slow.engine_loop.idle_start_ms == p.engine_loop.idle_start_ms
    assert p.on_slow_host(1.0) is p and slow.gpu == p.gpu and slow.model == p.model
