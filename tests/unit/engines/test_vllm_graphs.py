"""vLLM's CUDA-graph sizes read from its command line (`engines.vllm.graph_max_tokens_of`), and the fit's chunk
rule following the records that say them (`analysis.models.fit_data`)."""

from __future__ import annotations

import json

import pytest

from pdexporter.analysis import models as md
from pdexporter.analysis.decision_eval import chunk_context, graph_step_tokens, padded_graph_tokens
from pdexporter.analysis.synthetic import SyntheticTruth, synthetic_records
from pdexporter.analysis.table import build_table, samples_from_record
from pdexporter.engines import adapter
from pdexporter.engines.vllm import (  # the rule itself, tested where it lives
    compilation_config_of,
    graph_max_tokens_of,
    graph_sizes_of,
)

# the engine A/B's `b` flags (results/h100-vllm0.22-qwen3-coder-30b-a3b-engine-ab)
SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16), 528, 1040, 2064]
B_FLAGS = ["--compilation-config", json.dumps({"cudagraph_capture_sizes": SIZES})]
SERVE = ["vllm", "serve", "/models/qwen3", "--max-num-batched-tokens", "8192"]
# sweeps/h200-seed-graphs.yaml's: 2048 too, so B = 2048's full chunk steps are graphs as well
GRID_FLAGS = ["--compilation-config", json.dumps({"cudagraph_capture_sizes": [*SIZES[:-1], 2048, 2064]})]


@pytest.mark.parametrize(("extra", "chunk", "expected"), [
    ([], 8192, 512),  # vLLM 0.22's default: min(2 max_num_seqs, 512)
    ([], 256, 256),  # never above the token budget
    (["--enforce-eager"], 8192, 0),
    (B_FLAGS, 8192, 2064),
    (B_FLAGS, 2048, 1040),  # sizes above B dropped
    (["-cc", '{"max_cudagraph_capture_size": 2048}'], 8192, 2048),
    (['--compilation-config={"max_cudagraph_capture_size": 1024}'], 8192, 1024),
    (["--compilation-config.max_cudagraph_capture_size", "4096"], 8192, 4096),
    (["--compilation-config.max_cudagraph_capture_size=4096"], 8192, 4096),
    (["--compilation-config", '{"cudagraph_mode": "NONE"}'], 8192, 0),
    (["--max-num-seqs", "64"], 8192, 128),
    (["--max-num-seqs=16", "-cc", '{"max_cudagraph_capture_size": 1024}'], 8192, 1024),
    (["--compilation-config", "{not json"], 8192, None),  # cannot tell: the rule's default stands
    (["-cc", '{"cudagraph_capture_sizes": [512, 1040], "max_cudagraph_capture_size": 2048}'], 8192, None),
])
def test_the_largest_graph_step_follows_the_flags(extra, chunk, expected):
    assert graph_max_tokens_of([*SERVE, *extra], chunk) == expected
    sizes = adapter("vllm").graph_sizes([*SERVE, *extra], chunk)
    assert (None if sizes is None else (sizes[-1] if sizes else 0)) == expected


def test_later_compilation_settings_win_and_a_string_command_is_split():
    argv = " ".join([*SERVE, "-cc", "'{\"max_cudagraph_capture_size\": 1024}'",
                     "--compilation-config.max_cudagraph_capture_size", "2048"])
    assert compilation_config_of(argv) == {"max_cudagraph_capture_size": 2048}
    assert graph_max_tokens_of(argv, 8192) == 2048


def test_engines_whose_flags_do_not_say_leave_their_rule():
    assert adapter("sglang").graph_sizes(["python", "-m", "sglang.launch_server"], 8192) is None
    assert adapter("pdexporter-sim").graph_sizes(["pdexporter", "sim", "serve"], 8192) is None


NOISELESS = SyntheticTruth(step_noise=0.0, rep_noise=0.0, client_jitter_ms=0.0)
GRID = [(8192, d, p) for d in (0, 1, 4, 12) for p in (256, 1024, 2048, 4096)]


def _samples(flags: list[str] | None, truth: SyntheticTruth = NOISELESS, grid=GRID):
    """The synthetic grid's samples, their records saying the engine was started with `flags` at their own chunk
    size (None: no command line, as `measure --target`)."""
    out = []
    for record in synthetic_records(truth, grid, reps=2):
        record.config.engine = "vllm"
        record.config.engine_command = None if flags is None else [
            *SERVE[:-1], str(record.config.chunk_size), *flags]
        out.append(samples_from_record(record))
    return out


def test_the_fit_takes_the_graph_size_its_records_were_measured_with():
    plain = md.fit_data(build_table(_samples(None)), _samples(None))
    assert plain.graph_max_tokens is None and plain.rule.graph_max_tokens == 512
    samples = _samples(B_FLAGS)
    data = md.fit_data(build_table(samples), samples)
    assert data.graph_max_tokens == 2064 and data.rule.graph_max_tokens == 2064
    assert data.subset([0, 1]).rule.graph_max_tokens == 2064
    model = md.fit_context_model(data)
    assert model.document()["chunk_rule"]["graph_max_tokens"] == 2064  # decision.json says what was measured
    assert model.rule.graph_step(1024 - 4, 4) and not plain.rule.graph_step(1024 - 4, 4)


def test_records_of_two_graph_sizes_are_refused_in_one_fit():
    mixed = _samples(B_FLAGS)[:8] + _samples([])[8:]
    with pytest.raises(ValueError, match="different CUDA-graph sizes .*2064 and 512"):
        md.fit_data(build_table(mixed), mixed)


def test_graph_steps_past_512_tokens_are_fitted_with_their_own_rate_and_their_attention():
    """An engine with graphs to 2064 tokens (GPU session 29's grid): past 512 tokens a graph step costs kappa_large a
    token and its attention pairs (B = 2048's middle chunks over a long prefix); the fit recovers both from records
    whose command line says the capture sizes, and a fit on default flags has neither term."""
    truth = SyntheticTruth(step_noise=0.0, rep_noise=0.0, client_jitter_ms=0.0, graph_max_tokens=2064,
                           kappa_graph_ms_per_token=0.026, kappa_graph_large_ms_per_token=0.009, graph0_ms=0.0)
    grid = [(b, d, p) for b in (2048, 8192) for d in (1, 4, 12) for p in (256, 1024, 2048, 4096, 16384)]
    samples = _samples(GRID_FLAGS, truth, grid)
    model = md.fit_context_model(md.fit_data(build_table(samples), samples))
    assert model.kappa_graph_ms_per_token == pytest.approx(0.026, rel=0.05)
    assert model.kappa_graph_large_ms_per_token == pytest.approx(0.009, rel=0.1)
    assert model.beta_ms_per_token_pair == pytest.approx(truth.beta_ms_per_token_pair, rel=0.05)
    middle = model.chunk_penalties_ms(4, [2044.0, 2044.0, 2044.0])[1]  # a 2,044-token graph step after 2,044
    assert middle == pytest.approx(truth.chunk_penalty_ms(4, 2044.0, 2044.0), rel=0.05)
    assert "kappa_graph_large_ms_per_token" in model.document()["model"]["coefficients"]
    assert "kappa_graph_large_ms_per_token" not in md.fit_context_model(
        md.fit_data(build_table(_samples([])), _samples([]))).document()["model"]["coefficients"]


def test_the_captured_sizes_follow_the_flags_and_a_step_runs_the_graph_it_is_padded_to():
    """vLLM pads a step to the smallest captured size that holds it and replays that graph (GPU session 30: on graphs
    to 2064 tokens, one-chunk prompts of 640 and 1,300 tokens read 12-20 % above a model that priced their own
    tokens, `results/h100-vllm0.22-qwen3-coder-30b-a3b-validation-graphs-s30/RUN.md`)."""
    assert graph_sizes_of([*SERVE, *B_FLAGS], 8192) == tuple(SIZES)
    assert graph_sizes_of([*SERVE, *B_FLAGS], 2048)[-1] == 1040  # sizes above B dropped
    assert graph_sizes_of([*SERVE, "--enforce-eager"], 8192) == ()
    assert graph_sizes_of([*SERVE], 8192)[-3:] == (480, 496, 512)  # vLLM 0.22's default list
    assert adapter("vllm").graph_sizes([*SERVE, *B_FLAGS], 8192) == tuple(SIZES)
    assert adapter("sglang").graph_sizes(["python", "-m", "sglang.launch_server"], 8192) is None
    assert padded_graph_tokens(SIZES, 1300, 3) == 2061  # the 2,064-token graph beside 3 decodes
    assert padded_graph_tokens(SIZES, 640, 5) == 1035
    assert padded_graph_tokens(SIZES, 300, 4) == 300  # 304 is a size
    assert padded_graph_tokens((), 1300, 3) == 1300  # sizes unknown: no padding
    # priced at the padded size past the 512-token hinge only: below it the step reads the weights whatever its size
    assert graph_step_tokens(SIZES, 1300, 3) == 2061 and graph_step_tokens(SIZES, 512, 4) == 524
    assert padded_graph_tokens(SIZES, 5, 4) == 12 and graph_step_tokens(SIZES, 5, 4) == 5  # a tail after full chunks
    rule = {"decodes_take_budget": True, "decodes_in_chunk_step": True, "graph_max_tokens": 2064,
            "graph_sizes": SIZES}
    ctx = chunk_context({"chunk_rule": rule}, 3, 1300, 8192)
    assert ctx["tail_graph"] and ctx["tail_graph_tokens"] == 2061
    assert chunk_context({"chunk_rule": {**rule, "graph_sizes": []}}, 3, 1300, 8192)["tail_graph_tokens"] == 1300


def test_the_fit_prices_a_graph_step_at_its_padded_size():
    """Records whose command line gives the capture sizes: the fit's rule carries them (decision.json's
    chunk_rule.graph_sizes), a graph step is priced at its padded size, and the fit recovers kappa and kappa_large
    from prompts far from any size (640 and 1,300 tokens) as from prompts at them."""
    truth = SyntheticTruth(step_noise=0.0, rep_noise=0.0, client_jitter_ms=0.0, graph_max_tokens=2064,
                           graph_sizes=tuple(SIZES), kappa_graph_ms_per_token=0.026,
                           kappa_graph_large_ms_per_token=0.009, graph0_ms=0.0)
    grid = [(8192, d, p) for d in (1, 4, 12) for p in (256, 640, 1300, 2048, 4096, 16384)]
    samples = _samples(B_FLAGS, truth, grid)
    data = md.fit_data(build_table(samples), samples)
    assert data.rule.graph_sizes == tuple(SIZES)
    model = md.fit_context_model(data)
    assert model.document()["chunk_rule"]["graph_sizes"] == SIZES
    assert model.kappa_graph_ms_per_token == pytest.approx(0.026, rel=0.05)
    assert model.kappa_graph_large_ms_per_token == pytest.approx(0.009, rel=0.1)
    one_chunk = model.chunk_penalties_ms(4, [1300.0])[0]
    assert one_chunk == pytest.approx(truth.chunk_penalty_ms(4, 1300.0, 0.0), rel=0.03)
    assert one_chunk > 0.026 * 512 + 0.009 * (1300 - 512) + 1.0  # the padded graph, not the prompt's tokens


def test_export_table_lists_every_term_of_the_physical_model():
    """Its console listed the first eight coefficients, so a fit's kappa_graph_large (and graph0) never showed."""
    from pdexporter.analysis.export import _fit_lines
    from pdexporter.analysis.job import analyse

    truth = SyntheticTruth(step_noise=0.0, rep_noise=0.0, client_jitter_ms=0.0, graph_max_tokens=2064,
                           graph_sizes=tuple(SIZES), kappa_graph_large_ms_per_token=0.009)
    samples = _samples(B_FLAGS, truth, [(8192, d, p) for d in (1, 4, 12) for p in (256, 1300, 2048, 4096, 16384)])
    text = "\n".join(str(line) for line in _fit_lines(analyse(samples)))
    assert "graph0_ms = " in text and "kappa_graph_large_ms_per_token = " in text and "more in fits.json" not in text
