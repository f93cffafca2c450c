"""The per-run record against the seed's example: same keys, our extras beside them."""

from __future__ import annotations

import json

import pytest

from pdexporter.measure.records import (
    SEED_KEYS,
    BaselineBlock,
    DerivedBlock,
    InterferenceBlock,
    RecordConfig,
    RepRecord,
    RunRecord,
    aggregate,
    cv,
)
from tests.helpers import seed_record_example

# Verbatim from the seed's "Per-Run Record" section.
SEED_EXAMPLE = seed_record_example()



def _rep(rep: int, penalty: float, prefill: float, chunks: list[int]) -> RepRecord:
    return RepRecord(
        rep=rep,
        baseline=BaselineBlock(
            tpot_p50_ms=42.3, tpot_p90_ms=45.1, tpot_p99_ms=48.7, step_time_ms=42.3, n_intervals=956
        ),
        interference=InterferenceBlock(
            tpot_during_prefill_p50_ms=42.3 + penalty,
            tpot_during_prefill_p90_ms=95.4,
            tpot_after_prefill_p50_ms=43.1,
            tpot_during_prefill_mean_ms=42.3 + penalty,
            num_chunks_actual=len(chunks),
            prefill_duration_ms=prefill,
            prefill_ttft_ms=prefill,
            num_chunks_expected=len(chunks),
            chunk_tokens_engine_log=chunks,
            chunk_step_times_ms=[89.2] * len(chunks),
        ),
        derived=DerivedBlock(
            tpot_penalty_ms=penalty,
            tpot_penalty_p50_ms=penalty,
            tpot_penalty_ratio=penalty / 42.3,
            total_interference_ms=penalty,
            decode_tokens_delayed=4,
        ),
        raw=f"raw/D4_P8192_r{rep}.json.gz",
    )


CONFIG = RecordConfig(decode_batch_size=4, new_prefill_tokens=8192, chunk_size=8192,
                      model="Qwen3-Coder-30B-A3B-Instruct", gpu="H20", reps_planned=3)


def test_the_seed_example_validates_as_a_record() -> None:
    record = RunRecord.model_validate(SEED_EXAMPLE)
    assert record.key == (8192, 4, 8192)
    assert record.derived.tpot_penalty_ratio == 1.11


def test_our_records_carry_exactly_the_seed_keys_first() -> None:
    record = aggregate(CONFIG, [_rep(0, 46.9, 91.0, [8188, 4]), _rep(1, 40.0, 88.0, [8188, 4])])
    dumped = json.loads(record.model_dump_json())
    for section, keys in SEED_KEYS.items():
        assert section in dumped
        for key in keys:
            assert key in dumped[section], f"{section}.{key}"
        assert list(dumped[section])[: len(keys)] == [k for k in dumped[section] if k in keys][: len(keys)]
    # the seed example's section keys are a subset of ours, section by section
    for section, block in SEED_EXAMPLE.items():
        assert set(block) <= set(dumped[section]), section
    assert list(dumped)[:4] == ["config", "baseline", "interference", "derived"]


def test_aggregate_is_the_median_over_reps_and_reports_cv() -> None:
    reps = [_rep(0, 46.9, 91.0, [8188, 4]), _rep(1, 40.0, 80.0, [8188, 4]), _rep(2, 50.0, 95.0, [8188, 4])]
    record = aggregate(CONFIG, reps)
    assert record.derived.tpot_penalty_p50_ms == 46.9
    assert record.interference.prefill_duration_ms == 91.0
    assert record.interference.num_chunks_actual == 2
    assert record.interference.chunk_tokens_engine_log == [8188, 4]
    assert record.summary is not None and record.summary.reps_done == 3
    assert record.summary.cv_tpot_penalty == pytest.approx(cv([46.9, 40.0, 50.0]), abs=1e-4)
    assert [r.rep for r in record.reps] == [0, 1, 2]


def test_cv_edge_cases() -> None:
    assert cv([1.0]) is None
    assert cv([0.0, 0.0]) is None
    assert cv([1.0, None, 3.0]) == pytest.approx(0.7071, abs=1e-4)


def test_aggregate_needs_a_rep() -> None:
    with pytest.raises(ValueError):
        aggregate(CONFIG, [])


def test_record_with_no_decodes_keeps_nulls() -> None:
    rep = RepRecord(
        rep=0,
        baseline=BaselineBlock(tpot_p50_ms=None, tpot_p90_ms=None, tpot_p99_ms=None, step_time_ms=None),
        interference=InterferenceBlock(tpot_during_prefill_p50_ms=None, tpot_during_prefill_p90_ms=None,
                                       tpot_after_prefill_p50_ms=None, num_chunks_actual=None,
                                       prefill_duration_ms=60.0, prefill_ttft_ms=60.0),
        derived=DerivedBlock(tpot_penalty_p50_ms=None, tpot_penalty_ratio=None, total_interference_ms=None,
                             decode_tokens_delayed=0),
    )
    config = CONFIG.model_copy(update={"decode_batch_size": 0})
    record = aggregate(config, [rep])
    dumped = json.loads(record.model_dump_json())
    assert dumped["baseline"]["tpot_p50_ms"] is None
    assert dumped["interference"]["prefill_duration_ms"] == 60.0


def test_secret_values_are_redacted_and_counts_are_not() -> None:
    from pdexporter._internal.redact import engine_flags, redact_argv, redact_env

    argv = ["HF_TOKEN=hf_abc123", "vllm", "serve", "m", "--max-num-batched-tokens", "8192", "--api-key", "sk-1",
            "--api-key=sk-2", "--max-tokens=5"]
    out = redact_argv(argv)
    assert out == ["HF_TOKEN=***", "vllm", "serve", "m", "--max-num-batched-tokens", "8192", "--api-key", "***",
                   "--api-key=***", "--max-tokens=5"]
    assert redact_env({"VLLM_API_KEY": "x", "CUDA_VISIBLE_DEVICES": "0"}) == {"VLLM_API_KEY": "***",
                                                                              "CUDA_VISIBLE_DEVICES": "0"}
    assert engine_flags(out)["max-num-batched-tokens"] == "8192"
