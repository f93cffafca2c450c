"""SGLang's H200 profile and the step-model terms it needs: the chunk's attention to its cached
prefix at its own efficiency, and the cost every decode of a mixed step pays per prompt token
(SGLang's triton extend kernel with --enable-mixed-chunk). Both are neutral unless a profile sets them."""

from __future__ import annotations

import pytest

from pdexporter.sim.profile import load_profile
from pdexporter.sim.steptime import StepComposition, StepTimeModel

SGLANG = "h200-sglang0.5.15-qwen3-coder-30b-a3b"


@pytest.fixture(scope="module")
def sglang() -> StepTimeModel:
    return StepTimeModel(load_profile(SGLANG))


@pytest.fixture(scope="module")
def vllm() -> StepTimeModel:
    return StepTimeModel(load_profile("h200-qwen3-coder-30b-a3b"))


def _with(model: StepTimeModel, **params: float | None) -> StepTimeModel:
    return StepTimeModel(model.profile, model.params.model_copy(update=params))


def test_prefix_pairs_are_the_multi_token_queries_pairs_with_their_cached_prefix():
    comp = StepComposition.of([(100, 50), (1, 4096), (8, 0)])
    assert comp.prefix_pairs == 100 * 50
    assert StepComposition.decode_batch(4, 4096).prefix_pairs == 0


def test_new_terms_are_neutral_unless_set(vllm: StepTimeModel):
    p = vllm.params
    assert p.prefix_attention_efficiency is None and p.mixed_decode_us_per_chunk_token == 0
    same = _with(vllm, prefix_attention_efficiency=p.attention_efficiency)
    for comp in (StepComposition.of([(8192, 16384)]), StepComposition.of([(8180, 8192)] + [(1, 4096)] * 12)):
        assert same.gpu_s(comp) == pytest.approx(vllm.gpu_s(comp), rel=1e-12)
        assert vllm.mixed_s(comp) == 0.0


def test_prefix_attention_efficiency_prices_only_the_pairs_with_the_prefix(vllm: StepTimeModel):
    slow = _with(vllm, prefix_attention_efficiency=vllm.params.attention_efficiency / 4)
    first, later = StepComposition.of([(8192, 0)]), StepComposition.of([(8192, 24576)])
    assert slow.gpu_s(first) == pytest.approx(vllm.gpu_s(first), rel=1e-12)  # no cached prefix
    assert slow.gpu_s(later) > 1.5 * vllm.gpu_s(later)


def test_each_decode_of_a_mixed_step_pays_per_prompt_token_beyond_the_free_ones(vllm: StepTimeModel):
    model = _with(vllm, mixed_decode_us_per_chunk_token=20.0, mixed_decode_free_tokens=200.0)
    for d in (1, 4, 12):
        comp = StepComposition.of([(8192 - d, 0)] + [(1, 4096)] * d)
        extra = model.gpu_s(comp) - vllm.gpu_s(comp)
        assert extra == pytest.approx(d * 20e-6 * (8192 - d - 200), rel=1e-9)
        assert model.mixed_s(comp) == pytest.approx(extra, rel=1e-9)
    # no decodes, no prompt tokens, or a chunk within the free tokens: nothing
    for comp in (
        StepComposition.of([(8192, 0)]),
        StepComposition.decode_batch(12, 4096),
        StepComposition.of([(150, 0), (1, 4096)]),
    ):
        assert model.gpu_s(comp) == pytest.approx(vllm.gpu_s(comp), rel=1e-12)


def test_array_form_agrees_with_the_scalar_one(sglang: StepTimeModel):
    comps = [
        StepComposition.of([(8192 - d, s)] + [(1, 4096)] * d) for d in (0, 1, 4, 12) for s in (0, 8192, 24576)
    ]
    comps += [StepComposition.decode_batch(d, 4096) for d in (1, 4, 12)] + [StepComposition.of([(512, 0)])]
    got = sglang.gpu_s_array(sglang.arrays(comps))
    assert list(got) == pytest.approx([sglang.gpu_s(c) for c in comps], rel=1e-9)


def test_sglang_profile_has_sglang_shapes(sglang: StepTimeModel, vllm: StepTimeModel):
    """What SGLang measured on the H200 (results/h200-sglang0.5.15-*): decode steps about flat in D
    (6.3-7.3 ms), prompt chunks slower than vLLM's and growing faster with their prefix, and every
    decode beside an 8K chunk adding ~150 ms, where vLLM adds next to nothing."""
    decode = [sglang.decode_step_s(d, 4200) * 1e3 for d in (1, 4, 8, 12)]
    assert max(decode) / min(decode) < 1.3 and 5.0 < min(decode) and max(decode) < 8.5
    chunks = [sglang(StepComposition.of([(8192, s)])) for s in (0, 8192, 16384, 24576)]
    vchunks = [vllm(StepComposition.of([(8192, s)])) for s in (0, 8192, 16384, 24576)]
    assert all(a > b for a, b in zip(chunks, vchunks)) and chunks[3] - chunks[0] > 2 * (
        vchunks[3] - vchunks[0]
    )
    step = [sglang(StepComposition.of([(8192 - d, 0)] + [(1, 4096)] * d)) for d in (1, 12)]
    assert 0.100 < (step[1] - step[0]) / 11 < 0.200


def test_the_embedded_engine_takes_the_imitated_engines_profile_unless_told():
    from pdexporter.engines import adapter
    from pdexporter.launch.specs import DEFAULT_SIM_PROFILE, SimLauncherSpec

    assert adapter("sglang").sim_profile == adapter("sglang-mixed").sim_profile == SGLANG
    assert adapter("vllm").sim_profile is None
    for engine, expected in (("sglang", SGLANG), ("sglang-mixed", SGLANG), ("vllm", DEFAULT_SIM_PROFILE)):
        assert SimLauncherSpec.model_validate({"kind": "sim", "engine": engine}).profile == expected
    told = SimLauncherSpec.model_validate(
        {"kind": "sim", "engine": "sglang", "profile": "h20-qwen3-coder-30b-a3b"}
    )
    assert told.profile == "h20-qwen3-coder-30b-a3b"
