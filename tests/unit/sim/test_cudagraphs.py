"""CUDA-graph capture sizes and padding as vLLM 0.22 does them (FULL_AND_PIECEWISE), and what a
padded step costs in the step-time model."""

from __future__ import annotations

import pytest

from pdexporter.errors import ConfigError
from pdexporter.predict.calibrate import mixed_composition
from pdexporter.sim.engine import EngineConfig, EngineCore, ManualClock
from pdexporter.sim.profile import cudagraph_sizes, load_profile
from pdexporter.sim.steptime import StepComposition, StepTimeModel, padded_size

H200 = "h200-qwen3-coder-30b-a3b"
# results/h200-vllm0.22-qwen3-coder-30b-a3b/experiments/graphs: --compilation-config of the B=8192 run
GRAPHS_2560 = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16), 640, 768, 1024, 1280, 1536, 2048, 2560)


@pytest.fixture(scope="module")
def h200() -> StepTimeModel:
    return StepTimeModel(load_profile(H200))


def _with_engine(**update) -> object:
    prof = load_profile(H200)
    return prof.model_copy(update={"engine": prof.engine.model_copy(update=update)})


def test_default_capture_sizes_are_vllm_0_22s():
    sizes = cudagraph_sizes(8192, 1024)
    assert sizes == (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
    assert len(sizes) == 51 and sizes[-1] == 512
    # max = min(2 max_num_seqs, 512)
    assert cudagraph_sizes(8192, 4) == (1, 2, 4, 8)
    assert cudagraph_sizes(8192, 100)[-1] == 200 and 200 in cudagraph_sizes(8192, 100)
    # capped at the token budget B, which is added when it fits
    small = cudagraph_sizes(300, 1024)
    assert small[-3:] == (272, 288, 300)
    assert cudagraph_sizes(2048, 1024) == sizes


@pytest.mark.parametrize(("n", "padded"), [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8), (9, 16), (10, 16),
                                          (12, 16), (13, 16), (17, 24), (248, 248), (249, 256), (255, 256),
                                          (257, 272), (300, 304), (511, 512), (512, 512), (513, None)])
def test_padded_size_is_the_next_captured_size(n: int, padded: int | None, h200: StepTimeModel):
    assert padded_size(n, cudagraph_sizes(8192, 1024)) == padded
    decode = StepComposition.decode_batch(n, 4096)
    assert h200.padded_tokens(decode) == (padded or n)
    assert h200.graph_mode(decode) == ("full" if padded else "eager")


def _uniform_routing() -> StepTimeModel:
    """The H200 profile with real weights' routing: every token over all 128 experts."""
    prof = load_profile(H200)
    return StepTimeModel(prof.model_copy(update={"step_time": prof.step_time.model_copy(
        update={"moe_expert_pool": None})}))


def test_d10_costs_what_d12_costs_with_uniform_routing():
    """Both run the 16-token FULL graph: the same weights, the same (zero) launch; with every token
    (generated or padding) routing over all experts, only the real requests' KV reads differ (padded
    slots have sequence length 0)."""
    model = _uniform_routing()
    d8, d10, d12 = (model.breakdown(StepComposition.decode_batch(d, 4200)) for d in (8, 10, 12))
    assert d10.padded_tokens == d12.padded_tokens == 16 and d8.padded_tokens == 8
    assert d10.weights_compute_s == pytest.approx(d12.weights_compute_s, rel=0.01)  # the LM head: real rows only
    assert d10.weights_memory_s == d12.weights_memory_s and d10.experts_touched == d12.experts_touched
    assert d10.cpu_s == d12.cpu_s
    kv_two_requests = 2 * 4201 * load_profile(H200).model.kv_bytes_per_token / (
        4.8e12 * model.params.bandwidth_efficiency)
    assert d12.gpu_s - d10.gpu_s == pytest.approx(kv_two_requests, rel=0.05)
    assert abs(d12.gpu_s - d10.gpu_s) < 0.03 * d12.gpu_s  # within 3 %: what D=12 costs
    # the jump is the padding, 8 -> 16 tokens through the weights
    assert d10.weights_memory_s > d8.weights_memory_s
    assert d10.gpu_s - d8.gpu_s > 2 * (d12.gpu_s - d10.gpu_s)


def test_padded_slots_route_over_all_experts_generated_tokens_within_the_pool(h200: StepTimeModel):
    """The dummy-weight H200 profile: its generated tokens route within `moe_expert_pool` experts, the
    padded slots (stale prompt tokens in vLLM's input buffer) over all 128. So within one captured
    graph fewer real decodes cost more (measured: D=10 10.37 ms > D=12 9.6 ms, D=5 8.01 > D=8 6.03)."""
    pool = h200.params.moe_expert_pool
    assert pool is not None and pool < 128
    d10, d12, d16 = (h200.breakdown(StepComposition.decode_batch(d, 4200)) for d in (10, 12, 16))
    assert d10.padded_tokens == d12.padded_tokens == d16.padded_tokens == 16
    assert d10.experts_touched > d12.experts_touched > d16.experts_touched
    assert d10.gpu_s > d12.gpu_s > d16.gpu_s
    # the expectation: pool (1 - m_pool^n_dec m_all^n_pad) + (E - pool)(1 - m_all^n_pad), m = 1 - k / experts
    m_pool, m_all = 1 - 8 / pool, 1 - 8 / 128
    expected = pool * (1 - m_pool**10 * m_all**6) + (128 - pool) * (1 - m_all**6)
    assert d10.experts_touched == pytest.approx(expected, rel=1e-9)
    assert h200.experts_touched(16, 16) == pytest.approx(pool * (1 - m_pool**16), rel=1e-9)
    # a prefill chunk's prompt tokens route over all experts: 2048 of them touch every one
    assert h200.experts_touched(2052, 4) == pytest.approx(128, rel=1e-6)
    # with uniform routing the generated and the padded tokens are alike
    uniform = _uniform_routing()
    assert uniform.experts_touched(16, 10) == pytest.approx(uniform.experts_touched(16, 16), rel=1e-12)


def test_a_300_token_mixed_batch_costs_what_304_does(h200: StepTimeModel):
    b300, b304 = mixed_composition(296, 0, 4, 4136), mixed_composition(300, 0, 4, 4136)
    assert (b300.num_tokens, b304.num_tokens) == (300, 304)
    x, y = h200.breakdown(b300), h200.breakdown(b304)
    assert x.graph_mode == y.graph_mode == "piecewise" and x.padded_tokens == y.padded_tokens == 304
    assert x.weights_compute_s == y.weights_compute_s and x.weights_memory_s == y.weights_memory_s
    assert x.cpu_s == y.cpu_s == pytest.approx(h200.params.launch_piecewise_ms / 1e3
                                               + 304 * h200.params.cpu_us_per_token / 1e6)
    # what differs is the prefill's own attention (296 vs 300 query tokens): a fraction of a percent
    assert x.attention_compute_s < y.attention_compute_s
    assert 0 < y.gpu_s - x.gpu_s < 0.01 * y.gpu_s


def test_above_the_largest_size_no_graph_and_no_padding(h200: StepTimeModel):
    comp = mixed_composition(509, 0, 4, 4136)  # 513 tokens
    b = h200.breakdown(comp)
    assert b.graph_mode == "eager" and b.padded_tokens == 513
    assert b.cpu_s == pytest.approx(h200.params.launch_eager_ms / 1e3 + 513 * h200.params.cpu_us_per_token / 1e6)
    at_512 = h200.breakdown(mixed_composition(508, 0, 4, 4136))
    assert at_512.graph_mode == "piecewise" and at_512.padded_tokens == 512


def test_full_graphs_only_up_to_max_num_seqs():
    # max_num_seqs 6: sizes up to 12 -> [1, 2, 4, 8]; a decode of 5 pads to 8 > 6: no FULL graph of 8
    model = StepTimeModel(load_profile(H200), max_num_seqs=6)
    assert model.capture_sizes == (1, 2, 4, 8)
    assert model.graph(StepComposition.decode_batch(4, 100)) == ("full", 4)
    assert model.graph(StepComposition.decode_batch(5, 100)) == ("piecewise", 8)
    assert model.graph(StepComposition.decode_batch(9, 100)) == ("eager", 9)


def test_the_graphs_experiment_is_expressible():
    """experiments/graphs: capture sizes up to 2560 at B=8192 (a 2050-token step pads to 2560); at
    B=2048 vLLM keeps the sizes up to 2048, and refuses the list with max 2560 given too."""
    sizes_only = _with_engine(cudagraph_capture_sizes=GRAPHS_2560)
    at_8192 = StepTimeModel(sizes_only, max_num_batched_tokens=8192)
    assert at_8192.max_capture_size == 2560
    p2048 = mixed_composition(2048, 0, 2, 4136)
    assert at_8192.graph(p2048) == ("piecewise", 2560)
    assert at_8192.graph(mixed_composition(1024, 0, 4, 4136)) == ("piecewise", 1280)
    at_2048 = StepTimeModel(sizes_only, max_num_batched_tokens=2048)
    assert at_2048.max_capture_size == 2048
    assert at_2048.graph(mixed_composition(2046, 0, 2, 4136)) == ("piecewise", 2048)
    assert at_2048.graph(mixed_composition(1500, 0, 2, 4136)) == ("piecewise", 1536)
    both = _with_engine(cudagraph_capture_sizes=GRAPHS_2560, max_cudagraph_capture_size=2560)
    assert StepTimeModel(both, max_num_batched_tokens=8192).max_capture_size == 2560
    with pytest.raises(ConfigError) as err:
        StepTimeModel(both, max_num_batched_tokens=2048)
    assert "max_cudagraph_capture_size=2560" in str(err.value) and "2048" in str(err.value)
    # the engine builds its step model with its own chunk size
    engine = EngineCore(sizes_only, ManualClock(), config=EngineConfig.from_profile(sizes_only,
                                                                                    max_num_batched_tokens=2048))
    assert engine.step_model.max_capture_size == 2048  # type: ignore[attr-defined]


def test_an_inconsistent_pair_in_a_profile_is_refused(tmp_path):
    import yaml

    data = yaml.safe_load(load_profile(H200).to_yaml())
    data["engine"].update(cudagraph_capture_sizes=[1, 2, 4, 8], max_cudagraph_capture_size=1024)
    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    assert str(path) in str(err.value) and "max_cudagraph_capture_size=1024" in str(err.value)
    assert "\n" not in str(err.value)


def test_legacy_cudagraph_max_tokens_is_the_largest_size():
    data = load_profile(H200).engine.model_dump()
    data.pop("max_cudagraph_capture_size")
    data["cudagraph_max_tokens"] = 256
    engine = type(load_profile(H200).engine).model_validate(data)
    assert engine.max_cudagraph_capture_size == 256 and engine.capture_sizes()[-1] == 256


def test_eager_profile_has_no_graphs():
    model = StepTimeModel(_with_engine(cuda_graphs=False))
    assert model.capture_sizes == () and model.graph(StepComposition.decode_batch(3, 10)) == ("eager", 3)


def test_vectorised_times_equal_the_scalar_ones(h200: StepTimeModel):
    comps = [StepComposition.decode_batch(d, 4200) for d in (1, 3, 5, 10, 12, 600)]
    comps += [mixed_composition(c, s, d, 4136, last=last) for c, s, d, last in
              [(296, 0, 4, False), (2044, 6132, 4, False), (16, 8188 * 4, 4, True), (509, 0, 4, True)]]
    comps.append(StepComposition.of([]))
    arrays = h200.arrays(comps)
    assert list(h200.gpu_s_array(arrays)) == pytest.approx([h200.gpu_s(c) for c in comps], rel=1e-12)
    assert list(h200.cpu_s_array(arrays)) == pytest.approx([h200.cpu_s(c) for c in comps], rel=1e-12)
