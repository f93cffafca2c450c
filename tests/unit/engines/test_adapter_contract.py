"""Every registered engine adapter keeps the contract the rest of pdexporter relies on, and the
registry refuses what nobody registered. A new engine (one module, one registration) is checked
here without a line of this file changing."""

from __future__ import annotations

import pytest

from pdexporter.engines import (
    METRIC_KINDS,
    ChunkRule,
    EngineAdapter,
    IterationStep,
    adapter,
    identify,
    identity_paths,
    registered,
)
from pdexporter.errors import ConfigError

NAMES = registered()
GRID = [(p, b, d) for b in (512, 2048, 8192) for d in (0, 1, 4, 12) for p in (1, 100, 512, 8191, 8192, 32768)]


def test_the_registry_holds_both_engines_in_both_modes() -> None:
    assert {
        "vllm",
        "sglang",
        "sglang-mixed",
        "openai-compatible",
        "pdexporter-sim",
        "pdexporter-sim-sglang",
        "pdexporter-sim-sglang-mixed",
    } <= set(NAMES)
    assert identity_paths()[0] == "/version" and "/server_info" in identity_paths()


@pytest.mark.parametrize("bad", ["vlm", "", "SGLang"])
def test_an_unknown_engine_is_one_line_naming_the_registered_ones(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        adapter(bad)
    text = str(info.value)
    assert (
        "\n" not in text and repr(bad) in text and "registered: " in text and "sglang, sglang-mixed" in text
    )


def test_no_name_means_no_engine() -> None:
    with pytest.raises(ConfigError, match="not a registered engine"):
        adapter(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NAMES)
def test_contract(name: str) -> None:
    a = adapter(name)
    assert isinstance(a, EngineAdapter) and a.name == name
    assert isinstance(a.chunk_rule, ChunkRule) and isinstance(a.chunk_rule.to_dict(), dict)
    assert a.default_chunk_size in a.candidate_chunk_sizes and a.chunk_flag.startswith("--")
    assert a.identity_path in identity_paths()
    # metric names: canonical names with their canonical kinds, the engine's names per entry
    for canonical, (kind, names) in a.metric_aliases.items():
        assert METRIC_KINDS[canonical] == kind, (name, canonical)
        # the engine's own namespace ("vllm:"), or the Prometheus process collector's series
        assert names and all(":" in n or n.startswith("process_") for n in names), (name, canonical)
    assert a.optional_metrics <= set(a.metric_aliases)
    assert bool(a.request_span_name) == bool(a.request_span_attributes)
    # the chunk schedule: refused exactly where the budget rule says, else the whole prompt in steps of at most B
    for p, b, d in GRID:
        problem = a.budget_problem(b, d)
        if problem:
            with pytest.raises(ValueError):
                a.chunk_schedule(p, b, d)
            continue
        chunks = a.chunk_schedule(p, b, d)
        assert chunks and all(0 < c <= b for c in chunks), (name, p, b, d, chunks)
        if a.kv.arm == "colocated":
            assert sum(chunks) == p and chunks == a.chunk_rule.schedule(p, b, d), (name, p, b, d)
            assert max(chunks) == a.chunk_rule.budget(b, d) or len(chunks) == 1
        seen = a.chunk_rule.decode_view(chunks)
        assert sum(seen) == sum(chunks) and 1 <= len(seen) <= len(chunks)
    # its step lines: what format_step writes, parse_step_log reads back unchanged
    beside = 4 if a.chunk_rule.decodes_in_chunk_step else 0
    steps = [IterationStep(0, 1, 8188, beside, beside, 0.0), IterationStep(1, 0, 0, 5, 5, 0.0)]
    back = a.parse_step_log([a.format_step(s) for s in steps] + ["an unrelated log line"])
    assert [
        (s.context_requests, s.context_tokens, s.generation_requests, s.generation_tokens) for s in back
    ] == [
        (s.context_requests, s.context_tokens, s.generation_requests, s.generation_tokens) for s in steps
    ], name
    # its launch flags: the chunk flag with the size, and a setup the registry knows
    flags = a.chunk_size_flags(4096)
    assert flags[flags.index(a.chunk_flag) + 1] == "4096"
    assert a.for_command(["engine", *flags]) in NAMES
    assert a.cuda_graphs(["engine", *flags]) in (True, False, None)
    # nothing said is nothing recognised
    assert not a.recognise({}) and a.served_chunk_size({}) is None and isinstance(a.setup_problems({}), tuple)
    assert a.prefix_caching({}, None) is None


def test_identify_picks_the_most_specific_engine() -> None:
    assert identify({"version": "0.22.0"}).name == "vllm"  # type: ignore[union-attr]
    assert identify({"version": "0.22.0+pdexporter.sim", "modelled": True}).name == "pdexporter-sim"  # type: ignore[union-attr]
    server_info = {"version": "0.5.15.post1", "chunked_prefill_size": 8192, "enable_mixed_chunk": False}
    assert identify(server_info, "/server_info").name == "sglang"  # type: ignore[union-attr]
    assert identify({**server_info, "enable_mixed_chunk": True}, "/server_info").name == "sglang-mixed"  # type: ignore[union-attr]
    assert identify({**server_info, "modelled": True}, "/server_info").name == "pdexporter-sim-sglang"  # type: ignore[union-attr]
    assert identify({"something": "else"}, "/server_info") is None


# A failed start's log as each engine writes it, built from the engines' own messages (vLLM 0.22's
# vllm/v1/core/kv_cache_utils.py and vllm/v1/engine/utils.py; SGLang's srt/entrypoints/engine.py): the
# process that failed logs its exception first, another process then says it failed "see above".
_VLLM_FAILED_START = [
    "(EngineCore pid=793) INFO 12-06 10:13:20 [gpu_worker.py:466] Available KV cache memory: 10.77 GiB",
    "(EngineCore pid=793) ERROR 12-06 10:13:20 [core.py:1100] EngineCore failed to start.",
    "(EngineCore pid=793) Traceback (most recent call last):",
    '(EngineCore pid=793)   File "/tmp/site/vllm/v1/core/kv_cache_utils.py", line 718, in check_enough_kv_cache_memory',
    "(EngineCore pid=793) ValueError: To serve at least one request with the model's max seq len (200000), "
    "(18.31 GiB KV cache is needed, which is larger than the available KV cache memory (10.77 GiB). Based on the "
    "available memory, the estimated maximum model length is 117616.",
    "(APIServer pid=641) Traceback (most recent call last):",
    "(APIServer pid=641) RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {'EngineCore_DP0': 1}",
    "",
]
_SGLANG_FAILED_START = [
    "[2026-12-04 10:00:00] Scheduler hit an exception: Traceback (most recent call last):",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "[2026-12-04 10:00:01] Received sigquit from a child process. It usually means the child failed.",
    "RuntimeError: Initialization failed. Please see the error messages above.",
]


@pytest.mark.parametrize("name", NAMES)
def test_a_failed_start_is_reported_by_its_root_cause_not_the_line_after_it(name: str) -> None:
    engine = adapter(name)
    sglang = "sglang" in name
    lines = _SGLANG_FAILED_START if sglang else _VLLM_FAILED_START
    cause = engine.start_failure(lines)
    if sglang:
        assert cause == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    else:
        assert cause.startswith("(EngineCore pid=793) ValueError: To serve at least one request")
        assert "estimated maximum model length is 117616" in cause
    # a log without an exception: its last line; an empty one says so
    assert engine.start_failure(["starting", "CUDA out of memory", "  "]) == "CUDA out of memory"
    assert engine.start_failure([]) == "(empty log)"
